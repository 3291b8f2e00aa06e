// The TCP transport's bootstrap (tcp_transport.h): listen, publish the address through the
// store, connect to the lower ranks and accept the higher ones with a handshake.
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/liveness.h"
#include "lib/base/socket_util.h"
#include "transports/tcp/tcp_mesh.h"
#include "transports/tcp/tcp_transport.h"

namespace mtxcomm {
namespace tcp {
namespace {

// ---- environment ----------------------------------------------------------------------------

struct TcpEnv {
  std::string ifaddr;  // MTXCOMM_TCP_IFADDR: address to listen on ("" = every interface)
  std::string host;    // MTXCOMM_TCP_HOST: address the peers connect to
};

// The only place this transport reads the environment.
TcpEnv readTcpEnv() {
  TcpEnv env;
  if (const char* v = std::getenv("MTXCOMM_TCP_IFADDR")) env.ifaddr = v;
  if (const char* v = std::getenv("MTXCOMM_TCP_HOST")) env.host = v;
  if (env.host.empty()) env.host = env.ifaddr.empty() ? "127.0.0.1" : env.ifaddr;
  return env;
}

// ---- bootstrap ------------------------------------------------------------------------------

struct Hello {
  uint64_t magic;
  uint64_t job;
  int32_t from;
  int32_t to;
  int32_t size;
  int32_t pad;
};

Ms remaining(Clock::time_point deadline) {
  return std::max(Ms(1), std::chrono::ceil<Ms>(deadline - Clock::now()));
}

}  // namespace
}  // namespace tcp

std::unique_ptr<Transport> makeTcpTransport(Store& store, int rank, int size,
                                            std::chrono::milliseconds timeout) {
  using namespace tcp;  // NOLINT(build/namespaces): the mesh, the view and the helpers above
  if (size < 1 || rank < 0 || rank >= size) {
    fail(MTXCOMM_INVALID_USAGE, "tcp transport: rank ", rank, " is not in [0, ", size, ")");
  }
  const auto deadline = Clock::now() + timeout;
  auto shared = std::make_shared<TcpShared>(rank, size);
  std::vector<int> identity(size);
  for (int i = 0; i < size; ++i) identity[i] = i;
  if (size == 1) return makeView(shared, identity, 0, 0, PeerLiveness());

  const TcpEnv env = readTcpEnv();
  // Listen on an ephemeral port.
  sockaddr_in bind_addr{};
  bind_addr.sin_family = AF_INET;
  bind_addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!env.ifaddr.empty())
    bind_addr = resolveIpv4(env.ifaddr, 0, "tcp transport: MTXCOMM_TCP_IFADDR");
  UniqueFd listener(listenTcp(&bind_addr, /*reuse_addr=*/false));
  if (listener.get() < 0) {
    fail(MTXCOMM_SYSTEM_ERROR, "tcp transport: cannot listen on ",
         env.ifaddr.empty() ? "0.0.0.0" : env.ifaddr, ": ", errnoText(errno));
  }
  const int port = ntohs(bind_addr.sin_port);

  // Job id: tells this job's connections from strays.
  uint64_t job = 0;
  if (rank == 0) {
    std::random_device rd;
    job = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
    store.set("tcp/job", std::to_string(job));
  } else {
    job = std::stoull(store.get("tcp/job", remaining(deadline)));
  }
  store.set(strCat("tcp/addr/", rank), strCat(env.host, ":", port));
  store.set(strCat("tcp/id/", rank), PeerLiveness::selfIdentity());

  // Connect to every lower rank and say hello (no wait for the answer yet: the peer may still be
  // connecting to its own lower ranks).
  for (int peer = 0; peer < rank; ++peer) {
    std::string where = store.get(strCat("tcp/addr/", peer), remaining(deadline));
    size_t colon = where.rfind(':');
    if (colon == std::string::npos) {
      fail(MTXCOMM_SYSTEM_ERROR, "tcp transport: bad address '", where, "' for peer rank ", peer);
    }
    sockaddr_in addr = resolveIpv4(where.substr(0, colon), std::atoi(where.c_str() + colon + 1),
                                   strCat("tcp transport: address of peer rank ", peer));
    int err = 0;
    UniqueFd fd(connectWithRetry(addr, deadline, &err, "tcp transport"));
    if (fd.get() < 0) {
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout), " s connecting to peer rank ",
           peer, " at ", where, " (", errnoText(err), ")");
    }
    Hello hello{kMagic, job, rank, peer, size, 0};
    if (!sendAll(fd.get(), &hello, sizeof(hello))) {
      fail(MTXCOMM_REMOTE_ERROR, "peer rank ", peer, " closed the connection (", errnoText(errno),
           ") during the tcp handshake");
    }
    shared->setFd(peer, fd.release());
  }

  // Accept every higher rank; drop connections that are not from this job.
  int missing = size - 1 - rank;
  while (missing > 0) {
    pollfd pfd{listener.get(), POLLIN, 0};
    int rc = ::poll(&pfd, 1, msLeft(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      std::string who;
      for (int peer = rank + 1; peer < size; ++peer) {
        if (shared->peer(peer).fd < 0) who += strCat(who.empty() ? "" : ", ", peer);
      }
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout),
           " s waiting for peer rank(s) ", who, " to connect (tcp bootstrap)");
    }
    UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() < 0) continue;
    Hello hello;
    if (recvAll(fd.get(), &hello, sizeof(hello), deadline) != IoResult::kOk) continue;
    if (hello.magic != kMagic || hello.job != job || hello.to != rank || hello.size != size ||
        hello.from <= rank || hello.from >= size || shared->peer(hello.from).fd >= 0) {
      continue;  // not ours
    }
    Hello ack{kMagic, job, rank, hello.from, size, 0};
    if (!sendAll(fd.get(), &ack, sizeof(ack))) continue;
    shared->setFd(hello.from, fd.release());
    --missing;
  }

  // Collect the answers of the lower ranks.
  for (int peer = 0; peer < rank; ++peer) {
    Hello ack;
    IoResult r = recvAll(shared->peer(peer).fd, &ack, sizeof(ack), deadline);
    if (r == IoResult::kTimeout) {
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout), " s waiting for peer rank ",
           peer, " to accept the connection (tcp bootstrap)");
    }
    if (r != IoResult::kOk) {
      fail(MTXCOMM_REMOTE_ERROR, "peer rank ", peer,
           " closed the connection during the tcp handshake");
    }
    if (ack.magic != kMagic || ack.job != job || ack.from != peer || ack.to != rank) {
      fail(MTXCOMM_REMOTE_ERROR, "peer rank ", peer,
           " answered the tcp handshake wrongly "
           "(another job on its port?)");
    }
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    setNoDelay(shared->peer(peer).fd);
    setNonBlocking(shared->peer(peer).fd);
  }
  // Identities for the liveness of node-local peers (every rank set its own before connecting).
  std::vector<std::string> ids(size);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) ids[peer] = store.get(strCat("tcp/id/", peer), remaining(deadline));
  }
  return makeView(shared, identity, rank, 0, PeerLiveness(ids, rank));
}

}  // namespace mtxcomm
