// Negotiation: how the ranks agree on which requests run, in which order (bindings/common/
// engine.h has the protocol). Every rank keeps the same table, name -> per-rank FIFO of
// requests, fed with every rank's requests of each cycle; the k-th request of a name on one
// rank pairs with the k-th of the same name on every other rank. Pure bookkeeping over agreed
// bytes: no communicator, no framework (unit-testable).
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

// One cycle's message of one rank: a shutdown flag and the requests submitted since the last.
std::vector<char> encodeCycle(bool shutdown, const std::vector<const Request*>& requests);
// Bytes of a message that carries no request (the engine's progress test).
constexpr size_t kEmptyCycleBytes = sizeof(uint8_t) + sizeof(uint32_t);

// A name whose next request every rank has submitted: the request of each rank and the order
// all ranks agree on (the arrival number of its last rank's request).
struct Agreed {
  std::string name;
  std::vector<Request> requests;  // indexed by rank
  uint64_t order = 0;
};

class Negotiation {
 public:
  using Clock = std::chrono::steady_clock;
  Negotiation(int rank, int nranks) : rank_(rank), nranks_(nranks) {}

  // Adds every rank's cycle message (all: nranks messages, stride bytes apart). Returns the
  // ranks whose message asked to shut down. Throws std::runtime_error on a malformed message.
  std::vector<int> ingest(const std::vector<char>& all, size_t stride);
  // Every name ready on all ranks, in the agreed order (a name ready k times appears k times).
  std::vector<Agreed> takeReady();
  // The ranks must agree on everything but what a collective lets differ (the first dimension
  // of an allgather). The message is computed from the agreed table, so it is the same on
  // every rank. INVALID_ARGUMENT naming the tensor and the ranks.
  Status check(const Agreed& op) const;
  // Warnings (once per waiting request) for names some ranks submitted more than seconds ago
  // and others not at all, naming both.
  std::vector<std::string> stalled(double seconds);
  void clear() { table_.clear(); }

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
  int rank_, nranks_;
  std::map<std::string, NameQueue> table_;
  uint64_t nextOrder_ = 0;
};

}  // namespace mtxcomm::binding

#endif  // MTXCOMM_BINDINGS_COMMON_NEGOTIATION_H_
