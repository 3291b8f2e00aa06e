// The bootstrap key-value store interface: how ranks meet without MPI (MTXCOMM_STORE), the way
// NCCL and Gloo bootstrap; the TCP transport publishes and reads its addresses through it. Keys
// are short strings; values are byte strings. Writes are set-once per key. The stores
// themselves (file, tcp) are the communicator layer's: lib/comm/stores.h.
#ifndef MTXCOMM_LIB_BASE_STORE_H_
#define MTXCOMM_LIB_BASE_STORE_H_

#include <chrono>
#include <memory>
#include <string>

namespace mtxcomm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until key is set, up to timeout; throws mtxcomm::Error(MTXCOMM_TIMEOUT) naming the key
  // after that, MTXCOMM_SYSTEM_ERROR / MTXCOMM_REMOTE_ERROR if the store fails.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_BASE_STORE_H_
