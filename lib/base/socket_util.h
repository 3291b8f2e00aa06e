// Small POSIX socket helpers shared by the bootstrap stores (lib/comm/tcp_store_server.cc and
// tcp_store_client.cc) and the TCP transport (transports/tcp/): IPv4 address lookup, listen,
// connect with retry until a deadline, send-all / receive-all with a deadline, socket options and
// error text. IPv4 only, like both users. Functions that cannot go on throw mtxcomm::Error with the
// caller's context (a prefix such as "store tcp:host:1234" or "tcp transport") in front of the
// message.
#ifndef MTXCOMM_LIB_SOCKET_UTIL_H_
#define MTXCOMM_LIB_SOCKET_UTIL_H_

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

#include "lib/base/clock.h"

namespace mtxcomm {

// strerror(err) as a std::string.
std::string errnoText(int err);

// d in seconds with three significant digits ("0.15", "10"), for messages.
std::string secondsText(Clock::duration d);

// Milliseconds left until deadline, rounded up, in [0, 1000000] (a poll(2) timeout).
int msLeft(Clock::time_point deadline);

// Owns a file descriptor: closes it on scope exit unless released.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_;
};

// host (a name or a dotted IPv4 address) and port as an IPv4 address. Throws
// MTXCOMM_SYSTEM_ERROR "<context>: cannot resolve host '<host>': <reason>".
sockaddr_in resolveIpv4(const std::string& host, int port, const std::string& context);

// A listening TCP socket (close-on-exec) bound to *addr; port 0 picks an ephemeral port, and
// *addr is updated to the bound address. reuse_addr sets SO_REUSEADDR. Returns -1 with errno set
// on failure.
int listenTcp(sockaddr_in* addr, bool reuse_addr);

// Connects a blocking TCP socket to addr, retrying (every 10 ms: "connection refused" comes back
// at once while the peer is not listening yet) until deadline. Returns the fd, or -1 once the
// deadline has passed, with *last_err the errno of the last attempt. Throws MTXCOMM_SYSTEM_ERROR
// "<context>: socket(): ..." when no socket can be made.
int connectWithRetry(const sockaddr_in& addr, Clock::time_point deadline, int* last_err,
                     const std::string& context);

// Writes all n bytes of buf to a blocking socket (no SIGPIPE). False on error, errno set.
bool sendAll(int fd, const void* buf, size_t n);

// Writes as much of buf as a socket takes now, without blocking (no SIGPIPE): adds the bytes
// written to *sent. False on an error other than a full socket buffer (errno set).
bool sendSome(int fd, const void* buf, size_t n, size_t* sent);

enum class IoResult { kOk, kEof, kError, kTimeout };

// Reads exactly n bytes, waiting with poll(2) until deadline. kError leaves errno set.
IoResult recvAll(int fd, void* buf, size_t n, Clock::time_point deadline);

// TCP_NODELAY: small messages (headers, store requests) leave at once.
void setNoDelay(int fd);

// O_NONBLOCK on fd.
void setNonBlocking(int fd);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_SOCKET_UTIL_H_
