// The bootstrap key-value store interface: how ranks meet without MPI (MTXCOMM_STORE), the way
// NCCL and Gloo bootstrap; the TCP transport publishes and reads its addresses through it. Keys
// are short strings; values are byte strings. Writes are set-once per key. The stores
// themselves (file, tcp) are the communicator layer's: lib/comm/stores.h.
#ifndef MTXCOMM_LIB_BASE_STORE_H_
#define MTXCOMM_LIB_BASE_STORE_H_

#include <chrono>
#include <memory>
#include <string>

#include "lib/base/auth.h"

namespace mtxcomm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until key is set, up to timeout; throws mtxcomm::Error(MTXCOMM_TIMEOUT) naming the key
  // after that, MTXCOMM_SYSTEM_ERROR / MTXCOMM_REMOTE_ERROR if the store fails.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // The job's secret (lib/base/auth.h): every connection the job's ranks make to each other
  // proves it. Known to the store: configured for a tcp: store, made by rank 0 of a file: store.
  virtual const JobSecret& secret() const = 0;
  // Throws MTXCOMM_INVALID_USAGE when the store knows the job is faulty (a tcp: store: two
  // processes claim one rank, a rank has another size), so that a rank in a long bootstrap wait
  // (the TCP transport's accept loop) fails naming the cause instead of timing out. Cheap:
  // callers may call it every few hundred milliseconds.
  virtual void check() {}
  // The fault the store knows of now (as check() would throw it), or "": asked at once, over a
  // connection the store already has, within budget; never throws. For a rank whose bootstrap
  // failed on a peer's closed connection: that peer may have left because the job is faulty.
  virtual std::string knownFault(std::chrono::milliseconds budget) {
    (void)budget;
    return "";
  }
  // This rank's init failed with message: tells the other ranks where the store can (a file:
  // store's fault file, a tcp: store's server on rank 0), so that they fail with the cause
  // instead of timing out. Best effort, never throws.
  virtual void reportFault(const std::string& message) { (void)message; }
  // What the store saw that may explain a timeout ("3 connections failed to prove the job
  // secret"), or "": timeouts in the bootstrap append it.
  virtual std::string diagnosis() const { return ""; }
};

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_BASE_STORE_H_
