// The communicator (comm.h): one call through checks, selection and execution; split and the
// hierarchical levels; the error state, abort and cancel. Its setup at init (the agreements and
// the shared-memory segment) is comm_setup.cc.
#include "lib/comm/comm.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "algos/executor.h"
#include "algos/registry.h"
#include "algos/schedule.h"
#include "gpu/device.h"
#include "lib/base/dtype.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/reduce.h"
#include "lib/base/topology.h"
#include "lib/comm/call_args.h"
#include "lib/comm/select.h"

namespace mtxcomm {

Comm::Comm(std::unique_ptr<Transport> transport, const Config& config, uint64_t contextId)
    : transport_(std::move(transport)),
      rank_(transport_->rank()),
      size_(transport_->size()),
      cancel_(std::make_shared<CancelToken>()),
      config_(config),
      contextId_(contextId) {
  transport_->setCancelToken(cancel_);
}

void Comm::cancel(const std::string& reason) {
  cancel_->cancel(strCat("rank ", rank(), ": ", reason));
  if (shm_) shm_->wakeup();  // a thread asleep in waitNotify sees the cancellation now
}

void Comm::shareCancelToken(CancelTokenPtr token) {
  cancel_ = std::move(token);
  transport_->setCancelToken(cancel_);
  if (shm_) shm_->setCancelToken(cancel_);
}

Comm::~Comm() {
  p2p_.reset();  // its thread uses the transport's view
  if (recorder_) unregisterFlightRecorder(recorder_.get());
}

void Comm::setNextCallLabel(const char* label) {
  const size_t n = label ? std::min(std::strlen(label), sizeof(nextLabel_) - 1) : 0;
  if (n) std::memcpy(nextLabel_, label, n);
  nextLabel_[n] = '\0';
}

std::string Comm::dumpFlightRecords(const std::string& reason) {
  const std::string dir = dumpFlightRecorders(reason);
  if (shm_) shm_->askPeersToDump();
  for (Comm* level : {local_.get(), cross_.get()}) {
    if (level && level->shm_) level->shm_->askPeersToDump();
  }
  return dir;
}

void Comm::checkUsable(const char* what) const {
  if (poisoned()) {
    fail(MTXCOMM_INVALID_USAGE, "rank ", rank(), ": ", what,
         " on a communicator failed by an earlier error (abort or destroy it and build a new "
         "one); the first error was: ",
         firstError_);
  }
}

void Comm::poison(const std::string& message) {
  if (firstError_.empty()) firstError_ = message;
}

void Comm::run(const CollArgs& user) {
  const char* coll = callName(user);
  checkUsable(coll);
  // Every call counts, also one rejected below: if only some ranks reject it, their next call
  // carries a different sequence number than the others' current one, so the ranks never pair
  // different calls (the sequence is in the message tag and in the shm call signature).
  ++seq_;
  const CallSignature call = callSignature(user, seq_);
  if (!recorder_) {
    runCall(user, coll, call);
    return;
  }
  recorder_->enter(call, nextLabel_);
  nextLabel_[0] = '\0';
  rejected_ = false;
  try {
    runCall(user, coll, call);
  } catch (...) {
    recorder_->end(rejected_ ? FlightRecorder::State::kRejected : FlightRecorder::State::kFailed);
    throw;
  }
  recorder_->end(FlightRecorder::State::kDone);
}

void Comm::runCall(const CollArgs& user, const char* coll, const CallSignature& signature) {
  const int n = size(), me = rank();
  bool onDevice = false;
  try {
    checkArgs(user, me, n);
    onDevice = gpu::isDeviceCall(user, me);
    if (onDevice && user.coll == Collective::kAlltoall) {
      fail(MTXCOMM_UNSUPPORTED, "device buffers are not supported by alltoall (host buffers only)");
    }
    if (onDevice && collectiveReduces(user.coll) && user.op == MTXCOMM_ADASUM) {
      fail(MTXCOMM_UNSUPPORTED, "op adasum is not supported on device buffers (host buffers only)");
    }
  } catch (const Error& e) {
    rejected_ = true;
    // Peers waiting for this rank in this call learn at once that it rejected it.
    if (shm_) shm_->enterCall(signature, e.what());
    throw Error(e.code(), strCat("rank ", me, ": ", coll, ": ", e.what()));
  }
  currentCall_ = signature;
  if (shm_) {
    // Entering also runs the checks an earlier broadcast deferred (ShmGroup::deferCheck): a
    // disagreement found there fails this call before it moves a byte.
    try {
      shm_->enterCall(currentCall_);
    } catch (const Error& e) {
      failCall(user, "transport shm", e);
    }
  }
  if (onDevice) {
    runOnDevice(user);
    return;
  }
  // One rank, or nothing to move: a local copy keeps the out-of-place contract. An alltoallv
  // has no common count: only one rank is local.
  const bool nothing = user.count == 0 && user.coll != Collective::kBarrier && !user.isAlltoallv();
  if (n == 1 || nothing) {
    lastAlgorithm_.store("local", std::memory_order_relaxed);
    lastPredicted_ = 0.0;
    if (n > 1 && shm_) {
      // Nothing moves, but over shared memory the ranks still compare the call: a rank passing
      // count 0 where the others pass 4 fails with them, not one call later.
      try {
        shm_->setTimeout(config_.timeoutSeconds);
        shm_->awaitArrivals(coll);
      } catch (const Error& e) {
        failCall(user, "no data, transport shm", e);
      }
      return;
    }
    const size_t es = datatypeSize(user.dtype);
    if (user.isAlltoallv()) {
      if (user.sendcounts[0] > 0) {
        std::memmove(static_cast<char*>(user.recvbuf) + user.rdispls[0] * es,
                     static_cast<const char*>(user.sendbuf) + user.sdispls[0] * es,
                     user.sendcounts[0] * es);
      }
    } else if (user.count > 0 && user.recvbuf && user.sendbuf) {
      std::memmove(user.recvbuf, user.sendbuf, user.count * es);
      // A one-rank bool reduction still writes 0/1 (x OR x), as a reduction over ranks does.
      if (collectiveReduces(user.coll) && isBoolType(user.dtype)) {
        reduceBuffers(MTXCOMM_BOOL, MTXCOMM_MAX, user.recvbuf, user.recvbuf, user.recvbuf,
                      user.count);
      }
    }
    return;
  }
  AlgorithmCall call(user, me, n);
  const bool averaged = runAlgorithm(call.args());
  call.finish(averaged);
}

// The two levels of this communicator, for a hierarchical algorithm.
class Comm::CommLevels : public Levels {
 public:
  CommLevels(Comm& local, Comm& cross) : local_(local), cross_(cross) {}
  void runLocal(const CollArgs& args) override { local_.run(args); }
  void runCross(const CollArgs& args) override { cross_.run(args); }

 private:
  Comm& local_;
  Comm& cross_;
};

const Selection& Comm::selectCached(const CollArgs& args, const CommInfo& info) {
  CachedSelection& c = selections_[static_cast<int>(args.coll)];
  // Every call's choice is logged at DEBUG: then each call selects anew.
  const SelectionShape shape = SelectionShape::of(args);
  if (c.valid && c.shape == shape && !logEnabled(LogLevel::kDebug)) return c.sel;
  c.valid = false;  // (selectAlgorithm may throw)
  c.sel = selectAlgorithm(args, info, config_.algorithmFor(args.coll), rank());
  c.shape = shape;
  c.valid = true;
  return c.sel;
}

bool Comm::runAlgorithm(const CollArgs& args) {
  const int n = size(), me = rank();
  CommInfo info;
  info.nranks = n;
  info.shm = shm_.get();
  info.topo = topo_.empty() ? nullptr : &topo_;
  info.cost = &config_.cost;
  info.segmentBytes = config_.segmentBytes;
  info.shmSlotBytes = shmSlotBytes_;
  info.shmReductionChunkBytes = shm_ ? shm_->reductionChunkBytes() : shmSlotBytes_;
  // Copied out: a composition's own collectives on this communicator select again.
  const Selection& selected = selectCached(args, info);
  const Algorithm& algo = *selected.algorithm;
  const double predicted = selected.predicted;
  lastAlgorithm_.store(algo.name, std::memory_order_relaxed);
  if (recorder_) {
    recorder_->setPath(algo.name, algo.run ? "shm" : algo.compose ? "levels" : transport_->name());
  }
  lastPredicted_ = predicted;
  // Idle peers a notify left asleep are woken by this group's waits only (ShmGroup::setIdle).
  if (shm_ && !algo.run) shm_->payOwedWakes();
  try {
    if (algo.compose) {
      // Building the levels and running on them issues collectives on this communicator and
      // its sub-communicators; every rank does the same, so they stay in step.
      ensureLevels();
      CommLevels levels(*local_, *cross_);
      algo.compose(args, topo_, me, levels);
      lastAlgorithm_.store(algo.name, std::memory_order_relaxed);
      lastPredicted_ = predicted;
      return false;
    }
    if (algo.run) {
      shm_->setTimeout(config_.timeoutSeconds);  // the call's signature: enterCall, in run()
      algo.run(args, *shm_);
      return algo.averages && args.avgDivisor > 0;
    }
    Schedule schedule(args.dtype, args.elemSize, args.op);
    AlgoParams params;
    params.segmentBytes = config_.segmentBytes;
    algo.build(args, me, n, params, schedule);
    if (logEnabled(LogLevel::kTrace)) {
      MTXCOMM_LOG(kTrace, me, collectiveName(args.coll), " ", algo.name, " schedule:\n",
                  schedule.toString());
    }
    executeSchedule(schedule, *transport_, messageTag(currentCall_, Transport::kMaxTag),
                    config_.timeoutSeconds);
    return false;
  } catch (const Error& e) {
    const char* via = algo.run       ? "shm"
                      : algo.compose ? "node-local and cross-node sub-communicators"
                                     : transport_->name();
    failCall(args,
             strCat("algorithm ", algo.name, ", ",
                    args.isAlltoallv() ? std::string("per-peer counts") : strCat(args.count), " x ",
                    datatypeName(args.dtype), ", transport ", via),
             e);
  }
  return false;
}

// The communicator's host collectives, as the device paths see them.
class Comm::HostSide : public gpu::HostCollectives {
 public:
  explicit HostSide(Comm& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void run(const CollArgs& args) override { comm_.run(args); }

 private:
  Comm& comm_;
};

void Comm::runOnDevice(const CollArgs& args) {
  try {
    if (!device_) {
      host_ = std::make_unique<HostSide>(*this);
      gpu::DeviceOptions options;
      options.cudaIpcBytes = config_.cudaIpcBytes;
      options.cudaStagingBytes = config_.cudaStagingBytes;
      device_ = gpu::DeviceComm::create(*host_, args, options);
    }
    if (device_->runLocal(args)) {
      lastAlgorithm_.store("local", std::memory_order_relaxed);
      return;
    }
    const Selection sel = selectDevicePath(args, device_->topology(), config_.cudaPath, rank());
    device_->run(args, sel.devicePath);
    lastAlgorithm_.store(gpu::devicePathName(sel.devicePath), std::memory_order_relaxed);
  } catch (const Error& e) {
    const std::string what =
        strCat("device buffers, ", args.count, " x ", datatypeName(args.dtype));
    // Refused before any byte moved (a buffer on another device, a forced path that cannot
    // take the call): the communicator stays usable, as for any invalid argument.
    if (e.code() == MTXCOMM_INVALID_ARGUMENT || e.code() == MTXCOMM_UNSUPPORTED) {
      throw Error(e.code(), strCat("rank ", rank(), " of ", size(), ": ", collectiveName(args.coll),
                                   " (", what, "): ", e.what()));
    }
    failCall(args, what, e);
  }
}

void Comm::failCall(const CollArgs& args, const std::string& what, const Error& e) {
  const int n = size(), me = rank();
  std::string msg =
      strCat("rank ", me, " of ", n, ": ", callName(args), " (", what, "): ", e.what());
  if (e.code() == MTXCOMM_TIMEOUT && !shm_) {
    // Over a transport the call is in the messages' tags only (lib/base/call.h, messageTag).
    msg +=
        " (a peer slower than MTXCOMM_TIMEOUT, or ranks that disagree on this call: count, "
        "datatype, op or root)";
  }
  poison(msg);
  MTXCOMM_LOG(kError, me, msg);
  if (recorder_) {
    // The state of every call of this process at the fault, before this rank leaves the call,
    // and the node's peers asked for theirs.
    recorder_->end(FlightRecorder::State::kFailed);
    recorder_->setError(msg);
    const std::string dir = dumpFlightRecords(msg);
    if (!dir.empty()) {
      MTXCOMM_LOG(kError, me, "flight recorder written to ", dir, ": mtxcomm_info --why-stuck ",
                  dir, " tells which rank the job waits for");
    }
  }
  // Tell the peers this rank has left the collective, so that those waiting on it fail now
  // (naming this rank and, where the transport carries it, this error) instead of timing out.
  // A call cancelled by a destroy or abort on another thread is a remote error to the peers,
  // not a disagreement (the only invalid usage they pass on).
  abortWith(msg, cancel_->cancelled() ? MTXCOMM_REMOTE_ERROR : e.code());
  throw Error(e.code(), msg);
}

void Comm::abortWith(const std::string& reason, mtxcomm_result_t code) {
  // Pending point-to-point operations fail, and peers waiting on this rank's messages learn.
  if (p2p_) p2p_->failChannel(code, reason, /*tellPeers=*/true);
  transport_->abort(reason);
  if (shm_) shm_->abort(reason, code);
  for (Comm* level : {local_.get(), cross_.get()}) {
    if (level) {
      level->poison(reason);
      level->abortWith(reason, code);
    }
  }
}

void Comm::ensureLevels() {
  if (local_) return;
  const int me = rank();
  const int node = topo_.nodeOf(me), localRank = topo_.localRank(me);
  std::unique_ptr<Comm> local = split(node, localRank, /*withP2p=*/false);
  std::unique_ptr<Comm> cross = split(localRank, node, /*withP2p=*/false);
  // A level runs flat algorithms: "hierarchical" forced for this communicator means the
  // composition, not the levels' own choice.
  for (Comm* level : {local.get(), cross.get()}) {
    for (std::string& algo : level->config_.algo) {
      if (algo == "hierarchical") algo = "auto";
    }
  }
  // A node-local peer that is itself stuck on the network (a link down, a node gone) must fail
  // first, at the cross-node level, and take its node-local peers down with it (abortWith), so
  // that every rank's error names the unreachable peer; the node-local level therefore waits
  // half as long again before it gives up on its own. (A dead node-local process is noticed
  // within ~0.1 s either way, by liveness.)
  local->config_.timeoutSeconds = std::min(config_.timeoutSeconds * 1.5, 31536000.0);
  local_ = std::move(local);
  cross_ = std::move(cross);
  // A cancel of this communicator ends calls blocked in its levels too.
  local_->shareCancelToken(cancel_);
  cross_->shareCancelToken(cancel_);
  MTXCOMM_LOG(kDebug, me, "hierarchical levels: node ", node, " (", local_->size(),
              " ranks, local rank ", localRank, "), cross-node communicator of local index ",
              localRank, " (", cross_->size(), " nodes)");
}

std::unique_ptr<Comm> Comm::split(int color, int key, bool withP2p) {
  checkUsable("split");
  const int n = size(), me = rank();
  // Allgather (color, key) over this communicator.
  std::vector<int32_t> mine = {color < 0 ? -1 : color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(n));
  CollArgs ag;
  ag.coll = Collective::kAllgather;
  ag.sendbuf = mine.data();
  ag.recvbuf = all.data();
  ag.count = 2;
  ag.dtype = MTXCOMM_INT32;
  run(ag);
  const uint64_t splitIndex = ++splits_;
  if (color < 0) return nullptr;
  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  // A context id every member computes alike, distinct from the parent's and its siblings'.
  uint64_t ctx = contextId_ * 0x9E3779B97F4A7C15ull + splitIndex * 0x100000001B3ull +
                 static_cast<uint64_t>(color) + 1;
  ctx ^= ctx >> 29;
  std::unique_ptr<Transport> child;
  try {
    child = transport_->split(members, ctx);
  } catch (const Error& e) {
    std::string msg = strCat("rank ", me, ": split (color ", color, "): ", e.what());
    poison(msg);
    throw Error(e.code(), msg);
  }
  auto comm = std::make_unique<Comm>(std::move(child), config_, ctx);
  comm->setName(strCat(name_, ".split", splitIndex, ".color", color));
  comm->withP2p_ = withP2p;
  if (topo_.empty()) {
    comm->setup();
  } else {
    const Topology sub = topo_.subset(members);
    comm->setup(&sub);
  }
  return comm;
}

void Comm::checkPendingAtDestroy() {
  if (poisoned()) return;
  if (local_) local_->checkPendingAtDestroy();
  if (!shm_) return;
  try {
    shm_->setTimeout(config_.timeoutSeconds);
    shm_->checkDeferredAtDestroy();
  } catch (const Error& e) {
    const std::string msg = strCat("rank ", rank(), " of ", size(),
                                   ": mtxcomm_comm_destroy (transport shm): ", e.what());
    poison(msg);
    MTXCOMM_LOG(kError, rank(), msg);
    abortWith(msg, e.code());
    throw Error(e.code(), msg);
  }
}

void Comm::abort() {
  poison(strCat("rank ", rank(), ": the communicator was aborted"));
  if (p2p_) {
    p2p_->stop(MTXCOMM_INVALID_USAGE, "the communicator was aborted on this rank",
               /*tellPeers=*/true);
  }
  abortWith("the application aborted the communicator");
}

}  // namespace mtxcomm
