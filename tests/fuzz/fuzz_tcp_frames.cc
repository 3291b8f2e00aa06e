// libFuzzer target: the TCP transport's frames (transports/tcp/tcp_mesh.h) from a peer that
// sends arbitrary bytes and closes: rank 0 of a 2-rank mesh posts a receive from rank 1 and
// waits. Headers, payloads and control frames are parsed; a bad frame or the close is an
// mtxcomm::Error, never a crash or an allocation of an announced size beyond the bound.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/liveness.h"
#include "lib/base/socket_util.h"
#include "transports/tcp/tcp_mesh.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  size_t sent = 0;
  mtxcomm::sendSome(sv[1], data, size, &sent);
  ::shutdown(sv[1], SHUT_WR);
  mtxcomm::setNonBlocking(sv[0]);
  auto shared = std::make_shared<mtxcomm::tcp::TcpShared>(0, 2);
  shared->setFd(1, sv[0]);
  {
    std::unique_ptr<mtxcomm::Transport> t =
        mtxcomm::tcp::makeView(shared, {0, 1}, 0, 0, mtxcomm::PeerLiveness());
    char buf[64];
    try {
      std::vector<mtxcomm::RequestPtr> reqs;
      reqs.push_back(t->irecv(1, 0, buf, sizeof(buf)));
      reqs.push_back(t->irecv(1, 1, buf, 0));
      t->waitAll(reqs, mtxcomm::Clock::now() + std::chrono::milliseconds(100));
    } catch (const mtxcomm::Error&) {
    }
  }
  shared.reset();
  ::close(sv[1]);
  return 0;
}
