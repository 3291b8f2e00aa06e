// The Engine class behind engine.h's functions, for the engine's two units: engine.cc (the
// thread: init and shutdown, submissions, sleeping and waking, a submitter's inline cycle) and
// engine_cycle.cc (one cycle: the exchange of requests, running what is ready, stalls).
#ifndef MTXCOMM_BINDINGS_COMMON_ENGINE_INTERNAL_H_
#define MTXCOMM_BINDINGS_COMMON_ENGINE_INTERNAL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "bindings/common/entry.h"
#include "bindings/common/executor.h"
#include "bindings/common/negotiation.h"
#include "bindings/common/timeline.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm::binding {

using Clock = std::chrono::steady_clock;

// A WARN line on stderr naming this host, process and rank.
void warn(int rank, const std::string& msg);

class Engine {
 public:
  Status init();
  Status shutdown();
  bool running() {
    std::lock_guard<std::mutex> lk(mu_);
    return thread_.joinable() && !stopped_;
  }
  void enqueue(Entry e);
  uint64_t collectives() {
    std::lock_guard<std::mutex> lk(mu_);
    return (executor_ ? executor_->collectives() : 0) + collectivesBefore_;
  }
  std::atomic<uint64_t> inlineCycles{0};  // cycles a submitting thread ran (runInline)

  std::atomic<int> rank{-1}, size{-1}, localRank{-1}, localSize{-1}, cpuShare{-1};
  // The world communicator while the engine runs (null otherwise), for the calls a framework
  // makes on it beside the engine: point-to-point (thread-safe on any communicator).
  std::atomic<mtxcomm_comm_t> worldComm{nullptr};

 private:
  void loop();
  // Sleeps until this rank has work, a peer asks for the next cycle, or a timer is due.
  void waitForWork();
  // One cycle, with cycleMu_ held: of the requests submitted since the last (or of `taken`, the
  // ones a submitter took). false: the engine stops.
  bool cycle(std::vector<Entry>* taken = nullptr);
  // A small request runs its cycle on the submitting thread (Entry::mayRunInline) when no peer
  // will keep it waiting there: in a world of one rank, or when every peer has entered the next
  // cycle (at once, or within the collectives' spin after this rank asked them to). That saves
  // the hand-over to the engine's thread and the completion from another thread, on both sides
  // of a pair of ranks that submit within the spin of each other. false: the engine's thread
  // must run it.
  bool runInline();
  // A peer asked for a cycle and this rank has nothing pending: such a cycle can make nothing
  // ready (every request needs this rank's copy), so wait up to MTXCOMM_CYCLE_TIME (at most
  // 1 ms) for this rank's own submission and bring it to the same cycle. A rank that arrives late
  // by less than that pays one exchange, not two (an empty one, then its own), and its compute is
  // not interrupted for the empty one. The peer waits in the exchange meanwhile (spinning, then on
  // a futex), which it would do for this rank's request anyway. Called with mu_ held.
  void lingerForOwnWork(std::unique_lock<std::mutex>& lk);
  bool exchange(const CycleMessage& msg, std::vector<int>* shutdownRanks,
                std::vector<Cancelled>* cancelled);
  void execute(std::vector<ReadyOp>& ready);
  void finishJoin(ReadyOp& op);
  Status libraryStatus(mtxcomm_result_t rc, const std::string& what) const;
  void failAll(const Status& st);
  Status failureOf(const Request& r) const;
  bool stopped() {
    std::lock_guard<std::mutex> lk(mu_);
    return stopped_;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> submitted_;  // guarded by mu_
  // Names of this rank's requests submitted and not yet done (guarded by mu_).
  std::unordered_set<std::string> inFlight_;
  bool shutdownRequested_ = false;
  // What destroying the communicator returned (a check an earlier call left pending that found
  // the ranks disagreeing): shutdown returns it once.
  Status destroyStatus_;
  bool stopped_ = false;
  Status failure_;  // guarded by mu_: set when the engine stopped for good
  std::thread thread_;
  std::unique_ptr<OpExecutor> executor_;           // guarded by mu_ (made and replaced by init)
  uint64_t collectivesBefore_ = 0;                 // run by the executors of earlier inits
  std::atomic<mtxcomm_comm_t> wakeComm_{nullptr};  // for enqueue's wakeup, while running

  // Engine-thread state.
  mtxcomm_comm_t comm_ = nullptr;
  bool notifies_ = false;     // the communicator carries notifications (one node, shm)
  bool peerTrouble_ = false;  // the idle wait found a peer dead or aborted: exchange at once
  bool idle_ = false;         // what this rank last told the peers (mtxcomm_comm_set_idle)
  std::unique_ptr<Negotiation> negotiation_;
  std::unique_ptr<Timeline> timeline_;
  std::map<std::string, std::deque<Entry>> local_;  // this rank's entries per name, FIFO
  uint64_t cycles_ = 0;                             // cycles run (the same on every rank)
  // Serialises cycles: the engine's thread, or a submitter (runInline). What a cycle uses is
  // guarded by it (the engine's idle wait too takes it to look); progress_ is read without.
  std::mutex cycleMu_;
  std::atomic<bool> progress_{false};  // polling mode: the last cycle carried something
  double cycleSeconds_ = 0.001;
  double stallWarnSeconds_ = 60;
  double stallTimeoutSeconds_ = 300;
  Clock::time_point nextStallCheck_ = Clock::time_point::max();
  // When the next MTXCOMM_STALL_WARNING falls due (every rank warns from its own table).
  Clock::time_point nextStallWarning_ = Clock::time_point::max();
  void warnStalled();
};

}  // namespace mtxcomm::binding

#endif  // MTXCOMM_BINDINGS_COMMON_ENGINE_INTERNAL_H_
