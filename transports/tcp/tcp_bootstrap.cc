// The TCP transport's bootstrap (tcp_transport.h): listen, publish the address through the
// (authenticated) store, connect to the lower ranks and accept the higher ones, every
// connection through the job-secret handshake of lib/base/auth.h.
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

#include "lib/base/auth.h"
#include "lib/base/error.h"
#include "lib/base/liveness.h"
#include "lib/base/log.h"
#include "lib/base/socket_util.h"
#include "transports/tcp/tcp_mesh.h"
#include "transports/tcp/tcp_transport.h"

namespace mtxcomm {
namespace tcp {
namespace {

// ---- environment ----------------------------------------------------------------------------

struct TcpEnv {
  std::string ifaddr;  // MTXCOMM_TCP_IFADDR: the address to listen on
  std::string host;    // MTXCOMM_TCP_HOST: the address the peers connect to
};

// The only place this transport reads the environment. The transport listens only where its
// peers are told to connect: MTXCOMM_TCP_IFADDR, else the address of MTXCOMM_TCP_HOST, else
// loopback (every rank on this host, the peers told 127.0.0.1).
TcpEnv readTcpEnv() {
  TcpEnv env;
  if (const char* v = std::getenv("MTXCOMM_TCP_IFADDR")) env.ifaddr = v;
  if (const char* v = std::getenv("MTXCOMM_TCP_HOST")) env.host = v;
  if (env.host.empty()) env.host = env.ifaddr.empty() ? "127.0.0.1" : env.ifaddr;
  if (env.ifaddr.empty()) env.ifaddr = env.host;
  return env;
}

// ---- bootstrap ------------------------------------------------------------------------------

// What a connecting rank claims in the handshake (AuthResponse::claim, 32 bytes).
struct Claim {
  uint64_t job;  // rank 0's job id: tells two jobs with one secret apart
  int32_t from;
  int32_t to;
  int32_t size;
  int32_t pad[3];
};
static_assert(sizeof(Claim) == 32, "the handshake's claim is 32 bytes");

Ms remaining(Clock::time_point deadline) {
  return std::max(Ms(1), std::chrono::ceil<Ms>(deadline - Clock::now()));
}

uint64_t randomJobId() {
  const Nonce n = randomNonce();
  uint64_t id = 0;
  std::memcpy(&id, n.data(), sizeof(id));
  return id;
}

// The accept loop: every higher rank connects once. Handshakes run side by side, each with its
// own short deadline, so strangers (silent connections, port scanners, another job) are
// dropped and logged without delaying the job's ranks.
void acceptPeers(TcpShared& shared, Store& store, int listener, uint64_t job, int rank, int size,
                 Clock::time_point deadline, Ms timeout) {
  const JobSecret& secret = store.secret();
  struct Pending {
    UniqueFd fd;
    std::unique_ptr<AcceptorHandshake> hs;
  };
  std::vector<Pending> pending;
  int missing = size - 1 - rank;
  bool emfileWarned = false;
  int dropped = 0, refused = 0;  // strangers, and connectors that failed the proof
  // At most this many drops are logged one by one (a flood must not fill the log).
  constexpr int kLoggedDrops = 20;
  auto logDrop = [&](int fd, const std::string& why) {
    if (++dropped <= kLoggedDrops) {
      MTXCOMM_LOG(kWarn, rank, "tcp bootstrap: dropped a connection from ", peerAddress(fd), ": ",
                  why, dropped == kLoggedDrops ? " (further drops are counted, not logged)" : "");
    }
  };
  Clock::time_point listenAgain = Clock::now();
  while (missing > 0) {
    const auto now = Clock::now();
    if (now >= deadline) {
      std::string who;
      for (int peer = rank + 1; peer < size; ++peer) {
        if (shared.peer(peer).fd < 0) who += strCat(who.empty() ? "" : ", ", peer);
      }
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout),
           " s waiting for peer rank(s) ", who, " to connect (tcp bootstrap)",
           refused > 0 ? strCat("; ", refused,
                                " connection(s) failed to prove the job secret: is "
                                "MTXCOMM_JOB_SECRET the same on every rank?")
                       : std::string(),
           dropped > refused ? strCat("; ", dropped - refused, " other connection(s) dropped")
                             : std::string(),
           store.diagnosis().empty() ? std::string() : "; " + store.diagnosis());
    }
    std::vector<pollfd> pfds;
    const bool listening = now >= listenAgain;
    pfds.push_back({listening ? listener : -1, POLLIN, 0});
    Clock::time_point wake = deadline;
    for (const Pending& p : pending) {
      pfds.push_back({p.fd.get(), p.hs->pollEvents(), 0});
      wake = std::min(wake, p.hs->deadline());
    }
    if (!listening) wake = std::min(wake, listenAgain);
    // The store may know the job is faulty (a duplicate rank, another size): look every 200 ms.
    store.check();
    wake = std::min(wake, Clock::now() + std::chrono::milliseconds(200));
    const int rc = ::poll(pfds.data(), pfds.size(), msLeft(wake));
    if (rc < 0 && errno != EINTR)
      fail(MTXCOMM_SYSTEM_ERROR, "tcp bootstrap: poll: ", errnoText(errno));
    if (listening && (pfds[0].revents & POLLIN)) {
      for (;;) {
        const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
          pending.push_back({UniqueFd(fd), nullptr});
          pending.back().hs = std::make_unique<AcceptorHandshake>(
              fd, secret, kAuthTransport,
              std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(
                                                        AcceptorHandshake::kHandshakeSeconds))));
          continue;
        }
        if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors (a flood of connections): say so once, and stop accepting for a
          // moment instead of spinning on a listener that stays readable.
          if (!emfileWarned) {
            MTXCOMM_LOG(kWarn, rank, "tcp bootstrap: accept failed: ", errnoText(errno),
                        " (the process's file descriptor limit, ulimit -n; too many connections "
                        "to this rank's port?)");
            emfileWarned = true;
          }
          listenAgain = Clock::now() + std::chrono::milliseconds(100);
        }
        break;
      }
    }
    for (size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      const short revents = pfds.size() > i + 1 ? pfds[i + 1].revents : 0;
      AcceptorHandshake::State st = AcceptorHandshake::State::kPending;
      if (revents != 0 || Clock::now() >= p.hs->deadline()) st = p.hs->progress();
      if (st == AcceptorHandshake::State::kPending && Clock::now() >= p.hs->deadline()) {
        st = AcceptorHandshake::State::kFailed;
      }
      if (st == AcceptorHandshake::State::kPending) {
        ++i;
        continue;
      }
      if (st == AcceptorHandshake::State::kFailed) {
        if (p.hs->why().find("prove") != std::string::npos) ++refused;
        logDrop(p.fd.get(), p.hs->why().empty() ? "no handshake within the deadline" : p.hs->why());
      } else {
        Claim c;
        std::memcpy(&c, p.hs->response().claim, sizeof(c));
        // The connector holds the secret: it is a rank of this job (or of another job run with
        // the same secret, told apart by the job id). What it says must fit.
        if (c.job != job) {
          logDrop(p.fd.get(), "a rank of another job with the same MTXCOMM_JOB_SECRET");
        } else if (c.size != size) {
          fail(MTXCOMM_INVALID_USAGE, "rank ", c.from, " has MTXCOMM_SIZE=", c.size,
               " but this rank (", rank, ") has MTXCOMM_SIZE=", size,
               ": every rank must be started with the same size");
        } else if (c.to != rank || c.from <= rank || c.from >= size) {
          logDrop(p.fd.get(), strCat("claiming rank ", c.from, " to rank ", c.to));
        } else if (shared.peer(c.from).fd >= 0) {
          fail(MTXCOMM_INVALID_USAGE, "two processes connected as rank ", c.from,
               " (the second from ", peerAddress(p.fd.get()),
               "): is MTXCOMM_RANK the same on two ranks?");
        } else {
          shared.setFd(c.from, p.fd.release());
          --missing;
        }
      }
      pending.erase(pending.begin() + static_cast<long>(i));
    }
  }
  // Every rank is in: what is still in its handshake is a stranger.
  for (Pending& p : pending) logDrop(p.fd.get(), "not a rank of this job (all ranks had joined)");
}

}  // namespace
}  // namespace tcp

namespace tcp {
namespace {
std::unique_ptr<Transport> bootstrap(Store& store, int rank, int size,
                                     std::chrono::milliseconds timeout);
}  // namespace
}  // namespace tcp

std::unique_ptr<Transport> makeTcpTransport(Store& store, int rank, int size,
                                            std::chrono::milliseconds timeout) {
  try {
    return tcp::bootstrap(store, rank, size, timeout);
  } catch (const Error& e) {
    // A peer that closed its connection may have left because the store found the job faulty
    // (two processes claim one rank, a rank has another size): that cause, not the symptom.
    if (e.code() != MTXCOMM_INVALID_USAGE) {
      const std::string cause = store.knownFault(std::chrono::milliseconds(1000));
      if (!cause.empty()) throw Error(MTXCOMM_INVALID_USAGE, cause);
    }
    // The ranks still waiting (for the store, for this rank's connection) learn why at once.
    store.reportFault(strCat("rank ", rank, ": ", e.what()));
    throw;
  }
}

namespace tcp {
namespace {
std::unique_ptr<Transport> bootstrap(Store& store, int rank, int size,
                                     std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    fail(MTXCOMM_INVALID_USAGE, "tcp transport: rank ", rank, " is not in [0, ", size, ")");
  }
  const auto deadline = Clock::now() + timeout;
  auto shared = std::make_shared<TcpShared>(rank, size);
  std::vector<int> identity(size);
  for (int i = 0; i < size; ++i) identity[i] = i;
  if (size == 1) return makeView(shared, identity, 0, 0, PeerLiveness());
  const JobSecret& secret = store.secret();
  if (secret.empty()) {
    fail(MTXCOMM_INVALID_USAGE,
         "tcp transport: the job has no secret (MTXCOMM_JOB_SECRET or MTXCOMM_JOB_SECRET_FILE)");
  }

  const TcpEnv env = readTcpEnv();
  // Listen on an ephemeral port of the address the peers are told.
  sockaddr_in bind_addr = resolveIpv4(env.ifaddr, 0, "tcp transport: the address to listen on");
  UniqueFd listener(listenTcp(&bind_addr, /*reuse_addr=*/false));
  if (listener.get() < 0) {
    fail(MTXCOMM_SYSTEM_ERROR, "tcp transport: cannot listen on ", env.ifaddr, ": ",
         errnoText(errno),
         " (MTXCOMM_TCP_IFADDR / MTXCOMM_TCP_HOST must be an address of this host)");
  }
  setNonBlocking(listener.get());
  const int port = ntohs(bind_addr.sin_port);

  // Job id: tells two jobs that share a secret apart.
  uint64_t job = 0;
  if (rank == 0) {
    job = randomJobId();
    store.set("tcp/job", std::to_string(job));
  } else {
    try {
      job = std::stoull(store.get("tcp/job", remaining(deadline)));
    } catch (const std::logic_error&) {
      fail(MTXCOMM_REMOTE_ERROR, "tcp transport: the store's job id is not a number");
    }
  }
  store.set(strCat("tcp/addr/", rank), strCat(env.host, ":", port));
  store.set(strCat("tcp/id/", rank), PeerLiveness::selfIdentity());

  // Connect to every lower rank and pass its handshake (a lower rank accepts while it waits for
  // its higher ranks, so this never waits on a rank that waits on this one).
  for (int peer = 0; peer < rank; ++peer) {
    std::string where = store.get(strCat("tcp/addr/", peer), remaining(deadline));
    size_t colon = where.rfind(':');
    if (colon == std::string::npos) {
      fail(MTXCOMM_SYSTEM_ERROR, "tcp transport: bad address '", where, "' for peer rank ", peer);
    }
    sockaddr_in addr = resolveIpv4(where.substr(0, colon), std::atoi(where.c_str() + colon + 1),
                                   strCat("tcp transport: address of peer rank ", peer));
    // In rounds of 200 ms with the store's check between: a peer that died after publishing
    // its address refuses every connection until the timeout, but the store may know sooner
    // (a faulty job; a file: store's rank 0 gone).
    int err = 0;
    UniqueFd fd;
    for (;;) {
      fd.reset(connectWithRetry(addr, std::min(deadline, Clock::now() + Ms(200)), &err,
                                "tcp transport"));
      if (fd.get() >= 0 || Clock::now() >= deadline) break;
      store.check();
    }
    if (fd.get() < 0) {
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout), " s connecting to peer rank ",
           peer, " at ", where, " (", errnoText(err), ")");
    }
    Claim claim{job, rank, peer, size, {0, 0, 0}};
    uint8_t bytes[32];
    std::memcpy(bytes, &claim, sizeof(bytes));
    connectorHandshake(fd.get(), secret, kAuthTransport, bytes, deadline,
                       strCat("tcp bootstrap: peer rank ", peer, " at ", where));
    shared->setFd(peer, fd.release());
  }
  acceptPeers(*shared, store, listener.get(), job, rank, size, deadline, timeout);
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
}  // namespace
}  // namespace tcp

}  // namespace mtxcomm
