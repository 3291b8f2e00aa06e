// Socket helpers: see socket_util.h.
#include "lib/base/socket_util.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "lib/base/error.h"

namespace mtxcomm {

std::string errnoText(int err) { return std::strerror(err); }

std::string secondsText(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", std::chrono::duration<double>(d).count());
  return buf;
}

int msLeft(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left < 0) return 0;
  return left > 1000000 ? 1000000 : static_cast<int>(left);
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

sockaddr_in resolveIpv4(const std::string& host, int port, const std::string& context) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    fail(MTXCOMM_SYSTEM_ERROR, context, ": cannot resolve host '", host,
         "': ", rc == EAI_SYSTEM ? errnoText(errno) : std::string(::gai_strerror(rc)));
  }
  sockaddr_in addr;
  std::memcpy(&addr, res->ai_addr, sizeof(addr));
  ::freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

int listenTcp(sockaddr_in* addr, bool reuse_addr) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return -1;
  int one = 1;
  if (reuse_addr) ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(*addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(addr), sizeof(*addr)) != 0 ||
      ::listen(fd.get(), SOMAXCONN) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(addr), &len) != 0) {
    int err = errno;
    fd.reset();
    errno = err;
    return -1;
  }
  return fd.release();
}

int connectWithRetry(const sockaddr_in& addr, Clock::time_point deadline, int* last_err,
                     const std::string& context) {
  for (;;) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) fail(MTXCOMM_SYSTEM_ERROR, context, ": socket(): ", errnoText(errno));
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      return fd.release();
    }
    *last_err = errno;
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(10), deadline - Clock::now()));
  }
}

bool sendAll(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool sendSome(int fd, const void* buf, size_t n, size_t* sent) {
  const char* p = static_cast<const char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (w < 0) {
      *sent += done;
      return false;
    }
    done += static_cast<size_t>(w);
  }
  *sent += done;
  return true;
}

IoResult recvAll(int fd, void* buf, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int rc = ::poll(&pfd, 1, msLeft(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return IoResult::kError;
    if (rc == 0) return IoResult::kTimeout;
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r < 0) return IoResult::kError;
    if (r == 0) return IoResult::kEof;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return IoResult::kOk;
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void setNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace mtxcomm
