#include "transports/route/route.h"

#include <cstring>

#include "lib/base/error.h"
#include "lib/base/liveness.h"
#include "lib/base/log.h"
#ifdef MTXCOMM_HAVE_UCX
#include "transports/ucx/ucx_transport.h"
#endif

namespace mtxcomm {

std::vector<std::string> allgatherBlobs(Transport& t, const std::string& mine,
                                        Clock::time_point deadline) {
  const int n = t.size(), me = t.rank();
  std::vector<std::string> all(n);
  all[me] = mine;
  std::vector<uint64_t> lens(n, 0);
  const uint64_t myLen = mine.size();
  std::vector<RequestPtr> reqs;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    reqs.push_back(t.isend(p, Transport::kMaxTag - 1, &myLen, sizeof(myLen)));
    reqs.push_back(t.irecv(p, Transport::kMaxTag - 1, &lens[p], sizeof(uint64_t)));
  }
  t.waitAll(reqs, deadline);
  reqs.clear();
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    all[p].resize(lens[p]);
    reqs.push_back(t.isend(p, Transport::kMaxTag, mine.data(), mine.size()));
    reqs.push_back(t.irecv(p, Transport::kMaxTag, all[p].data(), lens[p]));
  }
  t.waitAll(reqs, deadline);
  return all;
}

namespace {

// The first k - 1 newline-separated fields of s, then the rest as the last one.
std::vector<std::string> splitFields(const std::string& s, size_t k) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (out.size() + 1 < k) {
    size_t bar = s.find('\n', pos);
    if (bar == std::string::npos) break;
    out.push_back(s.substr(pos, bar - pos));
    pos = bar + 1;
  }
  out.push_back(s.substr(pos));
  return out;
}

}  // namespace

RoutedTransport routeTransport(std::unique_ptr<Transport> base, const std::string& choice,
                               double timeoutSeconds, size_t ucxEagerLimit, bool shmCollectives) {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<long>(timeoutSeconds * 1000));
  const int n = base->size(), me = base->rank();
  const std::string bootName = base->name();
  // Round 1: node identity and liveness identity of every rank.
  const std::string node = PeerLiveness::nodeIdentity();
  std::vector<std::string> nodes(n), live(n);
  const std::vector<std::string> ids =
      allgatherBlobs(*base, node + "\n" + PeerLiveness::selfIdentity(), deadline);
  for (int r = 0; r < n; ++r) {
    auto f = splitFields(ids[r], 2);
    nodes[r] = f[0];
    live[r] = f.size() > 1 ? f[1] : "";
  }
  bool multiNode = false;
  for (const std::string& id : nodes) multiNode = multiNode || id != node;

  // Round 2, where UCX is wanted: every rank's worker address, or why it has none.
  bool ucxEverywhere = false;
  std::vector<std::string> ucxWhyNot(n);
  const bool wantUcx = choice == "ucx" || (choice == "auto" && multiNode);
#ifdef MTXCOMM_HAVE_UCX
  std::shared_ptr<UcxWorker> worker;
  std::vector<std::string> addresses(n);
  if (wantUcx) {
    std::string why;
    worker = openUcxWorker(ucxEagerLimit, multiNode, &why);
    std::string blob = worker ? "1" + ucxWorkerAddress(*worker) : "0" + why;
    ucxEverywhere = true;
    const std::vector<std::string> blobs = allgatherBlobs(*base, blob, deadline);
    for (int r = 0; r < n; ++r) {
      const std::string& b = blobs[r];
      if (!b.empty() && b[0] == '1') {
        addresses[r] = b.substr(1);
      } else {
        ucxEverywhere = false;
        ucxWhyNot[r] = b.empty() ? "no answer" : b.substr(1);
      }
    }
  }
#else
  for (std::string& w : ucxWhyNot) w = "this mtxcomm was built without UCX";
#endif
  if (choice == "ucx" && !ucxEverywhere) {
    std::string who;
    for (int r = 0; r < n; ++r) {
      if (!ucxWhyNot[r].empty())
        who += strCat(who.empty() ? "" : "; ", "rank ", r, ": ", ucxWhyNot[r]);
    }
    fail(MTXCOMM_UNSUPPORTED, "MTXCOMM_TRANSPORT=ucx but UCX is not usable on every rank (", who,
         ")");
  }
  const bool useUcx = wantUcx && ucxEverywhere;
  if (wantUcx && !useUcx && me == 0) {
    for (int r = 0; r < n; ++r) {
      if (!ucxWhyNot[r].empty()) {
        MTXCOMM_LOG(kWarn, me, "rank ", r, " has no UCX (", ucxWhyNot[r],
                    "): every peer is reached over ", bootName);
      }
    }
  }
  const std::string p2p = useUcx ? "ucx" : bootName;

  RoutedTransport out;
  int local = 0;
  for (int r = 0; r < n; ++r) {
    if (r == me) {
      out.routes.push_back(strCat("rank ", r, " (this rank): node ", nodes[r]));
      continue;
    }
    const bool sameNode = nodes[r] == node;
    local += sameNode;
    std::string cands = sameNode && shmCollectives ? "shm (collectives on this node), " : "";
    if (wantUcx && ucxWhyNot[r].empty() && ucxWhyNot[me].empty()) cands += "ucx, ";
    cands += bootName;
    out.routes.push_back(strCat("peer rank ", r, ": node ", nodes[r],
                                sameNode ? " (this node)" : " (another node)", "; candidates ",
                                cands, "; point-to-point over ", p2p,
                                sameNode && useUcx ? " (UCX shared memory/CMA)" : ""));
    MTXCOMM_LOG(kDebug, me, "route: ", out.routes.back());
  }
  MTXCOMM_LOG(kInfo, me, "routes: ", local, " node-local and ", n - 1 - local,
              " remote peers; point-to-point over ", p2p,
              multiNode        ? ""
              : shmCollectives ? " (one node: collectives over the shared-memory segment)"
                               : " (one node; MTXCOMM_SHM=off: collectives over it too)");
#ifdef MTXCOMM_HAVE_UCX
  if (useUcx) {
    std::vector<bool> sameNode(n);
    for (int r = 0; r < n; ++r) sameNode[r] = nodes[r] == node;
    MTXCOMM_LOG(kInfo, me, "ucx: ", ucxProtocolChoice(*worker));
    out.transport =
        makeUcxTransport(std::move(worker), me, addresses, live, sameNode, std::move(base));
    return out;
  }
#endif
  out.transport = std::move(base);
  return out;
}

}  // namespace mtxcomm
