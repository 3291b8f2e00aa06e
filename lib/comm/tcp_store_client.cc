// TcpStore's client: every rank, rank 0 included, talks to the server rank 0 runs
// (MTXCOMM_STORE=tcp:HOST:PORT, lib/comm/stores.h; the protocol and the server:
// lib/comm/tcp_store_server.h). A client whose GET times out drops its connection (the late
// answer would otherwise be read as the answer to its next request) and reconnects on its next
// call, with the same claim.
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "lib/base/auth.h"
#include "lib/base/error.h"
#include "lib/base/socket_util.h"
#include "lib/comm/stores.h"
#include "lib/comm/tcp_store_server.h"

namespace mtxcomm {
namespace {

using Ms = std::chrono::milliseconds;

constexpr uint8_t kOpSet = kStoreOpSet;
constexpr uint8_t kOpGet = kStoreOpGet;
constexpr uint8_t kOpCheck = kStoreOpCheck;
constexpr uint64_t kMaxKeyBytes = kStoreMaxKeyBytes;
constexpr uint64_t kMaxValueBytes = kStoreMaxValueBytes;

class TcpStore : public Store {
 public:
  TcpStore(std::string spec, StoreHostPort hp, int rank, int size, Ms timeout, JobSecret secret)
      : spec_(std::move(spec)), hp_(std::move(hp)), timeout_(timeout), secret_(std::move(secret)) {
    claim_.rank = rank;
    claim_.size = size;
    const Nonce n = randomNonce();
    std::memcpy(&claim_.process, n.data(), sizeof(claim_.process));
    if (rank == 0) server_ = std::make_unique<TcpStoreServer>(hp_, spec_, size, secret_);
    connectToServer(Clock::now() + timeout_);
  }

  ~TcpStore() override {
    closeConnection();
    server_.reset();  // After our own client is closed: stops the server thread.
  }

  const JobSecret& secret() const override { return secret_; }

  void reportFault(const std::string& message) override {
    if (server_) server_->reportFault(message);
  }

  std::string diagnosis() const override {
    const uint64_t n = server_ ? server_->refused() : 0;
    if (n == 0) return "";
    return strCat(n, " connection(s) to the store failed to prove the job secret: is ",
                  "MTXCOMM_JOB_SECRET the same on every rank?");
  }

  void check() override {
    if (server_) {
      const std::string f = server_->fault();
      if (!f.empty()) fail(MTXCOMM_INVALID_USAGE, "store ", spec_, ": ", f);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    if (now < nextCheck_) return;
    nextCheck_ = now + std::chrono::milliseconds(200);
    const auto deadline = now + timeout_;
    if (fd_ < 0) connectToServer(deadline);
    askServerForFault(deadline, timeout_);
  }

  std::string knownFault(Ms budget) override {
    if (server_) {
      const std::string f = server_->fault();
      return f.empty() ? f : strCat("store ", spec_, ": ", f);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0) return "";
    try {
      askServerForFault(Clock::now() + budget, budget);
    } catch (const Error& e) {
      if (e.code() == MTXCOMM_INVALID_USAGE) return e.what();
    }
    return "";
  }

  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto deadline = Clock::now() + timeout_;
    if (fd_ < 0) connectToServer(deadline);
    std::string req;
    uint64_t klen = key.size(), vlen = value.size();
    req.push_back(static_cast<char>(kOpSet));
    req.append(reinterpret_cast<const char*>(&klen), 8);
    req += key;
    req.append(reinterpret_cast<const char*>(&vlen), 8);
    req += value;
    sendRequest(req, key);
    receiveStatus(deadline, key, timeout_);
  }

  std::string get(const std::string& key, Ms timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto deadline = Clock::now() + timeout;
    if (fd_ < 0) connectToServer(deadline);
    std::string req;
    uint64_t klen = key.size();
    req.push_back(static_cast<char>(kOpGet));
    req.append(reinterpret_cast<const char*>(&klen), 8);
    req += key;
    sendRequest(req, key);
    receiveStatus(deadline, key, timeout);
    uint64_t len;
    receive(&len, 8, deadline, key, timeout);
    if (len > kMaxValueBytes) {
      closeConnection();
      fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": bad answer for key '", key, "'");
    }
    std::string value(len, '\0');
    receive(value.data(), len, deadline, key, timeout);
    return value;
  }

 private:
  // Connects and passes the handshake, retrying until deadline: rank 0 may start its server
  // after the others, and a server flooded by strangers may drop a handshake. The handshake
  // itself has the server's own short deadline (AcceptorHandshake::kHandshakeSeconds): rank 0's
  // server sends its challenge as soon as it accepts, so a process that accepted the connection
  // and stays silent is not this job's store (another program on the port, a stopped server)
  // and must not hold this rank for the whole bootstrap timeout. A refused connection (the
  // server not up yet) is still retried until deadline.
  void connectToServer(Clock::time_point deadline) {
    sockaddr_in addr = resolveIpv4(hp_.host, hp_.port, "store " + spec_);
    uint8_t claim[32];
    std::memcpy(claim, &claim_, sizeof(claim));
    int refusals = 0;
    for (;;) {
      int last_err = 0;
      UniqueFd fd(connectWithRetry(addr, deadline, &last_err, "store " + spec_));
      if (fd.get() < 0) {
        fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout_),
             " s connecting to store server ", spec_, " (last error: ", errnoText(last_err), ")");
      }
      setNoDelay(fd.get());
      bool refused = false;
      const auto handshakeBound = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(AcceptorHandshake::kHandshakeSeconds));
      const auto handshakeDeadline = std::min(deadline, Clock::now() + handshakeBound);
      try {
        connectorHandshake(fd.get(), secret_, kAuthStore, claim, handshakeDeadline,
                           "store " + spec_ + " (rank 0's server)", &refused);
      } catch (const Error& e) {
        if (e.code() == MTXCOMM_TIMEOUT && handshakeDeadline < deadline) {
          fail(MTXCOMM_TIMEOUT, "store ", spec_, ": the process listening on ", hp_.host, ":",
               hp_.port, " accepted the connection but did not answer the handshake within ",
               secondsText(handshakeBound),
               " s (not rank 0's store server: another program on the port, or a stopped "
               "server?)");
        }
        // Closed mid-handshake: the server dropped it under a flood; try again. Closed three
        // times after this rank's proof: the server refuses it (another secret). Anything else
        // (not a store) is final.
        if (e.code() != MTXCOMM_REMOTE_ERROR || Clock::now() >= deadline) throw;
        if (refused && ++refusals >= 3) {
          fail(MTXCOMM_INVALID_USAGE, "store ", spec_,
               ": rank 0's server refused this rank's proof of the job secret 3 times: "
               "MTXCOMM_JOB_SECRET (or MTXCOMM_JOB_SECRET_FILE) must be the same on every rank");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      fd_ = fd.release();
      return;
    }
  }

  void sendRequest(const std::string& req, const std::string& key) {
    if (!sendAll(fd_, req.data(), req.size())) {
      int err = errno;
      closeConnection();
      fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": lost the connection to the server (",
           errnoText(err), ") sending key '", key, "'");
    }
  }

  // One check request over the open connection: returns when the server knows no fault, throws
  // MTXCOMM_INVALID_USAGE with the job's fault (a size mismatch, a duplicate rank) otherwise.
  void askServerForFault(Clock::time_point deadline, Ms timeout) {
    std::string req(1, static_cast<char>(kOpCheck));
    const uint64_t klen = 0;
    req.append(reinterpret_cast<const char*>(&klen), 8);
    sendRequest(req, "(check)");
    receiveStatus(deadline, "(check)", timeout);
  }

  // The status byte of an answer; a fault answer throws MTXCOMM_INVALID_USAGE with its message.
  void receiveStatus(Clock::time_point deadline, const std::string& key, Ms timeout) {
    uint8_t status;
    receive(&status, 1, deadline, key, timeout);
    if (status == kStoreStatusOk) return;
    uint64_t len = 0;
    if (status == kStoreStatusFault) receive(&len, 8, deadline, key, timeout);
    if (status != kStoreStatusFault || len > kMaxKeyBytes) {
      closeConnection();
      fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": bad answer for key '", key, "'");
    }
    std::string message(len, '\0');
    receive(message.data(), len, deadline, key, timeout);
    closeConnection();
    fail(MTXCOMM_INVALID_USAGE, "store ", spec_, ": ", message);
  }

  void receive(void* buf, size_t n, Clock::time_point deadline, const std::string& key,
               Ms timeout) {
    IoResult r = recvAll(fd_, buf, n, deadline);
    if (r == IoResult::kOk) return;
    int err = errno;
    closeConnection();  // A late answer must not be taken for the next request's.
    if (r == IoResult::kTimeout) {
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout), " s waiting for key '", key,
           "' in store ", spec_);
    }
    fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": the server closed the connection (",
         r == IoResult::kEof ? std::string("EOF") : errnoText(err), ") waiting for key '", key,
         "'");
  }

  void closeConnection() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  const std::string spec_;
  const StoreHostPort hp_;
  const Ms timeout_;
  const JobSecret secret_;
  StoreClaim claim_{};
  std::mutex mu_;
  Clock::time_point nextCheck_{};
  int fd_ = -1;
  std::unique_ptr<TcpStoreServer> server_;
};

}  // namespace

std::unique_ptr<Store> makeTcpStore(const std::string& spec, const std::string& host, int port,
                                    int rank, int size, Ms timeout, const JobSecret& secret) {
  return std::make_unique<TcpStore>(spec, StoreHostPort{host, port}, rank, size, timeout, secret);
}

}  // namespace mtxcomm
