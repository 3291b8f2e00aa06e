// Negotiation: how the ranks agree on which requests run, in which order (engine.h has the
// protocol). Every rank keeps the same table, name -> per-rank FIFO of requests, fed with every
// rank's message of each cycle; the k-th request of a name on one rank pairs with the k-th of
// the same name on every other rank. A name is ready when every rank that has not joined has a
// request for it; ready names run in the order their last request arrived (the same on every
// rank).
//
// The response cache (Horovod's idea, Sergeev & Del Balso 2018, "response cache"): every agreed
// operation that passed its checks is remembered under a small id, in the same order on every
// rank (the table is identical), up to MTXCOMM_CACHE_CAPACITY entries. A rank that submits the
// same request again (name, kind, op, root, dtypes and shapes all equal to its own request of
// that entry) sends only the id's bit. A steady-state training step therefore exchanges one
// small fixed-size slot per rank: a header and a bit vector (one bit per cache entry).
//
// Wire format of one rank's slot (host byte order, all ranks run the same build):
//   u32 magic, u8 flags (1 shutdown), u8 pad[3], u32 extraBytes, u32 cacheSize
//   bit vector of cacheSize bits (ceil(cacheSize / 64) u64 words)
//   inline area (kInlineBytes): the extras when extraBytes <= kInlineBytes
// where the extras are: u32 count, that many full requests (request.h), u32 count, that many
// names cancelled by the stall timeout (rank 0 only). When some rank's extras do not fit, a
// second exchange carries every rank's extras, padded to the longest.
//
// Pure bookkeeping over agreed bytes: no communicator, no framework (unit-tested in
// tests/test_engine.cc).
#ifndef MTXCOMM_BINDINGS_COMMON_NEGOTIATION_H_
#define MTXCOMM_BINDINGS_COMMON_NEGOTIATION_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "bindings/common/request.h"

namespace mtxcomm::binding {

// What one rank says in one cycle.
struct CycleMessage {
  bool shutdown = false;
  std::vector<uint32_t> cached;        // requests sent as their cache id, ascending
  std::vector<Request> requests;       // the others, in full, in submission order
  std::vector<std::string> cancelled;  // rank 0: names failed by the stall timeout
};

// A name whose next request every active rank has submitted: each rank's request (for a rank
// that has joined, a stand-in: the request of the lowest active rank, with zero rows for an
// allgather), which ranks stood in, and the order all ranks agree on.
struct Agreed {
  std::string name;
  std::vector<Request> requests;  // indexed by rank
  std::vector<bool> joined;       // indexed by rank: the rank had joined, requests[r] is a stand-in
  std::vector<double> arrivalUs;  // indexed by rank: when its request was ingested (this rank's
                                  // clock, us since start)
  uint64_t order = 0;
  int cacheId = -1;     // its response-cache entry, once remembered
  int lastJoined = -1;  // join: the last rank to join
};

// A request failed by the stall timeout: the ranks that submitted it get the message.
struct Cancelled {
  std::string name;
  std::vector<int> ranks;  // the ranks whose request is failed
  std::string message;
};

class Negotiation {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kInlineBytes = 512;
  static constexpr size_t kHeaderBytes = 16;

  Negotiation(int rank, int nranks, int cacheCapacity);

  // The cache id of this rank's request r, or -1.
  int cachedId(const Request& r) const;
  // Bytes of every rank's slot in the next cycle (the cache size is agreed).
  size_t slotBytes() const;
  // Writes msg into slot (slotBytes() bytes); returns the extras that did not fit inline
  // (empty when they did) for the second exchange.
  std::vector<char> encode(const CycleMessage& msg, char* slot) const;
  // True when some rank's slot says its extras come in the second exchange; *longest: the
  // stride of that exchange. all: nranks slots of slotBytes().
  bool needsSecondExchange(const std::vector<char>& all, size_t* longest) const;
  // Decodes every rank's slot (and the second exchange, stride bytes a rank, or empty) into
  // the table. Returns the ranks whose message asked to shut down and, through *cancelled,
  // the requests rank 0's stall verdicts failed. Throws std::runtime_error on a malformed
  // message.
  std::vector<int> ingest(const std::vector<char>& all, const std::vector<char>& extras,
                          size_t stride, std::vector<Cancelled>* cancelled);

  // Every name ready on all active ranks, in the agreed order (a name ready k times appears k
  // times). A join of every rank completes here (Agreed.kind kJoin, lastJoined set) and ends
  // the joined state.
  std::vector<Agreed> takeReady();
  // The ranks must agree on everything but what a collective lets differ (the first dimension
  // of an allgather or alltoall, the alltoall splits). The message is computed from the agreed
  // table, so it is the same on every rank: MTXCOMM_INVALID_USAGE naming the tensor and the
  // ranks when ranks disagree (kind, op, root, dtypes, shapes), MTXCOMM_INVALID_ARGUMENT for a
  // request that is wrong in itself (a root out of range, a scalar to gather or scatter, alltoall
  // splits that do not add up to dimension 0).
  Status check(const Agreed& op) const;
  // Adds an agreed, checked operation to the response cache (every rank, same order).
  void remember(Agreed& op);

  // Warnings (once per waiting request) for names some ranks submitted more than seconds ago
  // and others not at all, naming both.
  std::vector<std::string> stalled(double seconds);
  // When the next of those warnings falls due (time_point::max() when none can).
  Clock::time_point nextStallWarning(double seconds) const;
  // Rank 0: the names whose oldest request has waited longer than seconds for some active
  // rank (to be cancelled through its next message); *next: when the next one will be due.
  std::vector<std::string> stallVerdicts(double seconds, Clock::time_point* next) const;
  // Requests still waiting for other ranks.
  bool pending() const { return !table_.empty(); }
  bool joined(int r) const { return joined_[r]; }
  int cacheSize() const { return static_cast<int>(cache_.size()); }
  void clear() { table_.clear(); }
  // The time origin of Agreed.arrivalUs.
  Clock::time_point start() const { return start_; }

 private:
  struct NameQueue {
    struct Item {
      Request request;
      uint64_t order;  // global arrival number, the same on every rank
      Clock::time_point arrived;
    };
    std::vector<std::deque<Item>> perRank;
    bool stallWarned = false;
  };
  Clock::time_point lastAgreed_{};  // when takeReady last made an operation ready
  void add(int r, Request req, Clock::time_point now);
  // check's verdict on Request::device (negotiation.cc).
  Status checkDevice(const Agreed& op, const std::string& head, int first) const;
  Status checkSplits(const Agreed& op, const std::string& head) const;
  bool ready(const NameQueue& q) const;
  // The ranks that have a request of q waiting and the active ranks that have none; the
  // arrival of the oldest waiting request (time_point::max() when none waits).
  Clock::time_point waiting(const NameQueue& q, std::vector<int>* have,
                            std::vector<int>* missing) const;

  int rank_, nranks_;
  size_t capacity_;
  std::map<std::string, NameQueue> table_;
  uint64_t nextOrder_ = 0;
  std::vector<bool> joined_;
  std::vector<Agreed> cache_;                       // id -> the agreed operation
  std::map<std::string, std::vector<int>> byName_;  // name -> cache ids
  Clock::time_point start_ = Clock::now();
};

}  // namespace mtxcomm::binding

#endif  // MTXCOMM_BINDINGS_COMMON_NEGOTIATION_H_
