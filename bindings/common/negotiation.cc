#include "bindings/common/negotiation.h"

#include <algorithm>
#include <sstream>

namespace mtxcomm::binding {

namespace {

constexpr uint8_t kFlagShutdown = 1;

}  // namespace

std::vector<char> encodeCycle(bool shutdown, const std::vector<const Request*>& requests) {
  Writer w;
  w.put<uint8_t>(shutdown ? kFlagShutdown : 0);
  w.put<uint32_t>(static_cast<uint32_t>(requests.size()));
  for (const Request* r : requests) writeRequest(w, *r);
  return std::move(w.bytes());
}

std::vector<int> Negotiation::ingest(const std::vector<char>& all, size_t stride) {
  const int n = nranks_;
  std::vector<int> shutdownRanks;
  const auto now = Clock::now();
  for (int r = 0; r < n; ++r) {
    Reader rd(all.data() + r * stride, stride);
    uint8_t flags = rd.get<uint8_t>();
    if (flags & kFlagShutdown) shutdownRanks.push_back(r);
    uint32_t count = rd.get<uint32_t>();
    for (uint32_t i = 0; i < count; ++i) {
      Request req = readRequest(rd);
      NameQueue& q = table_[req.name];
      if (q.perRank.empty()) q.perRank.resize(n);
      q.perRank[r].push_back({std::move(req), nextOrder_++, now});
    }
  }
  return shutdownRanks;
}

std::vector<Agreed> Negotiation::takeReady() {
  std::vector<Agreed> ready;
  for (auto it = table_.begin(); it != table_.end();) {
    NameQueue& q = it->second;
    for (;;) {
      bool complete = true;
      for (auto& d : q.perRank) complete = complete && !d.empty();
      if (!complete) break;
      Agreed op;
      op.name = it->first;
      for (auto& d : q.perRank) {
        op.order = std::max(op.order, d.front().order);
        op.requests.push_back(std::move(d.front().request));
        d.pop_front();
      }
      ready.push_back(std::move(op));
      q.stallWarned = false;
    }
    bool empty = true;
    for (auto& d : q.perRank) empty = empty && d.empty();
    it = empty ? table_.erase(it) : std::next(it);
  }
  std::sort(ready.begin(), ready.end(),
            [](const Agreed& a, const Agreed& b) { return a.order < b.order; });
  return ready;
}

Status Negotiation::check(const Agreed& op) const {
  const Request& r0 = op.requests[0];
  const Request& mine = op.requests[rank_];
  const std::string head = std::string(kindName(mine.kind)) + " '" + mine.name + "'";
  auto mismatch = [&](const char* what, auto&& same) -> Status {
    std::vector<int> bad;
    for (size_t r = 1; r < op.requests.size(); ++r) {
      if (!same(op.requests[r])) bad.push_back(static_cast<int>(r));
    }
    if (bad.empty()) return {};
    std::ostringstream s;
    s << "mtxcomm " << head << ": the ranks disagree on the " << what << ": rank 0 has "
      << describeRequest(r0);
    for (int r : bad) s << ", rank " << r << " has " << describeRequest(op.requests[r]);
    return {MTXCOMM_INVALID_ARGUMENT, s.str()};
  };
  Status st = mismatch("collective", [&](const Request& r) { return r.kind == r0.kind; });
  if (!st.ok()) return st;
  if (r0.kind == Kind::kAllreduce || r0.kind == Kind::kReduceScatter) {
    st = mismatch("reduction op", [&](const Request& r) { return r.op == r0.op; });
    if (!st.ok()) return st;
  }
  if (r0.kind == Kind::kBroadcast) {
    st = mismatch("root", [&](const Request& r) { return r.root == r0.root; });
    if (!st.ok()) return st;
    if (r0.root < 0 || r0.root >= nranks_) {
      return {MTXCOMM_INVALID_ARGUMENT, "mtxcomm " + head + ": root_rank " +
                                            std::to_string(r0.root) + " is not in [0, " +
                                            std::to_string(nranks_) + ")"};
    }
  }
  st = mismatch("number of tensors",
                [&](const Request& r) { return r.tensors.size() == r0.tensors.size(); });
  if (!st.ok()) return st;
  st = mismatch("dtypes", [&](const Request& r) {
    for (size_t i = 0; i < r.tensors.size(); ++i) {
      if (r.tensors[i].dtype != r0.tensors[i].dtype) return false;
    }
    return true;
  });
  if (!st.ok()) return st;
  const bool firstMayDiffer = r0.kind == Kind::kAllgather;
  st = mismatch(firstMayDiffer ? "shape after the first dimension" : "shapes",
                [&](const Request& r) {
                  for (size_t i = 0; i < r.tensors.size(); ++i) {
                    const auto& a = r.tensors[i].shape;
                    const auto& b = r0.tensors[i].shape;
                    if (a.size() != b.size()) return false;
                    for (size_t d = firstMayDiffer ? 1 : 0; d < a.size(); ++d) {
                      if (a[d] != b[d]) return false;
                    }
                  }
                  return true;
                });
  if (!st.ok()) return st;
  if ((r0.kind == Kind::kAllgather || r0.kind == Kind::kReduceScatter) &&
      r0.tensors[0].shape.empty()) {
    return {MTXCOMM_INVALID_ARGUMENT,
            "mtxcomm " + head + ": the tensor must have at least one dimension (got a scalar)"};
  }
  return {};
}

std::vector<std::string> Negotiation::stalled(double seconds) {
  std::vector<std::string> warnings;
  if (seconds <= 0) return warnings;
  const auto now = Clock::now();
  for (auto& kv : table_) {
    NameQueue& q = kv.second;
    if (q.stallWarned) continue;
    std::vector<int> have, missing;
    Clock::time_point first = now;
    for (size_t r = 0; r < q.perRank.size(); ++r) {
      if (q.perRank[r].empty()) {
        missing.push_back(static_cast<int>(r));
      } else {
        have.push_back(static_cast<int>(r));
        first = std::min(first, q.perRank[r].front().arrived);
      }
    }
    if (missing.empty() || std::chrono::duration<double>(now - first).count() < seconds) {
      continue;
    }
    q.stallWarned = true;
    const Request& r = q.perRank[have[0]].front().request;
    warnings.push_back(std::string(kindName(r.kind)) + " '" + kv.first + "' submitted by " +
                       rankList(have) + " has waited " + std::to_string(int(seconds)) + " s for " +
                       rankList(missing) +
                       " (a rank stopped early, or the ranks run different code?)");
  }
  return warnings;
}

}  // namespace mtxcomm::binding
