// libFuzzer target: the acceptor's side of the job-secret handshake (lib/base/auth.h), as rank
// 0's store and every rank's transport run it on a stranger's connection: arbitrary bytes from
// the connector, then EOF. It must fail (never pass without the secret), never crash, and never
// wait past its deadline.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "lib/base/auth.h"
#include "lib/base/error.h"
#include "lib/base/socket_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mtxcomm::JobSecret secret =
      mtxcomm::JobSecret::fromText("the fuzzed job's secret, 32 bytes", "fuzz");
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  mtxcomm::setNonBlocking(sv[0]);
  size_t sent = 0;
  mtxcomm::sendSome(sv[1], data, size, &sent);  // what the socket buffer takes
  ::shutdown(sv[1], SHUT_WR);
  const auto deadline = mtxcomm::Clock::now() + std::chrono::milliseconds(200);
  mtxcomm::AcceptorHandshake hs(sv[0], secret, mtxcomm::kAuthStore, deadline);
  mtxcomm::AcceptorHandshake::State st = hs.progress();
  while (st == mtxcomm::AcceptorHandshake::State::kPending) {
    pollfd p{sv[0], hs.pollEvents(), 0};
    ::poll(&p, 1, 10);
    st = hs.progress();
  }
  // Random bytes cannot hold a MAC under the secret (2^-256).
  if (st == mtxcomm::AcceptorHandshake::State::kDone) std::abort();
  ::close(sv[0]);
  ::close(sv[1]);
  return 0;
}
