// Bootstrap key-value store: how ranks meet without MPI (MTXCOMM_STORE), the way NCCL and Gloo
// bootstrap. Keys are short strings; values are byte strings. Writes are set-once per key.
//   file:PATH      a directory on a file system every rank sees (created if missing); each key
//                  is a file, written under a temporary name and renamed into place (atomic).
//   tcp:HOST:PORT  rank 0 hosts a small server on HOST:PORT (a thread); every rank, rank 0
//                  included, is a client.
#ifndef MTXCOMM_LIB_STORE_H_
#define MTXCOMM_LIB_STORE_H_

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

// Parses spec ("file:PATH" or "tcp:HOST:PORT") and connects; rank 0 of a tcp store starts the
// server. Throws mtxcomm::Error(MTXCOMM_INVALID_USAGE) naming MTXCOMM_STORE for a bad spec.
std::unique_ptr<Store> makeStore(const std::string& spec, int rank, int size,
                                 std::chrono::milliseconds timeout);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_STORE_H_
