#include "bindings/common/negotiation.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace mtxcomm::binding {

namespace {

constexpr uint32_t kMagic = 0x6d74786e;  // "mtxn"
constexpr uint8_t kFlagShutdown = 1;
constexpr uint32_t kMaxCount = 1 << 24;  // requests or names in one message

size_t bitWords(size_t bits) { return (bits + 63) / 64; }

std::vector<char> encodeExtras(const CycleMessage& msg) {
  Writer w;
  w.put<uint32_t>(static_cast<uint32_t>(msg.requests.size()));
  for (const Request& r : msg.requests) writeRequest(w, r);
  w.put<uint32_t>(static_cast<uint32_t>(msg.cancelled.size()));
  for (const std::string& n : msg.cancelled) w.putString(n);
  return std::move(w.bytes());
}

}  // namespace

Negotiation::Negotiation(int rank, int nranks, int cacheCapacity)
    : rank_(rank),
      nranks_(nranks),
      capacity_(static_cast<size_t>(std::max(0, cacheCapacity))),
      joined_(static_cast<size_t>(nranks), false) {}

int Negotiation::cachedId(const Request& r) const {
  auto it = byName_.find(r.name);
  if (it == byName_.end()) return -1;
  for (int id : it->second) {
    if (cache_[id].requests[rank_] == r) return id;
  }
  return -1;
}

size_t Negotiation::slotBytes() const {
  return kHeaderBytes + 8 * bitWords(cache_.size()) + kInlineBytes;
}

std::vector<char> Negotiation::encode(const CycleMessage& msg, char* slot) const {
  const size_t bytes = slotBytes();
  std::memset(slot, 0, bytes);
  std::vector<char> extras = encodeExtras(msg);
  const uint32_t magic = kMagic, size = static_cast<uint32_t>(cache_.size());
  const uint32_t extraBytes = static_cast<uint32_t>(extras.size());
  slot[4] = msg.shutdown ? kFlagShutdown : 0;
  std::memcpy(slot, &magic, 4);
  std::memcpy(slot + 8, &extraBytes, 4);
  std::memcpy(slot + 12, &size, 4);
  auto* words = reinterpret_cast<uint64_t*>(slot + kHeaderBytes);
  for (uint32_t id : msg.cached) {
    if (id >= cache_.size()) throw std::runtime_error("cache id out of range");
    words[id / 64] |= uint64_t{1} << (id % 64);
  }
  if (extras.size() <= kInlineBytes) {
    std::memcpy(slot + kHeaderBytes + 8 * bitWords(cache_.size()), extras.data(), extras.size());
    return {};
  }
  return extras;
}

bool Negotiation::needsSecondExchange(const std::vector<char>& all, size_t* longest) const {
  const size_t stride = slotBytes();
  *longest = 0;
  for (int r = 0; r < nranks_; ++r) {
    uint32_t extraBytes = 0;
    std::memcpy(&extraBytes, all.data() + r * stride + 8, 4);
    if (extraBytes > kInlineBytes) *longest = std::max<size_t>(*longest, extraBytes);
  }
  return *longest > 0;
}

void Negotiation::add(int r, Request req, Clock::time_point now) {
  if (req.kind == Kind::kJoin) joined_[r] = true;
  NameQueue& q = table_[req.name];
  if (q.perRank.empty()) q.perRank.resize(nranks_);
  q.perRank[r].push_back({std::move(req), nextOrder_++, now});
}

std::vector<int> Negotiation::ingest(const std::vector<char>& all, const std::vector<char>& extras,
                                     size_t stride, std::vector<Cancelled>* cancelled) {
  const size_t slot = slotBytes();
  if (all.size() < slot * static_cast<size_t>(nranks_)) {
    throw std::runtime_error("short negotiation message");
  }
  const auto now = Clock::now();
  std::vector<int> shutdownRanks;
  const size_t words = bitWords(cache_.size());
  for (int r = 0; r < nranks_; ++r) {
    const char* p = all.data() + r * slot;
    uint32_t magic = 0, extraBytes = 0, size = 0;
    std::memcpy(&magic, p, 4);
    std::memcpy(&extraBytes, p + 8, 4);
    std::memcpy(&size, p + 12, 4);
    if (magic != kMagic)
      throw std::runtime_error("bad negotiation message from rank " + std::to_string(r));
    if (size != cache_.size()) {
      throw std::runtime_error("rank " + std::to_string(r) + " has a response cache of " +
                               std::to_string(size) + " entries, this rank " +
                               std::to_string(cache_.size()));
    }
    if (p[4] & kFlagShutdown) shutdownRanks.push_back(r);
    // Cached requests, by ascending id.
    for (size_t w = 0; w < words; ++w) {
      uint64_t bits = 0;
      std::memcpy(&bits, p + kHeaderBytes + 8 * w, 8);
      while (bits) {
        const int b = __builtin_ctzll(bits);
        bits &= bits - 1;
        const size_t id = w * 64 + static_cast<size_t>(b);
        if (id >= cache_.size()) throw std::runtime_error("cache bit out of range");
        add(r, cache_[id].requests[r], now);
      }
    }
    const char* ex;
    size_t exBytes;
    if (extraBytes <= kInlineBytes) {
      ex = p + kHeaderBytes + 8 * words;
      exBytes = kInlineBytes;
    } else {
      if (extras.size() < stride * static_cast<size_t>(nranks_) || extraBytes > stride) {
        throw std::runtime_error("missing second negotiation exchange");
      }
      ex = extras.data() + r * stride;
      exBytes = stride;
    }
    Reader rd(ex, std::min<size_t>(exBytes, extraBytes));
    const uint32_t n = rd.get<uint32_t>();
    if (n > kMaxCount) throw std::runtime_error("too many requests in one message");
    for (uint32_t i = 0; i < n; ++i) add(r, readRequest(rd), now);
    const uint32_t c = rd.get<uint32_t>();
    if (c > kMaxCount) throw std::runtime_error("too many cancellations in one message");
    for (uint32_t i = 0; i < c; ++i) {
      const std::string name = rd.getString();
      if (r != 0) continue;  // only rank 0 decides stalls
      auto it = table_.find(name);
      if (it == table_.end()) continue;
      NameQueue& q = it->second;
      Cancelled cx;
      cx.name = name;
      std::vector<int> missing;
      for (int k = 0; k < nranks_; ++k) {
        if (!q.perRank[k].empty()) {
          cx.ranks.push_back(k);
          q.perRank[k].pop_front();
        } else if (!joined_[k]) {
          missing.push_back(k);
        }
      }
      cx.message = "mtxcomm: " + name + " was submitted by " + rankList(cx.ranks) + " but not by " +
                   rankList(missing) +
                   " within MTXCOMM_STALL_TIMEOUT (a rank stopped early, took another branch, or "
                   "the ranks run different code)";
      bool empty = true;
      for (auto& d : q.perRank) empty = empty && d.empty();
      if (empty) table_.erase(it);
      cancelled->push_back(std::move(cx));
    }
  }
  return shutdownRanks;
}

bool Negotiation::ready(const NameQueue& q) const {
  bool any = false;
  for (int r = 0; r < nranks_; ++r) {
    if (!q.perRank[r].empty()) {
      any = true;
    } else if (!joined_[r]) {
      return false;
    }
  }
  return any;
}

std::vector<Agreed> Negotiation::takeReady() {
  std::vector<Agreed> ready;
  for (auto it = table_.begin(); it != table_.end();) {
    NameQueue& q = it->second;
    while (this->ready(q)) {
      // A join is ready only when every rank joined (then nobody stands in).
      int first = 0;  // ready(q): some rank has a request
      while (first + 1 < nranks_ && q.perRank[first].empty()) ++first;
      const bool isJoin = q.perRank[first].front().request.kind == Kind::kJoin;
      bool everyone = true;
      for (auto& d : q.perRank) everyone = everyone && !d.empty();
      if (isJoin && !everyone) break;
      Agreed op;
      op.name = it->first;
      op.requests.resize(nranks_);
      op.joined.assign(nranks_, false);
      op.arrivalUs.assign(nranks_, 0.0);
      uint64_t last = 0;
      for (int r = 0; r < nranks_; ++r) {
        auto& d = q.perRank[r];
        if (d.empty()) continue;
        op.order = std::max(op.order, d.front().order);
        if (d.front().order >= last) {
          last = d.front().order;
          op.lastJoined = r;
        }
        op.arrivalUs[r] =
            std::chrono::duration<double, std::micro>(d.front().arrived - start_).count();
        op.requests[r] = std::move(d.front().request);
        d.pop_front();
      }
      for (int r = 0; r < nranks_; ++r) {
        if (!q.perRank[r].empty() || !op.requests[r].name.empty()) continue;
        // A joined rank stands in: the first active rank's request, with no rows to gather.
        op.joined[r] = true;
        op.requests[r] = op.requests[first];
        if (op.requests[r].kind == Kind::kAllgather) {
          for (TensorMeta& t : op.requests[r].tensors) {
            if (!t.shape.empty()) t.shape[0] = 0;
          }
        }
      }
      if (!isJoin) op.lastJoined = -1;
      if (isJoin) joined_.assign(nranks_, false);
      ready.push_back(std::move(op));
      q.stallWarned = false;
    }
    bool empty = true;
    for (auto& d : q.perRank) empty = empty && d.empty();
    it = empty ? table_.erase(it) : std::next(it);
  }
  std::sort(ready.begin(), ready.end(),
            [](const Agreed& a, const Agreed& b) { return a.order < b.order; });
  if (!ready.empty()) lastAgreed_ = Clock::now();
  return ready;
}

void Negotiation::remember(Agreed& op) {
  if (cache_.size() >= capacity_) return;
  if (op.requests[0].kind == Kind::kJoin) return;
  auto& ids = byName_[op.name];
  for (int id : ids) {
    if (cache_[id].requests == op.requests) {
      op.cacheId = id;
      return;
    }
  }
  op.cacheId = static_cast<int>(cache_.size());
  ids.push_back(op.cacheId);
  Agreed entry;
  entry.name = op.name;
  entry.requests = op.requests;
  cache_.push_back(std::move(entry));
}

// Tensors on a GPU (Request::device): every rank's on a GPU or none's, and only the calls the
// executor runs on device buffers as they are (no padding, no stand-in of a joined rank, no
// alltoall: the library's alltoall takes host memory). The same verdict on every rank.
Status Negotiation::checkDevice(const Agreed& op, const std::string& head, int first) const {
  const Request& r0 = op.requests[first];
  std::vector<int> bad;
  bool anyDevice = false;
  for (int r = first; r < nranks_; ++r) {
    if (op.joined[r]) continue;
    anyDevice = anyDevice || op.requests[r].device != kHostDevice;
    if ((op.requests[r].device == kHostDevice) != (r0.device == kHostDevice)) bad.push_back(r);
  }
  if (!bad.empty()) {
    std::ostringstream s;
    s << "mtxcomm " << head << ": the ranks disagree on where the tensors live: rank " << first
      << " has " << deviceName(r0.device);
    for (int r : bad) s << ", rank " << r << " has " << deviceName(op.requests[r].device);
    s << " (every rank passes GPU tensors, or none does)";
    return {MTXCOMM_INVALID_USAGE, s.str()};
  }
  if (!anyDevice) return {};
  auto refuse = [&](const std::string& why) -> Status {
    return {MTXCOMM_INVALID_ARGUMENT, "mtxcomm " + head + " on GPU tensors: " + why};
  };
  for (int r = 0; r < nranks_; ++r) {
    if (op.joined[r]) {
      return refuse("rank " + std::to_string(r) +
                    " has joined (called join()); join takes host tensors only");
    }
  }
  if (r0.kind == Kind::kAlltoall) return refuse("alltoall takes host tensors only");
  if (r0.kind == Kind::kAllgather || r0.kind == Kind::kReduceScatter) {
    for (size_t t = 0; t < r0.tensors.size(); ++t) {
      const auto& shape = r0.tensors[t].shape;
      if (shape.empty()) continue;  // the scalar check below names it
      bool even = r0.kind == Kind::kAllgather || shape[0] % nranks_ == 0;
      for (int r = 0; r < nranks_ && even && r0.kind == Kind::kAllgather; ++r) {
        even = op.requests[r].tensors.size() > t && !op.requests[r].tensors[t].shape.empty() &&
               op.requests[r].tensors[t].shape[0] == shape[0];
      }
      if (!even) {
        return refuse(std::string(r0.kind == Kind::kAllgather
                                      ? "the ranks' first dimensions differ"
                                      : "the first dimension is not a multiple of the ranks") +
                      " (tensor " + std::to_string(t) +
                      "); on GPU tensors the ranks' blocks must be equal");
      }
    }
  }
  return {};
}

Status Negotiation::check(const Agreed& op) const {
  int first = 0;
  while (first < nranks_ && op.joined[first]) ++first;
  const Request& r0 = op.requests[first];
  const Request& mine = op.requests[rank_];
  const std::string head = std::string(kindName(mine.kind)) + " '" + mine.name + "'";
  auto mismatch = [&](const char* what, auto&& same) -> Status {
    std::vector<int> bad;
    for (int r = first + 1; r < nranks_; ++r) {
      if (!op.joined[r] && !same(op.requests[r])) bad.push_back(r);
    }
    if (bad.empty()) return {};
    std::ostringstream s;
    s << "mtxcomm " << head << ": the ranks disagree on the " << what << ": rank " << first
      << " has " << describeRequest(r0);
    for (int r : bad) s << ", rank " << r << " has " << describeRequest(op.requests[r]);
    return {MTXCOMM_INVALID_USAGE, s.str()};
  };
  Status st = mismatch("collective", [&](const Request& r) { return r.kind == r0.kind; });
  if (!st.ok()) return st;
  st = checkDevice(op, head, first);
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
    if (op.joined[r0.root]) {
      return {MTXCOMM_INVALID_USAGE, "mtxcomm " + head + ": root_rank " + std::to_string(r0.root) +
                                         " has joined (called join()): it has no tensor to "
                                         "broadcast"};
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
  const bool firstMayDiffer = r0.kind == Kind::kAllgather || r0.kind == Kind::kAlltoall;
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
  if (r0.kind == Kind::kAllgather || r0.kind == Kind::kReduceScatter ||
      r0.kind == Kind::kAlltoall) {
    for (const TensorMeta& t : r0.tensors) {
      if (t.shape.empty()) {
        return {MTXCOMM_INVALID_ARGUMENT,
                "mtxcomm " + head + ": the tensor must have at least one dimension (got a scalar)"};
      }
    }
  }
  if (r0.kind == Kind::kAlltoall) return checkSplits(op, head);
  return {};
}

// Every rank's splits against its own dimension 0 (the same verdict on every rank: the table is
// the same). A joined rank has no rows to send or receive, so alltoall waits for no one.
Status Negotiation::checkSplits(const Agreed& op, const std::string& head) const {
  std::vector<int> joined;
  for (int r = 0; r < nranks_; ++r) {
    if (op.joined[r]) joined.push_back(r);
  }
  if (!joined.empty()) {
    return {MTXCOMM_INVALID_USAGE, "mtxcomm " + head + ": " + rankList(joined) +
                                       " called join(); alltoall needs every rank"};
  }
  for (int r = 0; r < nranks_; ++r) {
    const Request& q = op.requests[r];
    const int64_t dim0 = q.tensors[0].shape[0];
    std::ostringstream s;
    s << "mtxcomm " << head << ": rank " << r << " ";
    if (q.splits.empty()) {
      if (dim0 % nranks_ == 0) continue;
      s << "passed no splits, but its dimension 0 (" << dim0
        << ") is not a multiple of the number of ranks (" << nranks_ << ")";
    } else if (q.splits.size() != static_cast<size_t>(nranks_)) {
      s << "passed " << q.splits.size() << " splits for " << nranks_ << " ranks";
    } else {
      int64_t sum = 0;
      bool negative = false;
      for (int64_t v : q.splits) {
        negative = negative || v < 0;
        sum += v < 0 ? 0 : v;
      }
      if (!negative && sum == dim0) continue;
      if (negative) {
        s << "passed a negative split";
      } else {
        s << "passed splits summing to " << sum << ", but its dimension 0 is " << dim0;
      }
    }
    return {MTXCOMM_INVALID_ARGUMENT, s.str()};
  }
  return {};
}

Negotiation::Clock::time_point Negotiation::waiting(const NameQueue& q, std::vector<int>* have,
                                                    std::vector<int>* missing) const {
  Clock::time_point first = Clock::time_point::max();
  bool join = false;
  for (size_t r = 0; r < q.perRank.size(); ++r) {
    if (q.perRank[r].empty()) {
      if (!joined_[r]) missing->push_back(static_cast<int>(r));
    } else {
      have->push_back(static_cast<int>(r));
      first = std::min(first, q.perRank[r].front().arrived);
      join = join || q.perRank[r].front().request.kind == Kind::kJoin;
    }
  }
  // A joined rank waits for the others as long as they work: its join is as old as the last
  // operation agreed, not as its submission (uneven data may keep the others busy for long).
  if (join && first != Clock::time_point::max()) first = std::max(first, lastAgreed_);
  return first;
}

std::vector<std::string> Negotiation::stalled(double seconds) {
  std::vector<std::string> warnings;
  if (seconds <= 0) return warnings;
  const auto now = Clock::now();
  for (auto& kv : table_) {
    NameQueue& q = kv.second;
    if (q.stallWarned) continue;
    std::vector<int> have, missing;
    const Clock::time_point first = waiting(q, &have, &missing);
    if (missing.empty() || have.empty() ||
        std::chrono::duration<double>(now - first).count() < seconds) {
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

Negotiation::Clock::time_point Negotiation::nextStallWarning(double seconds) const {
  Clock::time_point next = Clock::time_point::max();
  if (seconds <= 0) return next;
  const auto after =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (const auto& kv : table_) {
    if (kv.second.stallWarned) continue;
    std::vector<int> have, missing;
    const Clock::time_point first = waiting(kv.second, &have, &missing);
    if (!missing.empty() && !have.empty()) next = std::min(next, first + after);
  }
  return next;
}

std::vector<std::string> Negotiation::stallVerdicts(double seconds, Clock::time_point* next) const {
  std::vector<std::string> names;
  *next = Clock::time_point::max();
  if (seconds <= 0) return names;
  const auto now = Clock::now();
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (const auto& kv : table_) {
    std::vector<int> have, missing;
    const Clock::time_point first = waiting(kv.second, &have, &missing);
    if (missing.empty() || have.empty()) continue;
    if (now - first >= limit) {
      names.push_back(kv.first);
    } else {
      *next = std::min(*next, first + limit);
    }
  }
  return names;
}

}  // namespace mtxcomm::binding
