// The communicator: a transport over its ranks, the configuration, the collective sequence
// number, and the error state (the first error is kept; a failed communicator is poisoned).
// Planning (select), scheduling (algos/) and execution (executor) live in their own units;
// Comm only ties them together for one call.
#ifndef MTXCOMM_LIB_COMM_H_
#define MTXCOMM_LIB_COMM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lib/base/call.h"
#include "lib/base/topology.h"
#include "lib/comm/config.h"
#include "lib/comm/flight_recorder.h"
#include "lib/comm/p2p.h"
#include "lib/comm/select.h"
#include "transports/shm/shm_group.h"
#include "transports/transport.h"

namespace mtxcomm {

namespace gpu {
class DeviceComm;
class HostCollectives;
}  // namespace gpu

class Comm {
 public:
  // context_id is identical on every rank and distinct among communicators sharing channels.
  Comm(std::unique_ptr<Transport> transport, const Config& config, uint64_t contextId);
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Config& config() const { return config_; }
  // Tests and tools may force algorithms per communicator.
  Config& mutableConfig() { return config_; }
  Transport& transport() { return *transport_; }
  const char* transportName() const { return transport_->name(); }
  // How each peer is reached (transports/route/route.h), one line per rank; empty when the
  // communicator was built without a choice (in-process, split).
  const std::vector<std::string>& routes() const { return routes_; }
  void setRoutes(std::vector<std::string> routes) { routes_ = std::move(routes); }

  // Runs one collective as the public API describes it (user-level args: AVG allowed, 16-bit
  // floats not yet widened). Checks arguments first (throws MTXCOMM_INVALID_ARGUMENT, comm stays
  // usable); a communication failure poisons the communicator and is rethrown with rank,
  // collective and algorithm in the message.
  void run(const CollArgs& args);

  // withP2p: the child gets a point-to-point channel (false for the internal levels of the
  // hierarchical algorithms, which carry none).
  std::unique_ptr<Comm> split(int color, int key, bool withP2p = true);
  // The user's point-to-point channel (lib/comm/p2p.h), made at setup; null before setup and
  // on the internal levels. Thread-safe to use once set up.
  P2p* p2p() const { return p2p_.get(); }
  // How long setup took to make the point-to-point view, in seconds (0 without one).
  double p2pSetupSeconds() const { return p2pSetupSeconds_; }
  // Collective, once, before the first collective: agrees on the topology — allgathers every
  // rank's RankSummary (and takes rank 0's cost-model parameters) unless the caller passes the
  // agreed topology (a split passes its parent's restricted to its members; tests pass an
  // emulated one, Topology::forTest) — then, when every rank is on one node and MTXCOMM_SHM is
  // not off, maps a shared-memory segment for the shm algorithms. Throws (on every rank) if
  // the segment cannot be made.
  void setup(const Topology* agreed = nullptr);
  // Collective, once, at init of a world communicator before any other traffic: every rank
  // sends rank 0 its values of the variables marked "must agree" (ConfigVar::mustAgree: shm,
  // slot and segment sizes, forced algorithms, ...), and rank 0 answers every rank with the
  // verdict. Where they differ, throws MTXCOMM_INVALID_USAGE on every rank naming each
  // variable, its values and the ranks that hold them.
  void agreeConfig();
  bool hasShm() const { return shm_ != nullptr; }
  // This rank's index among the ranks on its node, and their number (from the agreed
  // topology; 0 and 1 before setup).
  int localRank() const { return topo_.empty() ? 0 : topo_.localRank(rank()); }
  int localSize() const { return topo_.empty() ? 1 : topo_.localSize(rank()); }
  const Topology& topology() const { return topo_; }
  // The shared-memory slot in bytes (MTXCOMM_SHM_SLOT_BYTES, or the auto value), after setup.
  size_t shmSlotBytes() const { return shmSlotBytes_; }
  // The node-local level of the hierarchical algorithms, once built (null before).
  const Comm* localLevel() const { return local_.get(); }
  void abort();
  // The flight recorder's name for this communicator, the same on every rank ("world", a
  // split "world.split2.color1"); set before setup.
  void setName(std::string name) { name_ = std::move(name); }
  const std::string& name() const { return name_; }
  // The name the flight recorder gives this rank's next collective (a framework's tensor
  // names; cut to 63 bytes). The thread that makes the calls.
  void setNextCallLabel(const char* label);
  // Writes the flight records of this process (lib/comm/flight_recorder.h) with reason, and
  // asks this communicator's peers on the node to write theirs (SIGUSR1, where their process
  // dumps on it). Returns the folder, "" when none was written.
  std::string dumpFlightRecords(const std::string& reason);
  // The error the flight records of this communicator carry from now on (a stall error).
  void noteFlightRecordError(const std::string& error) {
    if (recorder_) recorder_->setError(error);
  }
  // Before destroy, with no call in flight: runs the checks of earlier calls still pending
  // (ShmGroup::checkDeferredAtDestroy: a broadcast returns before its peers have entered it),
  // here and on the node-local level. A disagreement throws MTXCOMM_INVALID_USAGE with the
  // message the next call would have given, the peers are told as a failed call tells them,
  // and the communicator is poisoned. Nothing on a poisoned communicator or without shm.
  void checkPendingAtDestroy();
  // Thread-safe: makes the call another thread is blocked in (and every later one) end
  // promptly with MTXCOMM_INVALID_USAGE naming reason (lib/base/cancel.h). The C API's abort
  // and destroy use it on a communicator with a call in flight.
  void cancel(const std::string& reason);
  // The levels of a hierarchical communicator share its token.
  void shareCancelToken(CancelTokenPtr token);

  // Notifications between the ranks' progress engines (the C API's mtxcomm_comm_notify and
  // friends, transports/shm/shm_group.h): over the shared-memory segment; null without one.
  ShmGroup* notifier() const { return shm_.get(); }
  // This rank's share of its node's cores (lib/comm/placement.h); set by the bootstrap.
  int cpuShare() const { return cpuShare_; }
  void setCpuShare(int share) { cpuShare_ = share; }

  // Name of the algorithm the last collective used ("local" for one rank or count 0).
  std::string lastAlgorithm() const { return lastAlgorithmName(); }
  const char* lastAlgorithmName() const { return lastAlgorithm_.load(std::memory_order_relaxed); }
  // The cost model's predicted seconds for the last collective's algorithm (0 for "local").
  double lastPredictedSeconds() const { return lastPredicted_; }
  // Where the C API keeps the last error message of this communicator.
  std::string& lastError() { return lastError_; }
  bool poisoned() const { return !firstError_.empty(); }

 private:
  class CommLevels;
  class HostSide;

  void checkUsable(const char* what) const;
  // True when the algorithm applied args.avgDivisor itself (Algorithm::averages).
  bool runAlgorithm(const CollArgs& args);
  // A call on device buffers (gpu/device.h); its own error handling, like runAlgorithm's.
  void runOnDevice(const CollArgs& args);
  // A communication failure of a call: poisons the communicator, tells the peers, and throws
  // e's code with "rank r of n: collective (what): e".
  [[noreturn]] void failCall(const CollArgs& args, const std::string& what, const Error& e);
  void poison(const std::string& message);
  void agreeTopology();
  // An allgather of `bytes` per rank during setup, before any segment exists, with the
  // automatic algorithm (a forced MTXCOMM_ALLGATHER_ALGO is for the caller's allgathers).
  void allgatherAtSetup(const void* mine, size_t bytes, void* all);
  // Tells the peers (and the levels' peers) that this rank left: transports and segments.
  void abortWith(const std::string& reason, mtxcomm_result_t code = MTXCOMM_REMOTE_ERROR);
  // The node-local and cross-node sub-communicators, built at the first hierarchical call.
  void ensureLevels();
  // setup's last step: the point-to-point view of the transport (collective under MPI).
  // The shared-memory segment of the collectives where every rank is on this node and shm is
  // not off (split: the topology was given, agreed by the parent).
  void makeShm(bool split);
  // The user's point-to-point channel: over rings of its own where the communicator has a
  // shared-memory segment (transports/shm/shm_p2p.h), else over a view of the transport.
  void makeP2p();

  // First: the transport and the segment keep a pointer into it until they are gone.
  std::unique_ptr<FlightRecorder> recorder_;  // null with MTXCOMM_FLIGHT_RECORDER=0
  std::string name_ = "world";
  FlightRecorder::Label nextLabel_ = {};
  bool rejected_ = false;  // the call in progress was rejected by this rank (its arguments)
  // run() past the recorder: the call itself, whose signature run() made once.
  void runCall(const CollArgs& user, const char* coll, const CallSignature& signature);
  std::unique_ptr<Transport> transport_;
  int rank_, size_;  // the transport's, kept: asked on every call
  CancelTokenPtr cancel_;
  std::unique_ptr<ShmGroup> shm_;
  std::unique_ptr<gpu::HostCollectives> host_;  // this communicator, for the device paths
  std::unique_ptr<gpu::DeviceComm> device_;     // made by the first call on device buffers
  Topology topo_;
  // The shm slot: MTXCOMM_SHM_SLOT_BYTES, or where it is auto defaultShmSlotBytes of the agreed
  // topology (so every rank has the same value); set by setup().
  size_t shmSlotBytes_ = 256 << 10;
  bool setUp_ = false;
  bool withP2p_ = true;
  double p2pSetupSeconds_ = 0.0;
  std::unique_ptr<P2p> p2p_;     // after transport_: stopped before the transport goes
  std::unique_ptr<Comm> local_;  // this rank's node (hierarchical algorithms), or null
  std::unique_ptr<Comm> cross_;  // the ranks with this rank's local index, one per node
  Config config_;
  uint64_t contextId_;
  uint64_t seq_ = 0;     // collectives issued on this communicator (same on every rank)
  uint64_t splits_ = 0;  // splits issued (same on every rank)
  std::vector<std::string> routes_;
  int cpuShare_ = 1;
  // An Algorithm's name, a device path's or "local" (static strings); atomic: the C API's
  // mtxcomm_comm_last_algorithm may read it while another thread runs a call.
  std::atomic<const char*> lastAlgorithm_{""};
  double lastPredicted_ = 0.0;
  // The last selection per collective and the arguments it was made for (selectCached): a
  // loop of calls of one shape selects once. Selection reads only these fields of the call
  // and this communicator's fixed configuration.
  // The fields of a call that its selection depends on.
  struct SelectionShape {
    mtxcomm_op_t op = MTXCOMM_SUM;
    mtxcomm_datatype_t dtype = MTXCOMM_FLOAT32;
    size_t count = 0, elemSize = 0;
    int root = 0;
    bool vcounts = false;
    static SelectionShape of(const CollArgs& a) {
      return {a.op, a.dtype, a.count, a.elemSize, a.root, a.vcounts};
    }
    bool operator==(const SelectionShape& o) const {
      return op == o.op && dtype == o.dtype && count == o.count && elemSize == o.elemSize &&
             root == o.root && vcounts == o.vcounts;
    }
  };
  struct CachedSelection {
    bool valid = false;
    SelectionShape shape;
    Selection sel;
  };
  CachedSelection selections_[kNumCollectives];
  const Selection& selectCached(const CollArgs& args, const CommInfo& info);
  std::string firstError_;
  std::string lastError_;
  CallSignature currentCall_;  // the signature of the call in progress (its user arguments)
};

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_H_
