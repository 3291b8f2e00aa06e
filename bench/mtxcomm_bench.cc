// mtxcomm_bench: latency and bandwidth of one mtxcomm collective over a range of message sizes.
// OSU micro-benchmarks' columns first (Size, Avg/Min/Max latency, Iterations), then nccl-tests'
// algbw, busbw and #wrong, the algorithm mtxcomm chose, and with --vs-mpi the same MPI
// collective measured in the same run. Run under mpirun:
//
//   mpirun -np 4 mtxcomm_bench allreduce -m 4:64M -c --vs-mpi
//
// One driver (this file) and one small descriptor per collective (bench_descriptors.cc), as in
// nccl-tests. What Size means per collective is printed in the header (see the descriptors).
//
// Timing: a barrier before each timed block; each rank averages its call time over the
// iterations with MPI_Wtime; rank 0 prints the mean, min and max of the ranks' averages (OSU).
// Without -c the calls of a block run back to back; with -c every call is checked, so each call
// is timed alone and the refill of inputs, the poisoning of outputs and the check stay outside
// the timing. --vs-mpi warms both libraries up, then alternates blocks of iterations of mtxcomm
// and MPI, so that machine noise hits both alike.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_data.h"
#include "bench/bench_descriptors.h"
#include "bench/bench_device.h"
#include "bench/bench_tune.h"
#include "lib/comm/c_api.h"
#include "lib/base/dtype.h"

namespace mtxcomm {
namespace bench {
namespace {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;
constexpr size_t kMaxBytes = size_t{1} << 40;
constexpr int kBlocksVsMpi = 10;  // --vs-mpi: each library's iterations run in about this many
                                  // blocks, alternating

struct Options {
  std::string collective;
  std::string sizes = "4:4M";
  int iters = 0;    // 0: by size, see defaultIters
  int warmup = -1;  // -1: by size, see defaultWarmup
  bool full = false;
  bool check = false;
  bool inPlace = false;
  bool vsMpi = false;
  std::string algo;
  std::string dtype = "float32";
  std::string op = "sum";
  int root = 0;
  std::string json;
  std::string device = "host";  // -d: host or cuda (device buffers)
  bool rootGiven = false;       // -r on the command line
  bool opGiven = false;         // -o on the command line
  bool predict = false;         // --predict: the cost model's time beside each measurement
  bool tune = false;            // --tune: measure the cost model's parameters (-o: the file)
};

// A bad command line or configuration: rank 0 prints it, every rank exits with status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failure every rank learned of together (collectively) and the ranks concerned already
// reported on stderr: every rank exits with status 1, cleanly.
struct ReportedFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Environment variables that shape the results, recorded in the header and in --json (the
// collective's MTXCOMM_<COLLECTIVE>_ALGO is recorded as the Algorithm line).
constexpr const char* kEnvRecorded[] = {"MTXCOMM_SHM", "MTXCOMM_SHM_SLOT_BYTES",
                                        "MTXCOMM_SEGMENT_BYTES"};
std::string envValue(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "(default)";
}

// Like OSU: many iterations for small messages, fewer for large ones.
int defaultIters(size_t bytes) { return bytes <= 64 * kKiB ? 100 : bytes <= kMiB ? 50 : 20; }
int defaultWarmup(size_t bytes) { return bytes <= kMiB ? 10 : 2; }

// "4", "64K", "4M", "1G", "1T" (binary multiples: K = 1024; case-insensitive; an optional
// trailing B or iB, as in 4KB or 4KiB; a bare B means bytes). At most kMaxBytes (1T).
std::optional<size_t> parseBytes(std::string s) {
  if (s.empty() || s.find_first_not_of("0123456789KkMmGgTtIiBb") != std::string::npos) {
    return std::nullopt;
  }
  size_t digits = s.find_first_not_of("0123456789");
  if (digits == 0) return std::nullopt;
  std::string suffix = digits == std::string::npos ? "" : s.substr(digits);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  size_t mult = 1;
  if (!suffix.empty()) {
    const char unit = suffix[0];
    const std::string rest = suffix.substr(1);
    if (rest != "" && rest != "B" && rest != "IB") return std::nullopt;
    if (unit == 'K') {
      mult = kKiB;
    } else if (unit == 'M') {
      mult = kMiB;
    } else if (unit == 'G') {
      mult = kMiB * kKiB;
    } else if (unit == 'T') {
      mult = kMiB * kMiB;
    } else if (unit != 'B' || rest != "") {
      return std::nullopt;
    }
  }
  const std::string num = s.substr(0, digits);
  if (num.size() > 13) return std::nullopt;
  const size_t n = std::stoull(num);
  if (n > kMaxBytes / mult) return std::nullopt;
  return n * mult;
}

// -m MIN:MAX or -m MAX (MIN then defaults to min(4, MAX)), as OSU.
std::pair<size_t, size_t> parseSizeRange(const std::string& s) {
  const size_t colon = s.find(':');
  const std::string minText = colon == std::string::npos ? "" : s.substr(0, colon);
  const std::string maxText = colon == std::string::npos ? s : s.substr(colon + 1);
  const auto maxBytes = parseBytes(maxText);
  std::optional<size_t> minBytes = parseBytes(minText);
  if (minText.empty() && maxBytes) minBytes = std::min<size_t>(4, *maxBytes);
  if (!maxBytes || !minBytes) {
    throw UsageError("-m " + s +
                     ": expected MIN:MAX or MAX in bytes, with an optional K, M, G or T suffix "
                     "(binary multiples, at most 1T), e.g. -m 4:64M");
  }
  if (*minBytes > *maxBytes) {
    throw UsageError("-m " + s + ": MIN (" + std::to_string(*minBytes) +
                     " bytes) is larger than MAX (" + std::to_string(*maxBytes) + " bytes)");
  }
  return {*minBytes, *maxBytes};
}

// Sizes double from MIN up to MAX (0 first when MIN is 0, then 1, 2, 4, ...).
std::vector<size_t> messageSizes(size_t minBytes, size_t maxBytes) {
  std::vector<size_t> sizes;
  size_t s = minBytes;
  if (s == 0) {
    sizes.push_back(0);
    s = 1;
  }
  for (; s <= maxBytes; s *= 2) sizes.push_back(s);
  return sizes;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

mtxcomm_datatype_t parseDatatypeOrThrow(const std::string& name) {
  if (auto dt = parseDatatype(name)) return *dt;
  std::vector<std::string> valid;
  for (int i = 0; i < MTXCOMM_NUM_DATATYPES; ++i) {
    valid.emplace_back(datatypeName(static_cast<mtxcomm_datatype_t>(i)));
  }
  throw UsageError("-T " + name + ": unknown datatype; valid: " + joined(valid));
}

mtxcomm_op_t parseOpOrThrow(const std::string& name) {
  if (auto op = parseOp(name)) return *op;
  std::vector<std::string> valid;
  for (int i = 0; i < MTXCOMM_NUM_OPS; ++i)
    valid.emplace_back(opName(static_cast<mtxcomm_op_t>(i)));
  throw UsageError("-o " + name + ": unknown reduction op; valid: " + joined(valid));
}

void checkAlgorithm(const CollDescriptor& desc, const std::string& algo) {
  std::vector<std::string> valid{"auto"};
  for (const char* n : algorithmNames(desc.coll)) valid.emplace_back(n);
  if (std::find(valid.begin(), valid.end(), algo) == valid.end()) {
    throw UsageError("-a " + algo + ": unknown " + desc.name +
                     " algorithm; valid: " + joined(valid));
  }
}

MPI_Datatype mpiDatatype(mtxcomm_datatype_t dt) {
  switch (dt) {
    case MTXCOMM_INT8:
      return MPI_INT8_T;
    case MTXCOMM_UINT8:
      return MPI_UINT8_T;
    case MTXCOMM_INT32:
      return MPI_INT32_T;
    case MTXCOMM_UINT32:
      return MPI_UINT32_T;
    case MTXCOMM_INT64:
      return MPI_INT64_T;
    case MTXCOMM_UINT64:
      return MPI_UINT64_T;
    case MTXCOMM_FLOAT32:
      return MPI_FLOAT;
    case MTXCOMM_FLOAT64:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;  // float16, bfloat16: MPI has no such type
  }
}

MPI_Op mpiOp(mtxcomm_op_t op) {
  switch (op) {
    case MTXCOMM_SUM:
      return MPI_SUM;
    case MTXCOMM_PROD:
      return MPI_PROD;
    case MTXCOMM_MIN:
      return MPI_MIN;
    case MTXCOMM_MAX:
      return MPI_MAX;
    default:
      return MPI_OP_NULL;  // avg
  }
}

// ---- Running one size ----------------------------------------------------------------------

class SizeRun {
 public:
  // Collective: allocates the buffers, and when any rank cannot, that rank reports it and every
  // rank throws ReportedFailure (no rank is left waiting in a collective).
  SizeRun(const CollDescriptor& desc, const BenchContext& ctx, const Layout& layout, bool check)
      : desc_(desc), ctx_(ctx), layout_(layout), check_(check) {
    const size_t sendBytes = layout.sendElems * ctx.elemSize;
    const size_t recvBytes = layout.recvElems * ctx.elemSize;
    int ok = 1;
    try {
      bufs_.send.resize(sendBytes);
      bufs_.recv.resize(recvBytes);
    } catch (const std::bad_alloc&) {
      ok = 0;
    } catch (const std::length_error&) {
      ok = 0;
    }
    if (!ok) {
      bufs_ = Buffers{};  // give back what was allocated
      std::fprintf(stderr,
                   "mtxcomm_bench: rank %d: cannot allocate %zu bytes for %zu-byte buffers\n",
                   ctx.rank, sendBytes + recvBytes, layout.bytes);
    }
    int allOk = 0;
    MPI_Allreduce(&ok, &allOk, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!allOk) throw ReportedFailure("buffer allocation failed");
    desc_.fillInput(ctx_, layout_, bufs_);
    if (ctx_.stream) {
      if (!bufs_.send.empty()) bufs_.dsend = static_cast<unsigned char*>(deviceAlloc(sendBytes));
      bufs_.drecv = static_cast<unsigned char*>(deviceAlloc(recvBytes));
      toDevice();
    }
  }
  ~SizeRun() {
    if (bufs_.dsend) deviceFree(bufs_.dsend);
    if (bufs_.drecv) deviceFree(bufs_.drecv);
  }
  SizeRun(const SizeRun&) = delete;
  SizeRun& operator=(const SizeRun&) = delete;

  // Runs iters calls of one library after a barrier. Returns the seconds this rank spent in the
  // calls; with check, adds the wrong elements of every call to *wrong.
  double block(bool mpi, int iters, unsigned long long* wrong) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (!check_) {
      const double t0 = MPI_Wtime();
      for (int k = 0; k < iters; ++k) call(mpi);
      if (ctx_.stream) streamSync(ctx_.stream);  // device calls return before they finish
      return MPI_Wtime() - t0;
    }
    double seconds = 0;
    for (int k = 0; k < iters; ++k) {
      // Poison the outputs so that a call that writes nothing is caught; restore the inputs an
      // in-place call overwrote.
      std::memset(bufs_.recv.data(), 0xA5, bufs_.recv.size());
      if (ctx_.inPlace) desc_.fillInput(ctx_, layout_, bufs_);
      if (ctx_.stream) toDevice();
      const double t0 = MPI_Wtime();
      call(mpi);
      if (ctx_.stream) streamSync(ctx_.stream);
      seconds += MPI_Wtime() - t0;
      if (ctx_.stream) toHost();
      *wrong += desc_.countWrong(ctx_, layout_, bufs_, mpi);
    }
    return seconds;
  }

 private:
  // -d cuda: the host buffers' contents to their device copies and back.
  void toDevice() {
    if (bufs_.dsend) copyToDevice(bufs_.dsend, bufs_.send.data(), bufs_.send.size());
    copyToDevice(bufs_.drecv, bufs_.recv.data(), bufs_.recv.size());
  }
  void toHost() {
    if (bufs_.dsend) copyToHost(bufs_.send.data(), bufs_.dsend, bufs_.send.size());
    copyToHost(bufs_.recv.data(), bufs_.drecv, bufs_.recv.size());
  }

  void call(bool mpi) {
    if (mpi) {
      const int rc = desc_.runMpi(ctx_, layout_, bufs_);
      if (rc != MPI_SUCCESS) {
        std::fprintf(stderr, "mtxcomm_bench: rank %d: %s failed with MPI error %d\n", ctx_.rank,
                     desc_.mpiName, rc);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      return;
    }
    const mtxcomm_result_t r = desc_.runMtxcomm(ctx_, layout_, bufs_);
    if (r != MTXCOMM_SUCCESS) {
      std::fprintf(stderr, "mtxcomm_bench: rank %d: mtxcomm %s (%zu bytes) failed: %s: %s\n",
                   ctx_.rank, desc_.name, layout_.bytes, mtxcomm_get_error_string(r),
                   mtxcomm_get_last_error(ctx_.comm));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }

  const CollDescriptor& desc_;
  const BenchContext& ctx_;
  Layout layout_;
  Buffers bufs_;
  bool check_;
};

// Mean, min and max over ranks of each rank's average call time (valid on rank 0).
struct Latency {
  double avgUs = 0;
  double minUs = 0;
  double maxUs = 0;
  int slowestRank = 0;
};

Latency reduceLatency(double seconds, int iters, int nranks) {
  const double perCall = iters > 0 ? seconds / iters * 1e6 : 0;
  Latency l;
  double sum = 0;
  MPI_Reduce(&perCall, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&perCall, &l.minUs, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
  struct {
    double value;
    int rank;
  } mine{perCall, 0}, slowest{0, 0};
  MPI_Comm_rank(MPI_COMM_WORLD, &mine.rank);
  MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE_INT, MPI_MAXLOC, 0, MPI_COMM_WORLD);
  l.avgUs = sum / nranks;
  l.maxUs = slowest.value;
  l.slowestRank = slowest.rank;
  return l;
}

unsigned long long sumOverRanks(unsigned long long v) {
  unsigned long long total = 0;
  MPI_Reduce(&v, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  return total;
}

// ---- Output --------------------------------------------------------------------------------

// Aligned columns: the first one ("# Size") left-aligned, the others right-aligned.
class Table {
 public:
  void add(const std::string& title, int width = 0) {
    cols_.push_back({title, std::max<int>(width, static_cast<int>(title.size()) + 2)});
  }
  void printHeader() const {
    std::string line;
    for (size_t i = 0; i < cols_.size(); ++i)
      line += cell(i, i == 0 ? "# " + cols_[i].title : cols_[i].title);
    std::printf("%s\n", line.c_str());
  }
  void printRow(const std::vector<std::string>& values) const {
    std::string line;
    for (size_t i = 0; i < values.size(); ++i) line += cell(i, values[i]);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

 private:
  std::string cell(size_t i, const std::string& v) const {
    const int w = cols_[i].width;
    char buf[256];
    std::snprintf(buf, sizeof buf, i == 0 ? "%-*s" : "%*s", w, v.c_str());
    return buf;
  }
  struct Column {
    std::string title;
    int width;
  };
  std::vector<Column> cols_;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// ---- The benchmark -------------------------------------------------------------------------

// The world communicator from the environment; a failure aborts the MPI job (only some ranks
// may have failed, the others would wait forever).
mtxcomm_comm_t initCommOrAbort(int worldRank) {
  mtxcomm_comm_t comm = nullptr;
  const mtxcomm_result_t r = mtxcomm_comm_init_from_env(&comm);
  if (r != MTXCOMM_SUCCESS) {
    std::fprintf(stderr, "mtxcomm_bench: rank %d: mtxcomm_comm_init_from_env failed: %s: %s\n",
                 worldRank, mtxcomm_get_error_string(r), mtxcomm_get_last_error(nullptr));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return comm;
}

int runBenchmark(const Options& opt, int worldRank, int worldSize) {
  const CollDescriptor& desc = *findDescriptor(opt.collective);
  const bool reduces = collectiveReduces(desc.coll);
  const bool rooted = desc.coll == Collective::kBroadcast || desc.coll == Collective::kReduce;
  const bool hasData = desc.coll != Collective::kBarrier;

  std::vector<std::string> rootedNames;
  std::vector<std::string> reducingNames;
  for (const CollDescriptor& d : descriptors()) {
    if (d.coll == Collective::kBroadcast || d.coll == Collective::kReduce) {
      rootedNames.emplace_back(d.name);
    }
    if (collectiveReduces(d.coll)) reducingNames.emplace_back(d.name);
  }
  if (opt.rootGiven && !rooted) {
    throw UsageError("-r " + std::to_string(opt.root) + ": " + desc.name +
                     " has no root (-r applies to " + joined(rootedNames) + ")");
  }
  if (opt.opGiven && !reduces) {
    throw UsageError("-o " + opt.op + ": " + desc.name + " does not reduce (-o applies to " +
                     joined(reducingNames) + ")");
  }

  BenchContext ctx;
  ctx.dtype = parseDatatypeOrThrow(opt.dtype);
  ctx.op = reduces ? parseOpOrThrow(opt.op) : MTXCOMM_SUM;
  ctx.elemSize = datatypeSize(ctx.dtype);
  ctx.inPlace = opt.inPlace;
  ctx.root = opt.root;
  const auto [minBytes, maxBytes] = parseSizeRange(opt.sizes);
  // Sizes are rounded down to a multiple of unitBytes: some size must hold at least one unit.
  const size_t unitElems = desc.unitElems(worldSize);
  const size_t unitBytes = unitElems * ctx.elemSize;
  if (hasData && minBytes > 0 && maxBytes < unitBytes) {
    const std::string dt = datatypeName(ctx.dtype);
    throw UsageError("-m " + opt.sizes + ": no message size in the range holds a whole number of " +
                     dt + " elements" +
                     (unitElems == 1 ? " (" + std::to_string(unitBytes) + " bytes at least)"
                                     : " per rank (" + std::to_string(worldSize) + " ranks x " +
                                           std::to_string(ctx.elemSize) + " bytes = " +
                                           std::to_string(unitBytes) + " bytes at least)"));
  }
  if (!opt.algo.empty()) checkAlgorithm(desc, opt.algo);
  if (opt.device != "host" && opt.device != "cuda") {
    throw UsageError("-d " + opt.device + ": expected host or cuda");
  }
  if (opt.device == "cuda" && opt.vsMpi) {
    throw UsageError("--vs-mpi is unsupported with -d cuda: the MPI baseline runs on host buffers");
  }
  if (opt.vsMpi && hasData) {
    ctx.mpiType = mpiDatatype(ctx.dtype);
    if (ctx.mpiType == MPI_DATATYPE_NULL) {
      throw UsageError(std::string("--vs-mpi is unsupported for ") + datatypeName(ctx.dtype) +
                       ": MPI has no such datatype (use -T float32 or drop --vs-mpi)");
    }
    if (reduces) {
      ctx.mpiOp = mpiOp(ctx.op);
      if (ctx.mpiOp == MPI_OP_NULL) {
        throw UsageError(std::string("--vs-mpi is unsupported for -o ") + opName(ctx.op) +
                         ": MPI has no such reduction op");
      }
    }
  }
  if (rooted && (opt.root < 0 || opt.root >= worldSize)) {
    throw UsageError("-r " + std::to_string(opt.root) + ": root must be in [0, " +
                     std::to_string(worldSize) + ")");
  }
  std::ofstream json;
  int jsonOk = 1;
  if (worldRank == 0 && !opt.json.empty()) {
    json.open(opt.json);
    jsonOk = json.is_open() ? 1 : 0;
  }
  MPI_Bcast(&jsonOk, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!jsonOk) throw UsageError("--json " + opt.json + ": cannot open for writing");

  // Force the algorithm through the configuration, which init_from_env reads.
  const char* algoVar = collectiveAlgoVar(desc.coll);
  if (!opt.algo.empty()) setenv(algoVar, opt.algo.c_str(), 1);
  mtxcomm_comm_t comm = initCommOrAbort(worldRank);
  mtxcomm_comm_rank(comm, &ctx.rank);
  mtxcomm_comm_size(comm, &ctx.nranks);
  if (ctx.rank != worldRank || ctx.nranks != worldSize) {
    std::fprintf(stderr,
                 "mtxcomm_bench: rank %d: the mtxcomm communicator (rank %d of %d) does not match "
                 "MPI_COMM_WORLD (rank %d of %d)\n",
                 worldRank, ctx.rank, ctx.nranks, worldRank, worldSize);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  ctx.comm = comm;
  // Destroyed on every exit, also when every rank throws ReportedFailure together.
  const std::unique_ptr<mtxcomm_comm, decltype(&mtxcomm_comm_destroy)> commGuard(
      comm, &mtxcomm_comm_destroy);
  const TestData data(ctx.dtype, ctx.op, ctx.nranks);
  ctx.data = &data;
  // -d cuda: device buffers on GPU rank % devices, one stream for every call. Every rank
  // learns together whether every rank could set its device up.
  std::unique_ptr<void, decltype(&destroyDeviceStream)> streamGuard(nullptr, &destroyDeviceStream);
  if (opt.device == "cuda" && hasData) {
    int ok = 1, allOk = 0;
    try {
      streamGuard.reset(deviceStream(ctx.rank));
      ctx.stream = streamGuard.get();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mtxcomm_bench: rank %d: %s\n", ctx.rank, e.what());
      ok = 0;
    }
    MPI_Allreduce(&ok, &allOk, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!allOk) throw ReportedFailure("device setup failed");
  }

  // Header.
  Table table;
  table.add("Size", 10);
  table.add("Avg Latency(us)", 17);
  table.add("Min Latency(us)", 17);
  table.add("Max Latency(us)", 17);
  table.add("Iterations", 12);
  table.add("algbw(GB/s)", 13);
  table.add("busbw(GB/s)", 13);
  table.add("#wrong", 8);
  table.add("Algorithm", 20);
  if (opt.vsMpi) {
    table.add("MPI Avg(us)", 13);
    if (opt.full) {
      table.add("MPI Min(us)", 13);
      table.add("MPI Max(us)", 13);
    }
    if (opt.check) table.add("MPI #wrong", 11);
    table.add("Ratio", 8);
  }
  if (opt.full) table.add("Slowest rank", 14);
  if (opt.predict) table.add("Predicted(us)", 15);

  const char* algoEnv = std::getenv(algoVar);
  const std::string algoText = opt.algo == "auto"  ? std::string("auto (-a auto)")
                               : !opt.algo.empty() ? "forced by -a " + opt.algo
                               : algoEnv           ? std::string(algoVar) + "=" + algoEnv
                                                   : std::string("auto");
  if (ctx.rank == 0) {
    std::printf("# mtxcomm_bench %s: %s%s%s, %d ranks, transport %s, %s, check %s\n", desc.name,
                hasData ? datatypeName(ctx.dtype) : "no data", reduces ? " " : "",
                reduces ? opName(ctx.op) : "", ctx.nranks, unwrapComm(comm)->transportName(),
                ctx.inPlace ? "in-place" : "out-of-place", opt.check ? "on" : "off");
    std::printf("# %s\n", desc.sizeNote);
    if (ctx.stream) {
      std::printf(
          "# Buffers: device memory (-d cuda), one stream; latency includes waiting for "
          "the stream; the Algorithm column names the device path\n");
    }
    if (unitBytes > ctx.elemSize) {
      std::printf(
          "# Sizes are rounded down to a multiple of n * elemsize = %zu bytes; smaller "
          "ones are skipped\n",
          unitBytes);
    }
    if (rooted) std::printf("# root %d\n", ctx.root);
    std::string envText;
    for (const char* name : kEnvRecorded) {
      envText += (envText.empty() ? "" : ", ") + std::string(name) + "=" + envValue(name);
    }
    std::printf("# Environment: %s\n", envText.c_str());
    std::printf("# Algorithm: %s (the column names the one each size used)\n", algoText.c_str());
    const std::string itersText = opt.iters > 0 ? std::to_string(opt.iters) + " per size"
                                                : "100 up to 64K, 50 up to 1M, 20 above";
    const std::string warmupText = opt.warmup >= 0 ? std::to_string(opt.warmup) : "10, 2 above 1M";
    std::printf("# Iterations: %s; warmup %s\n", itersText.c_str(), warmupText.c_str());
    std::printf("# Latency: per-rank average per call, then Avg/Min/Max over ranks (OSU)%s\n",
                opt.check ? "; -c: each call timed alone, refill/check untimed" : "");
    if (desc.hasBandwidth) {
      std::printf(
          "# algbw = bytes / Avg latency (GB/s = 1e9 B/s); busbw = algbw * %s (nccl-tests)\n",
          desc.busbwFormula);
    }
    if (opt.check) {
      std::printf(
          "# #wrong: elements differing bitwise from the expected value, summed over ranks "
          "and all calls (warmup too)\n");
    }
    if (opt.vsMpi) {
      std::printf(
          "# MPI: %s%s, warmed up and timed in blocks alternating with "
          "mtxcomm's; Ratio = Avg / MPI Avg (< 1: mtxcomm faster)\n",
          desc.mpiName, hasData ? " on the same buffers" : "");
    }
    table.printHeader();
    std::fflush(stdout);
  }

  nlohmann::json rows = nlohmann::json::array();
  unsigned long long totalWrong = 0;
  int sizesRun = 0;
  const std::vector<size_t> sizes =
      hasData ? messageSizes(minBytes, maxBytes) : std::vector<size_t>{0};
  for (const size_t requested : sizes) {
    const size_t bytes = requested / unitBytes * unitBytes;
    if (bytes == 0 && requested > 0) {
      if (ctx.rank == 0) {
        std::printf("# Size %zu skipped: below one unit of %zu bytes\n", requested, unitBytes);
      }
      continue;
    }
    const Layout layout = desc.layout(ctx, bytes);
    if (opt.vsMpi && layout.count > static_cast<size_t>(INT_MAX)) {
      if (ctx.rank == 0) {
        std::printf("# Size %zu and above skipped: too many elements for MPI's int counts\n",
                    bytes);
      }
      break;
    }
    const int iters = opt.iters > 0 ? opt.iters : defaultIters(bytes);
    const int warmup = opt.warmup >= 0 ? opt.warmup : defaultWarmup(bytes);

    SizeRun run(desc, ctx, layout, opt.check);
    ++sizesRun;
    unsigned long long wrong = 0;
    unsigned long long mpiWrong = 0;
    run.block(false, warmup, &wrong);
    if (opt.vsMpi) run.block(true, warmup, &mpiWrong);
    double seconds = 0;
    double mpiSeconds = 0;
    if (opt.vsMpi) {
      const int blockLen = std::max(1, iters / kBlocksVsMpi);
      for (int done = 0; done < iters; done += blockLen) {
        const int k = std::min(blockLen, iters - done);
        seconds += run.block(false, k, &wrong);
        mpiSeconds += run.block(true, k, &mpiWrong);
      }
    } else {
      seconds = run.block(false, iters, &wrong);
    }
    const std::string algorithm = unwrapComm(comm)->lastAlgorithm();
    const double predictedUs = unwrapComm(comm)->lastPredictedSeconds() * 1e6;

    const Latency lat = reduceLatency(seconds, iters, ctx.nranks);
    const Latency mpiLat = opt.vsMpi ? reduceLatency(mpiSeconds, iters, ctx.nranks) : Latency{};
    wrong = sumOverRanks(wrong);
    mpiWrong = sumOverRanks(mpiWrong);
    totalWrong += wrong + mpiWrong;
    if (ctx.rank != 0) continue;

    const double algbw = lat.avgUs > 0 ? layout.algBytes / (lat.avgUs * 1e-6) / 1e9 : 0;
    const double busbw = algbw * desc.busbwFactor(ctx.nranks);
    std::vector<std::string> cells{std::to_string(layout.bytes),
                                   fmt("%.2f", lat.avgUs),
                                   fmt("%.2f", lat.minUs),
                                   fmt("%.2f", lat.maxUs),
                                   std::to_string(iters),
                                   desc.hasBandwidth ? fmt("%.2f", algbw) : "-",
                                   desc.hasBandwidth ? fmt("%.2f", busbw) : "-",
                                   opt.check ? std::to_string(wrong) : "N/A",
                                   algorithm};
    if (opt.vsMpi) {
      cells.push_back(fmt("%.2f", mpiLat.avgUs));
      if (opt.full) {
        cells.push_back(fmt("%.2f", mpiLat.minUs));
        cells.push_back(fmt("%.2f", mpiLat.maxUs));
      }
      if (opt.check) cells.push_back(std::to_string(mpiWrong));
      cells.push_back(mpiLat.avgUs > 0 ? fmt("%.2f", lat.avgUs / mpiLat.avgUs) : "-");
    }
    if (opt.full) cells.push_back(std::to_string(lat.slowestRank));
    if (opt.predict) cells.push_back(fmt("%.2f", predictedUs));
    table.printRow(cells);

    nlohmann::json row = {{"size", layout.bytes},   {"count", layout.count},
                          {"iterations", iters},    {"warmup", warmup},
                          {"avg_us", lat.avgUs},    {"min_us", lat.minUs},
                          {"max_us", lat.maxUs},    {"slowest_rank", lat.slowestRank},
                          {"algorithm", algorithm}, {"predicted_us", predictedUs}};
    if (desc.hasBandwidth) {
      row["algbw_gbps"] = algbw;
      row["busbw_gbps"] = busbw;
    }
    if (opt.check) row["wrong"] = wrong;
    if (opt.vsMpi) {
      row["mpi_avg_us"] = mpiLat.avgUs;
      row["mpi_min_us"] = mpiLat.minUs;
      row["mpi_max_us"] = mpiLat.maxUs;
      if (opt.check) row["mpi_wrong"] = mpiWrong;
      if (mpiLat.avgUs > 0) row["ratio"] = lat.avgUs / mpiLat.avgUs;
    }
    rows.push_back(std::move(row));
  }

  if (sizesRun == 0) {  // every rank got here alike
    throw UsageError("-m " + opt.sizes + ": no message size in the range could be run");
  }
  if (ctx.rank == 0) {
    if (opt.check) {
      std::printf("# Check: %s (%llu wrong elements)\n", totalWrong == 0 ? "passed" : "FAILED",
                  totalWrong);
    }
    if (json.is_open()) {
      nlohmann::json doc = {{"benchmark", "mtxcomm_bench"},
                            {"collective", desc.name},
                            {"datatype", datatypeName(ctx.dtype)},
                            {"ranks", ctx.nranks},
                            {"transport", unwrapComm(comm)->transportName()},
                            {"in_place", ctx.inPlace},
                            {"check", opt.check},
                            {"vs_mpi", opt.vsMpi},
                            {"algorithm", algoText},
                            {"size_meaning", desc.sizeNote},
                            {"rows", rows}};
      if (reduces) doc["op"] = opName(ctx.op);
      if (rooted) doc["root"] = ctx.root;
      if (desc.hasBandwidth) doc["busbw_factor"] = desc.busbwFormula;
      nlohmann::json env = nlohmann::json::object();
      for (const char* name : kEnvRecorded) env[name] = envValue(name);
      doc["environment"] = env;
      json << doc.dump(2) << "\n";
      if (!json) std::fprintf(stderr, "mtxcomm_bench: writing %s failed\n", opt.json.c_str());
    }
  }
  return totalWrong == 0 ? 0 : 1;
}

// --tune: measures the cost model's parameters on this job and writes them to opt.op's file.
int runTuneCommand(const Options& opt, int worldRank) {
  const auto [minBytes, maxBytes] = parseSizeRange(opt.sizes);
  mtxcomm_comm_t comm = initCommOrAbort(worldRank);
  const int rc = runTune(comm, opt.op, minBytes, maxBytes);
  mtxcomm_comm_destroy(comm);
  return rc;
}

}  // namespace
}  // namespace bench
}  // namespace mtxcomm

int main(int argc, char** argv) {
  using mtxcomm::bench::Options;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  Options opt;
  CLI::App app{"mtxcomm_bench: latency and bandwidth of an mtxcomm collective (run under mpirun)"};
  std::vector<std::string> collectives;
  for (const auto& d : mtxcomm::bench::descriptors()) collectives.emplace_back(d.name);
  std::vector<std::string> dtypes;
  for (int i = 0; i < MTXCOMM_NUM_DATATYPES; ++i) {
    dtypes.emplace_back(mtxcomm::datatypeName(static_cast<mtxcomm_datatype_t>(i)));
  }
  std::vector<std::string> ops;
  for (int i = 0; i < MTXCOMM_NUM_OPS; ++i) {
    ops.emplace_back(mtxcomm::opName(static_cast<mtxcomm_op_t>(i)));
  }
  std::string algoHelp =
      "Algorithms for -a (auto, or one of these per collective; mtxcomm_info "
      "lists them with their descriptions):";
  for (const auto& d : mtxcomm::bench::descriptors()) {
    std::vector<std::string> names;
    for (const char* n : mtxcomm::algorithmNames(d.coll)) names.emplace_back(n);
    algoHelp += std::string("\n  ") + d.name + ": " + mtxcomm::bench::joined(names);
  }
  app.footer(algoHelp);
  std::vector<std::string> commands = collectives;
  commands.emplace_back("tune");  // the same as --tune (Open MPI's mpirun also reads --tune)
  app.add_option("collective", opt.collective,
                 "the collective to run, or tune (the same as --tune)")
      ->check(CLI::IsMember(commands));
  app.add_option("-m,--message-size", opt.sizes,
                 "MIN:MAX or MAX in bytes, sizes doubling from MIN (default 4:4M); suffixes K, "
                 "M, G, T are binary (1K = 1024), case-insensitive, optionally followed by B or "
                 "iB; at most 1T");
  app.add_option("-i,--iterations", opt.iters,
                 "iterations per size (default 100 up to 64K, 50 up to 1M, 20 above)")
      ->check(CLI::Range(1, INT_MAX));
  app.add_option("-x,--warmup", opt.warmup, "warmup iterations per size (default 10, 2 above 1M)")
      ->check(CLI::Range(0, INT_MAX));
  app.add_flag("-f,--full", opt.full,
               "full output: MPI min/max latency with --vs-mpi, and the slowest rank");
  app.add_flag("-c,--check", opt.check,
               "check every call's result; exit 1 if any element is wrong");
  app.add_option("-a,--algorithm", opt.algo,
                 "force the algorithm (sets MTXCOMM_<COLLECTIVE>_ALGO); the names depend on the "
                 "collective, see below or mtxcomm_info");
  app.add_option("-T,--datatype", opt.dtype,
                 "datatype: " + mtxcomm::bench::joined(dtypes) + " (default float32)");
  CLI::Option* opOpt = app.add_option("-o,--op", opt.op,
                                      "reduction op of allreduce, reduce and reduce_scatter: " +
                                          mtxcomm::bench::joined(ops) + " (default sum)");
  CLI::Option* rootOpt =
      app.add_option("-r,--root", opt.root, "root of broadcast and reduce (default 0)");
  app.add_flag("--in-place", opt.inPlace, "in place (NCCL buffer conventions)");
  app.add_flag("--vs-mpi", opt.vsMpi, "also time the same MPI collective, interleaved");
  app.add_option("--json", opt.json, "also write every row as JSON to FILE (rank 0)");
  app.add_option("-d,--device", opt.device,
                 "where the buffers live: host (default) or cuda (device buffers on GPU rank % "
                 "devices, one stream; needs a CUDA build)");
  app.add_flag("--predict", opt.predict,
               "also print the cost model's predicted latency of the algorithm used");
  app.add_flag("--tune", opt.tune,
               "measure the cost model's alpha/beta/gamma per level (intra-node, inter-node) on "
               "this job and write them to the file given by -o (default mtxcomm_tuning.json), "
               "for MTXCOMM_TUNING_FILE; -m sets the sizes (default 8:4M)");

  int rc = 0;
  try {
    app.parse(argc, argv);
    opt.rootGiven = rootOpt->count() > 0;
    opt.opGiven = opOpt->count() > 0;
    if (opt.collective == "tune") {
      opt.tune = true;
      opt.collective.clear();
    }
    if (opt.tune) {
      if (!opt.collective.empty()) {
        throw mtxcomm::bench::UsageError("--tune measures its own collectives: drop " +
                                         opt.collective);
      }
      if (!opt.opGiven) opt.op = "mtxcomm_tuning.json";
      if (app.get_option("-m")->count() == 0) opt.sizes = "8:4M";
      rc = mtxcomm::bench::runTuneCommand(opt, rank);
    } else if (opt.collective.empty()) {
      throw mtxcomm::bench::UsageError("name a collective (" + mtxcomm::bench::joined(collectives) +
                                       "), or --tune");
    } else {
      rc = mtxcomm::bench::runBenchmark(opt, rank, size);
    }
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same command line. --help exits 0; any parse error exits 2 like the
    // benchmark's own usage errors (CLI11's own codes would be 1xx).
    const int code = e.get_exit_code();
    if (rank == 0) app.exit(e);
    rc = code == static_cast<int>(CLI::ExitCodes::Success) ? 0 : 2;
  } catch (const mtxcomm::bench::UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "mtxcomm_bench: %s\n", e.what());
    rc = 2;
  } catch (const mtxcomm::bench::ReportedFailure&) {
    rc = 1;  // the failing ranks printed why; every rank is here
  } catch (const std::bad_alloc&) {
    // Only this rank may be here: abort the job rather than leave other ranks waiting.
    std::fprintf(stderr, "mtxcomm_bench: rank %d: out of memory (std::bad_alloc)\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mtxcomm_bench: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
