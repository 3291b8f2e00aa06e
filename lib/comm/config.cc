#include "lib/comm/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "lib/base/error.h"

extern char** environ;

namespace mtxcomm {

namespace {

std::vector<std::string> algoChoices(Collective c) {
  std::vector<std::string> v{"auto"};
  for (const char* n : algorithmNames(c)) v.emplace_back(n);
  return v;
}

std::string joinChoices(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& c : v) s += (s.empty() ? "" : "|") + c;
  return s;
}

[[noreturn]] void badValue(const char* name, const std::string& value, const std::string& why) {
  fail(MTXCOMM_INVALID_USAGE, name, "=\"", value, "\" is invalid: ", why);
}

// Digits from i on; returns how many.
size_t skipDigits(const std::string& v, size_t& i) {
  const size_t from = i;
  while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) ++i;
  return i - from;
}

// A plain decimal number: digits with an optional fraction and exponent ("0.5", "2", "1e-3"),
// no sign, space, hexadecimal, inf or nan (strtod would take them all).
bool isDecimal(const std::string& v) {
  size_t i = 0;
  size_t digits = skipDigits(v, i);
  if (i < v.size() && v[i] == '.') digits += skipDigits(v, ++i);
  if (digits == 0) return false;
  if (i < v.size() && (v[i] == 'e' || v[i] == 'E')) {
    ++i;
    if (i < v.size() && (v[i] == '+' || v[i] == '-')) ++i;
    if (skipDigits(v, i) == 0) return false;
  }
  return i == v.size();
}

int parseInt(const char* name, const std::string& v, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  size_t i = !v.empty() && v[0] == '-' ? 1 : 0;  // (strtol also takes spaces and a '+')
  const bool plain = skipDigits(v, i) > 0 && i == v.size();
  if (!plain || *end != '\0' || errno) badValue(name, v, "not an integer");
  if (x < lo || x > hi) badValue(name, v, strCat("must be in [", lo, ", ", hi, "]"));
  return static_cast<int>(x);
}

// Accepts plain bytes or a K/M/G suffix (powers of 1024).
size_t parseBytes(const char* name, const std::string& v, size_t lo, size_t hi) {
  errno = 0;
  char* end = nullptr;
  unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || end == v.c_str() || errno || !std::isdigit(static_cast<unsigned char>(v[0]))) {
    badValue(name, v, "not a byte count (e.g. 1048576 or 1M)");
  }
  std::string suffix(end);
  unsigned long long mult = 1;
  if (suffix == "K" || suffix == "k")
    mult = 1ull << 10;
  else if (suffix == "M" || suffix == "m")
    mult = 1ull << 20;
  else if (suffix == "G" || suffix == "g")
    mult = 1ull << 30;
  else if (!suffix.empty())
    badValue(name, v,
             "not a whole number of bytes with an optional K, M or G suffix (e.g. "
             "1048576 or 1M)");
  if (x > hi / mult) badValue(name, v, strCat("must be in [", lo, ", ", hi, "] bytes"));
  x *= mult;
  if (x < lo || x > hi) badValue(name, v, strCat("must be in [", lo, ", ", hi, "] bytes"));
  return static_cast<size_t>(x);
}

double parseSeconds(const char* name, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  double t = std::strtod(v.c_str(), &end);
  if (!isDecimal(v) || *end != '\0' || errno || !std::isfinite(t) || t < lo || t > hi) {
    badValue(name, v, strCat("expected seconds, a decimal number in [", lo, ", ", hi, "]"));
  }
  return t;
}

}  // namespace

const char* getEnv(const char* name) {
  const char* v = std::getenv(name);
  return v;
}

const std::vector<ConfigVar>& configVars() {
  static const std::vector<ConfigVar> kVars = [] {
    std::vector<ConfigVar> v = {
        {"MTXCOMM_TIMEOUT",
         "seconds",
         "300",
         "how long a collective waits for a peer before failing with MTXCOMM_TIMEOUT; also "
         "bounds bootstrap waits",
         {}},
        {"MTXCOMM_LOG_LEVEL",
         "enum",
         "WARN",
         "NONE, ERROR, WARN, INFO (echoes the configuration at init), DEBUG (logs the algorithm "
         "chosen for every call), TRACE (also prints every schedule)",
         {"NONE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"}},
        {"MTXCOMM_SEGMENT_BYTES",
         "bytes",
         "1M",
         "pipeline segment of the ring algorithms (4K..1G; K/M/G suffixes accepted)",
         {},
         true},
        {"MTXCOMM_TRANSPORT",
         "enum",
         "auto",
         "auto: the ranks meet over MPI under mpirun/srun or when MPI is initialised, over TCP "
         "when MTXCOMM_STORE is set, and use UCX when they span several nodes (and UCX works on "
         "every rank); ucx: UCX for every peer (an error where a rank has none); mpi, tcp: the "
         "bootstrap transport only",
         {"auto", "ucx", "mpi", "tcp"},
         true},
        {"MTXCOMM_RANK",
         "int",
         "",
         "this process's rank, for the MTXCOMM_STORE bootstrap (default: the launcher's, under "
         "mpirun, a PMI launcher or srun)",
         {}},
        {"MTXCOMM_SIZE",
         "int",
         "",
         "the number of ranks, for the MTXCOMM_STORE bootstrap (default: the launcher's)",
         {}},
        {"MTXCOMM_STORE",
         "string",
         "",
         "rendezvous without MPI: file:PATH (a directory all ranks see; one running job per "
         "directory: rank 0 clears what an earlier job left there) or tcp:HOST:PORT (served by "
         "rank 0)",
         {}},
        {"MTXCOMM_TCP_HOST",
         "string",
         "",
         "address other ranks use to reach this one over TCP (default: MTXCOMM_TCP_IFADDR when "
         "set, "
         "else 127.0.0.1)",
         {}},
        {"MTXCOMM_TCP_IFADDR",
         "string",
         "",
         "IPv4 address the TCP transport listens on (default: the address of MTXCOMM_TCP_HOST, "
         "else 127.0.0.1): it listens only where its peers are told to connect",
         {}},
        {"MTXCOMM_JOB_SECRET",
         "secret",
         "",
         "the job's secret (64 hex digits from `openssl rand -hex 32`, or any text of 16 bytes "
         "or more), the same on every rank: every bootstrap connection (the tcp: store, the TCP "
         "transport) proves it by HMAC challenge-response; it never travels in the clear. "
         "Needed with MTXCOMM_STORE=tcp:; mtxrun sets one; a file: store makes one in its "
         "private job folder; never echoed",
         {}},
        {"MTXCOMM_JOB_SECRET_FILE",
         "string",
         "",
         "a file holding the job's secret instead of MTXCOMM_JOB_SECRET (a regular file owned "
         "by this user, readable by nobody else)",
         {}},
        {"MTXCOMM_UCX_EAGER_LIMIT",
         "bytes",
         "4M",
         "when the ranks span nodes, on a node whose UCX has no RDMA device (ib, ugni), so that "
         "other nodes are reached "
         "over TCP: messages up to this size go eagerly (UCX's rendezvous threshold is set to "
         "it; over TCP a rendezvous buys no zero-copy and costs a round trip that waits behind "
         "the data queued on a loaded link). 0 or UCX_RNDV_THRESH set: UCX's own threshold "
         "(0..1G)",
         {}},
        {"MTXCOMM_SHM",
         "enum",
         "auto",
         "auto: ranks that are all on one node share a /dev/shm segment and use the shm "
         "algorithms; off: point-to-point transports only",
         {"auto", "off"},
         true},
        {"MTXCOMM_SHM_SLOT_BYTES",
         "bytes",
         "auto",
         "per-rank shared-memory slot, the chunk of the shm algorithms (4K..64M); the segment "
         "is about 2 x ranks x this. auto: one core's L2 cache within 256K..1M, smaller where "
         "the segment would pass 32M or half of /dev/shm's free space (never below 256K); with "
         "auto, allreduce and reduce_scatter go in half slots where only half a slot's working "
         "set fits in the L2 (2 MiB L2: 512K chunks in 1M slots)",
         {},
         true},
        {"MTXCOMM_SHM_CHUNK_BYTES",
         "bytes",
         "auto",
         "the chunk of the shared-memory reductions (allreduce, reduce_scatter), at most the "
         "slot (4K..64M; a larger value is the slot). auto: half the slot where only half a "
         "slot's working set fits in the L2 (see MTXCOMM_SHM_SLOT_BYTES), else the whole slot; "
         "a slot set by hand is the chunk. For tuning and for forcing each path in tests",
         {},
         true},
        {"MTXCOMM_CYCLE_TIME",
         "seconds",
         "0.001",
         "framework bindings: where the ranks have no shared-memory segment (across nodes, "
         "MTXCOMM_SHM=off), how often an idle engine polls the others for work (0..1); on one "
         "node an idle engine sleeps until a rank submits work, and one that a peer's request "
         "woke waits up to this long (at most 1 ms) for a request of its own before it joins the "
         "cycle",
         {}},
        {"MTXCOMM_CACHE_CAPACITY",
         "int",
         "1024",
         "framework bindings: requests the engine remembers (response cache): a request seen "
         "before is sent as one bit of a bit vector instead of its name and shapes (0: no cache; "
         "0..65536)",
         {},
         true},
        {"MTXCOMM_STALL_TIMEOUT",
         "seconds",
         "300",
         "framework bindings: a tensor submitted by some ranks and not by the others fails on "
         "the ranks that submitted it after this long, naming the tensor and the missing ranks "
         "(0: wait forever)",
         {}},
        {"MTXCOMM_TIMELINE",
         "string",
         "",
         "framework bindings: write a Chrome trace (chrome://tracing, Perfetto) of every "
         "tensor's negotiation, queue wait, fusion copies and collective to this path; \"{rank}\" "
         "in it is replaced by the rank, else rank r writes PATH.r (one file per rank)",
         {}},
        {"MTXCOMM_TIMELINE_MAX_BYTES",
         "bytes",
         "100M",
         "framework bindings: the timeline stops recording (and says so in the file) at this "
         "size (4K..64G)",
         {}},
        {"MTXCOMM_PLACEMENT",
         "enum",
         "auto",
         "auto: at init each rank of a node gets cores / ranks-per-node of its node's cores and, "
         "unless the launcher bound it already, is bound to them (framework bindings size their "
         "thread pools to the share); off: no binding (the share is still reported)",
         {"auto", "off"}},
        {"MTXCOMM_FLIGHT_RECORDER",
         "int",
         "64",
         "the flight recorder: each communicator keeps its last this many calls (kind, count, "
         "dtype, op, root, algorithm, transport, a binding's tensor names, state, the peer it "
         "waits on, times); a timeout, a peer's failure, a disagreement, a stall error or "
         "SIGUSR1 writes them to MTXCOMM_FLIGHT_RECORDER_DIR, and `mtxcomm_info --why-stuck "
         "DIR` names the rank the job waits for (0: off; 0..65536)",
         {}},
        {"MTXCOMM_FLIGHT_RECORDER_DIR",
         "string",
         "",
         "where the flight recorder writes (a folder of this user's that nobody else can "
         "write, made with mode 0700; one JSON file per communicator and rank, mode 0600). "
         "Default: DIR/mtxcomm.flight_recorder with MTXCOMM_STORE=file:DIR, else "
         "/tmp/mtxcomm_flight_<job> (the launcher's job id, or the tcp: store's address)",
         {}},
        {"MTXCOMM_FUSION_BYTES",
         "bytes",
         "64M",
         "framework bindings: allreduces ready in the same cycle with the same dtype and op are "
         "packed into one buffer of up to this many bytes (0: no fusion)",
         {},
         true},
        {"MTXCOMM_TORCH_INLINE_BYTES",
         "bytes",
         "64K",
         "torch.distributed backend (C++): a collective the caller waits for (async_op=False) "
         "of at most this many bytes runs on the calling thread and returns no Work; a larger "
         "one, and every async_op=True call, runs on the backend's worker thread and returns at "
         "once (0: every call on the worker)",
         {}},
        {"MTXCOMM_TORCH_BACKEND",
         "enum",
         "auto",
         "the \"mtxcomm\" torch.distributed backend: auto (the C++ one when it was built for "
         "this torch, else the Python one with a warning) or python (the Python one)",
         {"auto", "python"},
         true},
        {"MTXCOMM_STALL_WARNING",
         "seconds",
         "60",
         "framework bindings: warn, naming the missing ranks, when a tensor submitted by some "
         "ranks has waited this long for the others (0: never)",
         {}},
        {"MTXCOMM_TRANSPARENT",
         "enum",
         "0",
         "1: set by `mtxrun --transparent`, makes an unmodified Keras script data-parallel",
         {"0", "1"},
         true},
        {"MTXCOMM_PYTHON",
         "string",
         "python3",
         "the interpreter `mtxcomm_bench report` renders its page with (it must import the "
         "mtxcomm package and matplotlib); read by mtxcomm_bench only",
         {}},
        {"MTXCOMM_TRANSPARENT_OUTPUT",
         "enum",
         "rank0",
         "transparent mode: standard output of rank 0 only, or of all ranks "
         "(`mtxrun --all-ranks-output`)",
         {"rank0", "all"}},
        {"MTXCOMM_CUDA_PATH",
         "enum",
         "auto",
         "path of collectives on device buffers: auto (nccl when every rank has its own GPU, "
         "else cuda_ipc on one node, else host_staging), nccl, cuda_ipc, host_staging, ucx_cuda "
         "(not built yet); a forced path that cannot take a call fails it with "
         "MTXCOMM_UNSUPPORTED",
         {"auto", "nccl", "cuda_ipc", "host_staging", "ucx_cuda"},
         true},
        {"MTXCOMM_CUDA_IPC_BYTES",
         "bytes",
         "64M",
         "device scratch per rank of the cuda_ipc path, mapped by its peers; larger calls run "
         "in chunks of this (1M..16G)",
         {},
         true},
        {"MTXCOMM_CUDA_STAGING_BYTES",
         "bytes",
         "4M",
         "pinned host chunk of the host_staging path (two per communicator; 64K..1G)",
         {},
         true},
        {"MTXCOMM_NCCL_LIBRARY",
         "string",
         "",
         "path of the libnccl.so.2 the nccl device path loads (CUDA builds); unset: the "
         "loader's search (LD_LIBRARY_PATH, an NCCL the process already loaded, e.g. PyTorch's), "
         "then the directory NCCL was found in at build time",
         {}},
        {"MTXCOMM_TUNING_FILE",
         "string",
         "",
         "cost-model parameters (JSON: alpha, beta, gamma for intra_node and inter_node) written "
         "by `mtxcomm_bench --tune`; unset: the documented defaults. Rank 0's file is used by "
         "every rank",
         {}},
    };
    for (int c = 0; c < kNumCollectives; ++c) {
      auto coll = static_cast<Collective>(c);
      auto choices = algoChoices(coll);
      v.push_back({collectiveAlgoVar(coll), "enum", "auto",
                   strCat("algorithm of ", collectiveName(coll), ": ", joinChoices(choices),
                          " (a forced algorithm that cannot apply falls back to auto with a "
                          "warning)"),
                   choices, true});
    }
    return v;
  }();
  return kVars;
}

namespace {
// Built when the library loads, before any thread: a fork() while another thread built it would
// leave the child waiting on the half-done initialization for good.
const bool g_configVarsBuilt = !configVars().empty();
}  // namespace

size_t defaultShmSlotBytes(size_t l2Bytes, int ranks, size_t shmFreeBytes) {
  constexpr size_t kLeast = 256 << 10, kMost = 1 << 20;
  const size_t segment = std::min(size_t{32} << 20, shmFreeBytes / 2);
  size_t slot = std::min(kMost, std::max(kLeast, l2Bytes / 4096 * 4096));
  while (slot > kLeast && 2 * static_cast<size_t>(std::max(ranks, 1)) * slot > segment) {
    slot = std::max(kLeast, slot / 2 / 4096 * 4096);
  }
  return slot;
}

size_t shmReductionChunkBytes(size_t slotBytes, size_t l2Bytes) {
  constexpr size_t kLeast = 512 << 10, kChunksInL2 = 4;
  const size_t half = slotBytes / 2 / 4096 * 4096;
  const bool halfFits = half >= kLeast && kChunksInL2 * half <= l2Bytes;
  return halfFits && kChunksInL2 * slotBytes > l2Bytes ? half : slotBytes;
}

Config Config::fromEnvironment() {
  Config c;
  for (const ConfigVar& var : configVars()) {
    const char* raw = getEnv(var.name.c_str());
    if (!raw) continue;
    std::string v(raw);
    const char* name = var.name.c_str();
    if (var.type == "enum") {
      bool ok = false;
      for (const auto& choice : var.choices) ok = ok || v == choice;
      if (!ok) badValue(name, v, "expected one of " + joinChoices(var.choices));
    }
    if (var.name == "MTXCOMM_TIMEOUT") {
      c.timeoutSeconds = parseSeconds(name, v, 0.001, 31536000.0);  // up to one year
    } else if (var.name == "MTXCOMM_CYCLE_TIME") {
      c.cycleTimeSeconds = parseSeconds(name, v, 0.0, 1.0);
    } else if (var.name == "MTXCOMM_FUSION_BYTES") {
      c.fusionBytes = parseBytes(name, v, 0, size_t{1} << 34);
    } else if (var.name == "MTXCOMM_TRANSPARENT") {
      c.transparent = v;
    } else if (var.name == "MTXCOMM_TRANSPARENT_OUTPUT") {
      c.transparentOutput = v;
    } else if (var.name == "MTXCOMM_CACHE_CAPACITY") {
      c.cacheCapacity = parseInt(name, v, 0, 65536);
    } else if (var.name == "MTXCOMM_STALL_TIMEOUT") {
      c.stallTimeoutSeconds = parseSeconds(name, v, 0.0, 31536000.0);
    } else if (var.name == "MTXCOMM_TIMELINE") {
      c.timeline = v;
    } else if (var.name == "MTXCOMM_TIMELINE_MAX_BYTES") {
      c.timelineMaxBytes = parseBytes(name, v, 4096, size_t{64} << 30);
    } else if (var.name == "MTXCOMM_PLACEMENT") {
      c.placement = v;
    } else if (var.name == "MTXCOMM_TORCH_INLINE_BYTES") {
      c.torchInlineBytes = parseBytes(name, v, 0, size_t{1} << 40);
    } else if (var.name == "MTXCOMM_TORCH_BACKEND") {
      c.torchBackend = v;
    } else if (var.name == "MTXCOMM_STALL_WARNING") {
      c.stallWarningSeconds = parseSeconds(name, v, 0.0, 31536000.0);
    } else if (var.name == "MTXCOMM_LOG_LEVEL") {
      c.logLevel = *parseLogLevel(v);
    } else if (var.name == "MTXCOMM_SEGMENT_BYTES") {
      c.segmentBytes = parseBytes(name, v, 4096, size_t{1} << 30);
    } else if (var.name == "MTXCOMM_TRANSPORT") {
      c.transport = v;
    } else if (var.name == "MTXCOMM_RANK") {
      c.rank = parseInt(name, v, 0, 1 << 24);
    } else if (var.name == "MTXCOMM_SIZE") {
      c.size = parseInt(name, v, 1, 1 << 24);
    } else if (var.name == "MTXCOMM_STORE") {
      if (v.rfind("file:", 0) != 0 && v.rfind("tcp:", 0) != 0) {
        badValue(name, v, "expected file:PATH or tcp:HOST:PORT");
      }
      c.store = v;
    } else if (var.name == "MTXCOMM_TCP_HOST") {
      c.tcpHost = v;
    } else if (var.name == "MTXCOMM_TCP_IFADDR") {
      c.tcpIfaddr = v;
    } else if (var.name == "MTXCOMM_JOB_SECRET") {
      c.jobSecret = v;
    } else if (var.name == "MTXCOMM_JOB_SECRET_FILE") {
      c.jobSecretFile = v;
    } else if (var.name == "MTXCOMM_UCX_EAGER_LIMIT") {
      c.ucxEagerLimit = parseBytes(name, v, 0, size_t{1} << 30);
    } else if (var.name == "MTXCOMM_FLIGHT_RECORDER") {
      c.flightRecorder = static_cast<size_t>(parseInt(name, v, 0, 65536));
    } else if (var.name == "MTXCOMM_FLIGHT_RECORDER_DIR") {
      c.flightRecorderDir = v;
    } else if (var.name == "MTXCOMM_SHM") {
      c.shm = v;
    } else if (var.name == "MTXCOMM_SHM_SLOT_BYTES") {
      c.shmSlotBytes = v == "auto" ? 0 : parseBytes(name, v, 4096, size_t{64} << 20);
    } else if (var.name == "MTXCOMM_SHM_CHUNK_BYTES") {
      c.shmReductionChunkBytes = v == "auto" ? 0 : parseBytes(name, v, 4096, size_t{64} << 20);
    } else if (var.name == "MTXCOMM_CUDA_PATH") {
      c.cudaPath = v;
    } else if (var.name == "MTXCOMM_CUDA_IPC_BYTES") {
      c.cudaIpcBytes = parseBytes(name, v, size_t{1} << 20, size_t{16} << 30);
    } else if (var.name == "MTXCOMM_CUDA_STAGING_BYTES") {
      c.cudaStagingBytes = parseBytes(name, v, size_t{64} << 10, size_t{1} << 30);
    } else if (var.name == "MTXCOMM_TUNING_FILE") {
      c.tuningFile = v;
      c.cost = loadTuningFile(v);
    } else if (var.name == "MTXCOMM_NCCL_LIBRARY") {
      c.ncclLibrary = v;
    } else {
      for (int k = 0; k < kNumCollectives; ++k) {
        if (var.name == collectiveAlgoVar(static_cast<Collective>(k))) c.algo[k] = v;
      }
    }
  }
  if (c.rank >= 0 && c.size > 0 && c.rank >= c.size) {
    fail(MTXCOMM_INVALID_USAGE, "MTXCOMM_RANK=", c.rank, " is not below MTXCOMM_SIZE=", c.size);
  }
  return c;
}

std::vector<std::string> Config::unknownVariables() {
  std::vector<std::string> unknown;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "MTXCOMM_", 8) != 0) continue;
    std::string name(*e, std::strcspn(*e, "="));
    bool known = false;
    for (const ConfigVar& var : configVars()) known = known || var.name == name;
    if (!known) unknown.push_back(name);
  }
  return unknown;
}

namespace {
// The shortest text that reads back as the same double: bindings read seconds back from
// describe() (mtxcomm_config_get), and a stream's 6 digits made 1234567.5 s into 1234570.
std::string exactText(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}
}  // namespace

std::vector<std::string> Config::describe() const {
  std::vector<std::string> out;
  out.push_back(strCat("MTXCOMM_TIMEOUT=", exactText(timeoutSeconds)));
  out.push_back(strCat("MTXCOMM_LOG_LEVEL=", logLevelName(logLevel)));
  out.push_back(strCat("MTXCOMM_SEGMENT_BYTES=", segmentBytes));
  out.push_back(strCat("MTXCOMM_TRANSPORT=", transport));
  out.push_back(strCat("MTXCOMM_RANK=", rank < 0 ? std::string("(unset)") : std::to_string(rank)));
  out.push_back(strCat("MTXCOMM_SIZE=", size < 0 ? std::string("(unset)") : std::to_string(size)));
  out.push_back(strCat("MTXCOMM_STORE=", store.empty() ? "(unset)" : store));
  out.push_back(strCat("MTXCOMM_TCP_HOST=", tcpHost.empty() ? "(unset)" : tcpHost));
  out.push_back(strCat("MTXCOMM_TCP_IFADDR=", tcpIfaddr.empty() ? "(unset)" : tcpIfaddr));
  out.push_back(strCat("MTXCOMM_JOB_SECRET=", jobSecret.empty() ? "(unset)" : "(set)"));
  out.push_back(
      strCat("MTXCOMM_JOB_SECRET_FILE=", jobSecretFile.empty() ? "(unset)" : jobSecretFile));
  out.push_back(strCat("MTXCOMM_UCX_EAGER_LIMIT=", ucxEagerLimit));
  out.push_back(strCat("MTXCOMM_SHM=", shm));
  out.push_back(strCat("MTXCOMM_SHM_SLOT_BYTES=",
                       shmSlotBytes ? std::to_string(shmSlotBytes) : std::string("auto")));
  out.push_back(strCat("MTXCOMM_SHM_CHUNK_BYTES=", shmReductionChunkBytes
                                                       ? std::to_string(shmReductionChunkBytes)
                                                       : std::string("auto")));
  out.push_back(strCat("MTXCOMM_CYCLE_TIME=", exactText(cycleTimeSeconds)));
  out.push_back(strCat("MTXCOMM_FUSION_BYTES=", fusionBytes));
  out.push_back(strCat("MTXCOMM_STALL_WARNING=", exactText(stallWarningSeconds)));
  out.push_back(strCat("MTXCOMM_TORCH_INLINE_BYTES=", torchInlineBytes));
  out.push_back(strCat("MTXCOMM_TORCH_BACKEND=", torchBackend));
  out.push_back(strCat("MTXCOMM_CACHE_CAPACITY=", cacheCapacity));
  out.push_back(strCat("MTXCOMM_STALL_TIMEOUT=", exactText(stallTimeoutSeconds)));
  out.push_back(strCat("MTXCOMM_TIMELINE=", timeline.empty() ? "(unset)" : timeline));
  out.push_back(strCat("MTXCOMM_TIMELINE_MAX_BYTES=", timelineMaxBytes));
  out.push_back(strCat("MTXCOMM_PLACEMENT=", placement));
  out.push_back(strCat("MTXCOMM_FLIGHT_RECORDER=", flightRecorder));
  out.push_back(strCat("MTXCOMM_FLIGHT_RECORDER_DIR=",
                       flightRecorderDir.empty() ? "(unset)" : flightRecorderDir));
  out.push_back(strCat("MTXCOMM_TRANSPARENT=", transparent));
  out.push_back(strCat("MTXCOMM_TRANSPARENT_OUTPUT=", transparentOutput));
  out.push_back(strCat("MTXCOMM_CUDA_PATH=", cudaPath));
  out.push_back(strCat("MTXCOMM_CUDA_IPC_BYTES=", cudaIpcBytes));
  out.push_back(strCat("MTXCOMM_CUDA_STAGING_BYTES=", cudaStagingBytes));
  out.push_back(strCat("MTXCOMM_TUNING_FILE=", tuningFile.empty() ? "(unset)" : tuningFile));
  out.push_back(strCat("MTXCOMM_NCCL_LIBRARY=", ncclLibrary.empty() ? "(unset)" : ncclLibrary));
  for (int k = 0; k < kNumCollectives; ++k) {
    out.push_back(strCat(collectiveAlgoVar(static_cast<Collective>(k)), "=", algo[k]));
  }
  return out;
}

JobSecret Config::loadJobSecret() const {
  if (!jobSecret.empty()) {
    if (!jobSecretFile.empty()) {
      fail(MTXCOMM_INVALID_USAGE,
           "MTXCOMM_JOB_SECRET and MTXCOMM_JOB_SECRET_FILE are both set: set one of them");
    }
    return JobSecret::fromText(jobSecret, "MTXCOMM_JOB_SECRET");
  }
  if (!jobSecretFile.empty()) return JobSecret::fromFile(jobSecretFile, "MTXCOMM_JOB_SECRET_FILE");
  return JobSecret();
}

}  // namespace mtxcomm
