// Liveness of peers on the same node: each rank publishes "<node identity>|pid" (the node
// identity of lib/base/topology.h: host name, network and pid namespaces); a rank
// blocked in a wait checks (at most every 100 ms) whether the processes of its node-local peers
// still exist (kill(pid, 0), and not a zombie in /proc/<pid>/stat), so a SIGKILLed neighbour turns
// into MTXCOMM_REMOTE_ERROR naming it within a fraction of a second instead of after the full
// timeout. Peers on other nodes are covered by the transport (closed connections) and the timeout.
#ifndef MTXCOMM_LIB_LIVENESS_H_
#define MTXCOMM_LIB_LIVENESS_H_

#include <string>
#include <vector>

#include "lib/base/clock.h"

namespace mtxcomm {

// Whether process pid (on this node) is gone: no such process, or a zombie not yet reaped.
bool processGone(long pid);

class PeerLiveness {
 public:
  PeerLiveness() = default;
  // identities[r] is selfIdentity() of rank r; myRank is this rank.
  PeerLiveness(const std::vector<std::string>& identities, int myRank);
  // "<node identity>|pid" of this process.
  static std::string selfIdentity();
  // localNodeIdentity(): equal for processes that share a node (lib/base/topology.h).
  static std::string nodeIdentity();
  // The lowest rank among node-local peers whose process is gone, or -1. Rate-limited: scans
  // at most once per 100 ms and otherwise returns the last answer.
  int findDeadPeer();
  // The same list restricted to some ranks (split): members[i] is the parent rank of new rank i.
  PeerLiveness subset(const std::vector<int>& members, int newRank) const;

 private:
  std::vector<long> localPids_;  // pid per rank, or 0 when not on this node (or this rank)
  Clock::time_point nextScan_{};
  int dead_ = -1;
};

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_LIVENESS_H_
