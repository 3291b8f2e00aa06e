#include "lib/comm/comm.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <type_traits>
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
#include "lib/comm/topology_probe.h"

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
  std::unique_ptr<Comm> local = split(node, localRank);
  std::unique_ptr<Comm> cross = split(localRank, node);
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

std::unique_ptr<Comm> Comm::split(int color, int key) {
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
  if (topo_.empty()) {
    comm->setup();
  } else {
    const Topology sub = topo_.subset(members);
    comm->setup(&sub);
  }
  return comm;
}

namespace {

// The record's line naming this build: ranks of builds that differ in version or in the
// shared-memory segment's layout must not run together (they would misread each other's
// segment and wire formats).
constexpr const char* kBuildKey = "mtxcomm build";

// "NAME=value\n" for this build (kBuildKey) and every variable every rank must agree on.
std::string agreementRecord(const Config& cfg) {
  char build[96];
  std::snprintf(build, sizeof(build), "%s=%d.%d.%d, shared-memory layout %08x\n", kBuildKey,
                MTXCOMM_VERSION_MAJOR, MTXCOMM_VERSION_MINOR, MTXCOMM_VERSION_PATCH,
                static_cast<unsigned>(ShmGroup::layoutDigest()));
  std::string record = build;
  for (const std::string& kv : cfg.describe()) {
    const std::string name = kv.substr(0, kv.find('='));
    for (const ConfigVar& var : configVars()) {
      if (var.mustAgree && var.name == name) record += kv.substr(0, 200) + "\n";
    }
  }
  return record;
}

std::map<std::string, std::string> parseRecord(const char* data, size_t n) {
  std::map<std::string, std::string> values;
  std::istringstream in(std::string(data, strnlen(data, n)));
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) values[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return values;
}

}  // namespace

void Comm::agreeConfig() {
  constexpr size_t kRecordBytes = 8192, kVerdictBytes = 4096;
  constexpr int kTag = Transport::kMaxTag;  // before any collective: no other traffic yet
  const int n = size();
  if (n == 1) return;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(config_.timeoutSeconds));
  std::vector<char> mine(kRecordBytes, '\0');
  const std::string record = agreementRecord(config_);
  std::memcpy(mine.data(), record.data(), std::min(record.size(), kRecordBytes - 1));
  std::vector<char> verdict(kVerdictBytes, '\0');
  try {
    std::vector<RequestPtr> reqs;
    if (rank() == 0) {
      std::vector<std::vector<char>> theirs(n, std::vector<char>(kRecordBytes));
      for (int r = 1; r < n; ++r) {
        reqs.push_back(transport_->irecv(r, kTag, theirs[r].data(), kRecordBytes));
      }
      transport_->waitAll(reqs, deadline);
      theirs[0] = mine;
      // variable -> value -> ranks
      std::map<std::string, std::map<std::string, std::vector<int>>> seen;
      for (int r = 0; r < n; ++r) {
        for (auto& kv : parseRecord(theirs[r].data(), kRecordBytes)) {
          seen[kv.first][kv.second].push_back(r);
        }
      }
      std::string text, builds;
      for (auto& var : seen) {
        size_t holders = 0;
        for (auto& v : var.second) holders += v.second.size();
        if (var.second.size() == 1 && holders == static_cast<size_t>(n)) continue;
        std::string line = var.first + " differs:";
        const char* sep = " ";
        for (auto& v : var.second) {
          line += strCat(sep, v.first, " on ", rankRanges(v.second));
          sep = ", ";
        }
        if (var.first == kBuildKey) {
          builds = line + " (every rank must load the same mtxcomm library)";
        } else {
          text += (text.empty() ? "" : "; ") + line;
        }
      }
      if (!text.empty()) text += " (these variables must be the same on every rank)";
      if (!builds.empty()) text = builds + (text.empty() ? "" : "; ") + text;
      if (!text.empty()) {
        if (text.size() > kVerdictBytes - 1) text.resize(kVerdictBytes - 1);
        std::memcpy(verdict.data(), text.data(), text.size());
      }
      reqs.clear();
      for (int r = 1; r < n; ++r) {
        reqs.push_back(transport_->isend(r, kTag, verdict.data(), kVerdictBytes));
      }
      transport_->waitAll(reqs, deadline);
    } else {
      reqs.push_back(transport_->isend(0, kTag, mine.data(), kRecordBytes));
      reqs.push_back(transport_->irecv(0, kTag, verdict.data(), kVerdictBytes));
      transport_->waitAll(reqs, deadline);
    }
  } catch (const Error& e) {
    throw Error(e.code(),
                strCat("rank ", rank(), ": comparing the configuration at init: ", e.what()));
  }
  if (verdict[0] != '\0') {
    verdict.back() = '\0';
    fail(MTXCOMM_INVALID_USAGE, "rank ", rank(), " of ", n,
         ": the ranks' configurations differ: ", verdict.data());
  }
}

void Comm::allgatherAtSetup(const void* mine, size_t bytes, void* all) {
  CollArgs ag;
  ag.coll = Collective::kAllgather;
  ag.sendbuf = mine;
  ag.recvbuf = all;
  ag.count = bytes;
  ag.dtype = MTXCOMM_UINT8;
  // The automatic choice: a forced MTXCOMM_ALLGATHER_ALGO (shm, say) is for the caller's
  // allgathers, and no shared-memory segment exists yet (it warned that shm cannot run).
  std::string& forced = config_.algo[static_cast<int>(Collective::kAllgather)];
  const std::string userChoice = forced;
  forced = "auto";
  try {
    run(ag);
  } catch (...) {
    forced = userChoice;
    throw;
  }
  forced = userChoice;
}

void Comm::agreeTopology() {
  const int n = size();
  if (n == 1) {
    topo_ = Topology({localRankSummary()});
    return;
  }
  // One allgather: every rank's summary, and its cost-model parameters (rank 0's are used).
  struct Contribution {
    RankSummary summary;
    CostParams cost;
  };
  static_assert(std::is_trivially_copyable<Contribution>::value, "allgathered as bytes");
  Contribution mine{localRankSummary(), config_.cost};
  std::vector<Contribution> all(n);
  allgatherAtSetup(&mine, sizeof(Contribution), all.data());
  std::vector<RankSummary> summaries;
  for (const Contribution& c : all) summaries.push_back(c.summary);
  topo_ = Topology(std::move(summaries));
  if (all[0].cost != config_.cost) {
    MTXCOMM_LOG(kWarn, rank(),
                "the cost-model parameters (MTXCOMM_TUNING_FILE) differ from rank 0's; every "
                "rank uses rank 0's");
    config_.cost = all[0].cost;
  }
}

void Comm::setup(const Topology* agreed) {
  if (setUp_) return;
  setUp_ = true;
  const int n = size();
  if (config_.flightRecorder > 0) {
    recorder_ = std::make_unique<FlightRecorder>(config_.flightRecorder, name_, rank(), n);
    registerFlightRecorder(recorder_.get());
    transport_->setWaitRecord(recorder_->waitRecord());
    if (n > 1) flightRecorderHandlesSigusr1();  // a job of peers: SIGUSR1 writes the records
  }
  if (agreed) {
    if (agreed->size() != n) {
      fail(MTXCOMM_INVALID_USAGE, "rank ", rank(), ": a topology of ", agreed->size(),
           " ranks given to a communicator of ", n);
    }
    topo_ = *agreed;
  } else {
    agreeTopology();
  }
  size_t shmFree = topo_.minShmFreeBytes();
  if (agreed && !config_.shmSlotBytes && topo_.numNodes() == 1 && n > 1 && config_.shm != "off") {
    // A split: the summaries were taken at the parent's init, before any segment existed; the
    // free space of /dev/shm now, agreed (the least any rank sees; unknown on one: unknown).
    const int32_t mine = localShmFreeMiB();
    std::vector<int32_t> all(n);
    allgatherAtSetup(&mine, sizeof(mine), all.data());
    const bool known = std::all_of(all.begin(), all.end(), [](int32_t m) { return m >= 0; });
    shmFree =
        known ? static_cast<size_t>(*std::min_element(all.begin(), all.end())) << 20 : SIZE_MAX;
  }
  shmSlotBytes_ = config_.shmSlotBytes ? config_.shmSlotBytes
                                       : defaultShmSlotBytes(topo_.minL2Bytes(), n, shmFree);
  if (topo_.numNodes() > 1) {
    MTXCOMM_LOG(kInfo, rank(), n, " ranks on ", topo_.numNodes(),
                " nodes: no shared-memory segment for the whole communicator; node map:\n",
                topo_.describeNodes());
    return;
  }
  if (config_.shm == "off" || n == 1 || shm_) return;
  ++seq_;
  try {
    shm_ = ShmGroup::create(*transport_, static_cast<int>(seq_ % (Transport::kMaxTag + 1)),
                            shmSlotBytes_, config_.timeoutSeconds);
  } catch (const Error& e) {
    throw Error(e.code(), strCat("rank ", rank(), ": ", e.what()));
  }
  shm_->setCancelToken(cancel_);
  if (recorder_) {
    shm_->setWaitRecord(recorder_->waitRecord());
    shm_->setDumpsOnSigusr1(flightRecorderHandlesSigusr1());
  }
  shm_->setReductionChunkBytes(config_.shmReductionChunkBytes ? config_.shmReductionChunkBytes
                               : config_.shmSlotBytes
                                   ? shmSlotBytes_
                                   : shmReductionChunkBytes(shmSlotBytes_, topo_.minL2Bytes()));
  MTXCOMM_LOG(
      kInfo, rank(), "shared-memory segment of ", ShmGroup::segmentBytes(n, shmSlotBytes_),
      " bytes for ", n, " ranks (slots of ", shmSlotBytes_, " bytes",
      config_.shmSlotBytes ? "" : ", auto: from the L2 cache and the free space of /dev/shm",
      "; reductions in chunks of ", shm_->reductionChunkBytes(), " bytes)");
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
  abortWith("the application aborted the communicator");
}

}  // namespace mtxcomm
