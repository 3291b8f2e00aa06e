// TcpStore's server: rank 0 runs it in a thread (MTXCOMM_STORE=tcp:HOST:PORT, lib/comm/stores.h);
// every rank, rank 0 included, is a client (lib/comm/tcp_store_client.cc).
//
// Every connection first passes the job-secret handshake (lib/base/auth.h, channel kAuthStore):
// the claim is a StoreClaim {rank, size, process nonce}. The server serves nothing before the
// proof, drives every handshake without blocking (a silent connection costs only its own
// deadline of a few seconds), and drops a failed one with a WARN naming its address.
//
// TcpStore wire protocol, after the handshake (host byte order: every rank of a job runs the
// same binary):
//   request   u8 op (1 = SET, 2 = GET, 3 = CHECK), u64 key length, key, and for SET u64 value
//             length, value (CHECK: an empty key)
//   response  SET: u8 0 once stored.  GET: u8 0, u64 value length, value — sent only once the key
//             exists (the server holds pending GETs), so a client waits with one poll(2).
//             CHECK: u8 0 at once (Store::check).
//             Any request: u8 1, u64 length, message — the job is faulty (two processes claim
//             one rank, a rank has another MTXCOMM_SIZE, the store is full): every rank's next
//             request fails with that message, so the whole job stops at once naming the cause.
// Bounds: keys up to 4 KiB, values up to 64 MiB, 1 GiB of values in all; a client's requests
// are not read while more than 1 MiB of answers to it is unsent (a client that never reads
// costs at most one value); at most 256 handshakes in progress (the oldest is dropped).
#ifndef MTXCOMM_LIB_COMM_TCP_STORE_SERVER_H_
#define MTXCOMM_LIB_COMM_TCP_STORE_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lib/base/auth.h"
#include "lib/base/clock.h"
#include "lib/comm/store_wire.h"

namespace mtxcomm {

// The status byte that opens every answer.
constexpr uint8_t kStoreStatusOk = 0;
constexpr uint8_t kStoreStatusFault = 1;

// Who a client says it is (AuthResponse::claim).
struct StoreClaim {
  int32_t rank;
  int32_t size;
  uint64_t process;  // a random number of the process: its reconnections are not duplicates
  uint64_t pad[2];
};
static_assert(sizeof(StoreClaim) == 32, "the handshake's claim is 32 bytes");

struct StoreHostPort {
  std::string host;
  int port = 0;
};

// Runs in a thread of rank 0. One poll(2) loop over the listening socket, a self-pipe (written by
// the destructor to stop it) and the clients; per-client input and output buffers, so a slow
// client never blocks the others.
class TcpStoreServer {
 public:
  // Listens on hp and starts the thread; throws MTXCOMM_SYSTEM_ERROR naming spec when it cannot.
  TcpStoreServer(const StoreHostPort& hp, const std::string& spec, int size,
                 const JobSecret& secret);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // From any thread: the job is faulty (rank 0's init failed with message); every client's next
  // request is answered with it.
  void reportFault(const std::string& message);
  // Connections that failed to prove the job secret (any thread).
  uint64_t refused() const { return refused_.load(); }
  // The job's fault, or "" (any thread).
  std::string fault() const {
    std::lock_guard<std::mutex> lock(faultMu_);
    return faultCopy_;
  }

 private:
  struct Client {
    int fd = -1;
    std::unique_ptr<AcceptorHandshake> hs;  // until the client proved the secret
    StoreClaim claim{};
    std::string in;
    std::string out;
  };

  void run();
  void acceptClients();
  // A WARN per dropped stranger for the first kLoggedDrops, then one line per 1000 (a flood
  // must not fill the log).
  void logDrop(int fd, const std::string& why);
  void dropOldestHandshake();
  void handshake(uint64_t id);
  // From now on every request of every client is answered with message.
  void setFault(const std::string& message);
  // False when the client is gone or misbehaves.
  bool readClient(uint64_t id);
  static void appendValue(Client& c, const std::string& value);
  void appendFault(Client& c);
  // False on a write error. Leaves what the socket does not take for POLLOUT.
  static bool flushClient(Client& c);
  void dropClient(uint64_t id);

  const std::string spec_;
  const int size_;
  const JobSecret& secret_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  uint64_t next_id_ = 0;
  size_t handshakes_ = 0;
  bool emfileWarned_ = false;
  Clock::time_point listenAgain_{};
  uint64_t drops_ = 0;                // strangers dropped (logDrop)
  std::atomic<uint64_t> refused_{0};  // of which failed to prove the job secret
  Clock::time_point lingerUntil_{};   // stopping a faulty job: serve its fault until then,
  std::set<int> faultTold_;           // or until every rank was answered with it
  std::map<uint64_t, Client> clients_;
  std::map<std::string, std::string> data_;
  uint64_t stored_ = 0;
  std::map<std::string, std::vector<uint64_t>> waiting_;  // key -> client ids
  std::map<int, uint64_t> processOf_;                     // rank -> StoreClaim::process
  std::string fault_;
  mutable std::mutex faultMu_;
  std::string faultCopy_;      // fault_, for other threads
  std::string reportedFault_;  // from reportFault, for the server thread
};

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_TCP_STORE_SERVER_H_
