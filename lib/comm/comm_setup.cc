// The communicator's setup (Comm::setup, lib/comm/comm.h): what the ranks agree on at init —
// the build and the variables that must be the same everywhere (agreeConfig), the node map and
// the cost-model parameters (agreeTopology) — and the shared-memory segment of a communicator
// on one node.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/topology.h"
#include "lib/comm/comm.h"
#include "lib/comm/config.h"
#include "lib/comm/topology_probe.h"
#include "transports/shm/shm_p2p.h"

namespace mtxcomm {

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

namespace {

// The point-to-point view's context id: the communicator's, mixed with a constant, so that it is
// distinct from the communicator's own and from its children's (comm.cc, split).
uint64_t p2pContextId(uint64_t contextId) {
  uint64_t ctx = (contextId ^ 0x7032703270327032ull) * 0xD6E8FEB86659FD93ull;
  ctx ^= ctx >> 32;
  return ctx == 0 ? 1 : ctx;
}

}  // namespace

void Comm::makeP2p() {
  const auto start = Clock::now();
  std::vector<int> everyone(size());
  for (int r = 0; r < size(); ++r) everyone[r] = r;
  std::unique_ptr<Transport> view;
  try {
    if (shm_) {
      // Every rank on this node: the user's messages go through rings of their own, unless
      // /dev/shm cannot hold them (every rank learns that alike, and all use the transport).
      ++seq_;
      try {
        view = ShmP2pTransport::create(
            *transport_, static_cast<int>(seq_ % (Transport::kMaxTag + 1)), config_.timeoutSeconds);
      } catch (const Error& e) {
        if (e.code() != MTXCOMM_SYSTEM_ERROR) throw;
        MTXCOMM_LOG(kWarn, rank(), "point-to-point over ", transport_->name(),
                    " instead of shared memory: ", e.what());
      }
    }
    if (!view) view = transport_->split(everyone, p2pContextId(contextId_));
  } catch (const Error& e) {
    throw Error(e.code(), strCat("rank ", rank(), ": the point-to-point view of the ",
                                 shm_ ? "shm" : transport_->name(), " transport: ", e.what()));
  }
  view->setCancelToken(cancel_);
  const std::string view_name = view->name();
  p2p_ = std::make_unique<P2p>(std::move(view), rank());
  p2pSetupSeconds_ = std::chrono::duration<double>(Clock::now() - start).count();
  MTXCOMM_LOG(kDebug, rank(), "point-to-point view over ", view_name, " made in ",
              p2pSetupSeconds_ * 1e6, " us");
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
  makeShm(agreed != nullptr);
  if (withP2p_) makeP2p();
}

void Comm::makeShm(bool split) {
  const int n = size();
  size_t shmFree = topo_.minShmFreeBytes();
  if (split && !config_.shmSlotBytes && topo_.numNodes() == 1 && n > 1 && config_.shm != "off") {
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

}  // namespace mtxcomm
