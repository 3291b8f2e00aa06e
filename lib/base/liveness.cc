#include "lib/base/liveness.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "lib/base/topology.h"

namespace mtxcomm {

std::string PeerLiveness::selfIdentity() {
  // The node identity of the topology (host name, network and pid namespaces): "same node" for
  // liveness is the same as for shared memory and the node map, so a peer in another network
  // namespace (an emulated node) is never checked by pid. A pid is only meaningful inside its
  // pid namespace, which the identity includes.
  return localNodeIdentity() + "|" + std::to_string(static_cast<long>(getpid()));
}

std::string PeerLiveness::nodeIdentity() {
  std::string self = selfIdentity();
  return self.substr(0, self.rfind('|'));
}

PeerLiveness::PeerLiveness(const std::vector<std::string>& identities, int myRank) {
  const std::string self = selfIdentity();
  const std::string node = self.substr(0, self.rfind('|'));
  localPids_.assign(identities.size(), 0);
  for (size_t r = 0; r < identities.size(); ++r) {
    const std::string& id = identities[r];
    size_t bar = id.rfind('|');
    if (static_cast<int>(r) == myRank || bar == std::string::npos) continue;
    if (node.find(":?") != std::string::npos) continue;  // namespace unknown: do not guess
    if (id.substr(0, bar) == node) localPids_[r] = std::atol(id.c_str() + bar + 1);
  }
}

// Whether process pid is gone: no such process, or a zombie (killed or exited, not yet reaped
// by its parent: kill(pid, 0) still succeeds on it, so a launcher that reaps late would hide a
// dead rank until the timeout).
bool processGone(long pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return false;  // no /proc: kill's answer stands
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')' (comm may contain ')').
  const char* close = std::strrchr(buf, ')');
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

int PeerLiveness::findDeadPeer() {
  if (dead_ >= 0 || localPids_.empty()) return dead_;
  auto now = Clock::now();
  if (now < nextScan_) return dead_;
  nextScan_ = now + std::chrono::milliseconds(100);
  for (size_t r = 0; r < localPids_.size(); ++r) {
    if (localPids_[r] > 0 && processGone(localPids_[r])) {
      dead_ = static_cast<int>(r);
      break;
    }
  }
  return dead_;
}

PeerLiveness PeerLiveness::subset(const std::vector<int>& members, int) const {
  PeerLiveness p;
  if (localPids_.empty()) return p;
  for (int m : members) p.localPids_.push_back(localPids_[m]);
  return p;
}

}  // namespace mtxcomm
