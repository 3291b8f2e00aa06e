#include "bench/bench_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "algos/registry.h"
#include "lib/base/dtype.h"

namespace mtxcomm {
namespace bench {

std::string envValue(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "(default)";
}

// Many iterations where a call takes a microsecond (OSU runs 10000 up to 8 KiB): with 100, a
// sub-microsecond size was timed over ~50 us, so a scheduler tick or the first touch of the
// lines a new size uses moved it by 30-80% (64 B allreduce at 2 ranks: 1.07-1.31x Open MPI
// with 100 iterations, 0.67-0.79x with 2000).
int defaultIters(size_t bytes) {
  return bytes <= 8 * kKiB ? 2000 : bytes <= 64 * kKiB ? 500 : bytes <= kMiB ? 50 : 20;
}
int defaultWarmup(size_t bytes) {
  return bytes <= 8 * kKiB ? 200 : bytes <= 64 * kKiB ? 50 : bytes <= kMiB ? 10 : 2;
}
const char* defaultItersText() { return "2000 up to 8K, 500 up to 64K, 50 up to 1M, 20 above"; }
const char* defaultWarmupText() { return "200 up to 8K, 50 up to 64K, 10 up to 1M, 2 above"; }

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

std::pair<size_t, size_t> parseSizeRange(const std::string& s) {
  const size_t colon = s.find(':');
  const std::string minText = colon == std::string::npos ? "" : s.substr(0, colon);
  const std::string maxText = colon == std::string::npos ? s : s.substr(colon + 1);
  const auto maxBytes = parseBytes(maxText);
  std::optional<size_t> minBytes = parseBytes(minText);
  if (colon == std::string::npos && maxBytes) minBytes = std::min<size_t>(4, *maxBytes);
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

int parseCommandLine(int argc, char** argv, int rank, Options& opt) {
  CLI::App app{"mtxcomm_bench: latency and bandwidth of an mtxcomm collective (run under mpirun)"};
  std::vector<std::string> collectives;
  for (const auto& d : descriptors()) collectives.emplace_back(d.name);
  std::vector<std::string> dtypes;
  for (int i = 0; i < MTXCOMM_NUM_DATATYPES; ++i) {
    dtypes.emplace_back(datatypeName(static_cast<mtxcomm_datatype_t>(i)));
  }
  std::vector<std::string> ops;
  for (int i = 0; i < MTXCOMM_NUM_OPS; ++i) {
    ops.emplace_back(opName(static_cast<mtxcomm_op_t>(i)));
  }
  std::string algoHelp =
      "Algorithms for -a (auto, or one of these per collective; mtxcomm_info "
      "lists them with their descriptions):";
  for (const auto& d : descriptors()) {
    std::vector<std::string> names;
    for (const char* n : algorithmNames(d.coll)) names.emplace_back(n);
    algoHelp += std::string("\n  ") + d.name + ": " + joined(names);
  }
  app.footer(algoHelp);
  std::vector<std::string> commands = collectives;
  commands.emplace_back("tune");  // the same as --tune (Open MPI's mpirun also reads --tune)
  commands.emplace_back("report");
  app.add_option("collective", opt.collective,
                 "the collective to run, tune (the same as --tune), or report (-o DIR: every "
                 "collective and algorithm with --vs-mpi, -c and --floor, the tuner, a projection, "
                 "DIR/index.html; -m sets the sizes, default 4:64M)")
      ->check(CLI::IsMember(commands));
  app.add_option("-m,--message-size", opt.sizes,
                 "MIN:MAX or MAX in bytes, sizes doubling from MIN (default 4:4M); suffixes K, "
                 "M, G, T are binary (1K = 1024), case-insensitive, optionally followed by B or "
                 "iB; at most 1T");
  app.add_option("-i,--iterations", opt.iters,
                 std::string("iterations per size (default ") + defaultItersText() + ")")
      ->check(CLI::Range(1, INT_MAX));
  app.add_option("-x,--warmup", opt.warmup,
                 std::string("warmup iterations per size (default ") + defaultWarmupText() + ")")
      ->check(CLI::Range(0, INT_MAX));
  app.add_flag("-f,--full", opt.full,
               "full output: MPI min/max latency with --vs-mpi, and the slowest rank");
  app.add_flag("-c,--check", opt.check,
               "check every call's result; exit 1 if any element is wrong");
  app.add_option("-a,--algorithm", opt.algo,
                 "force the algorithm (sets MTXCOMM_<COLLECTIVE>_ALGO); the names depend on the "
                 "collective, see below or mtxcomm_info");
  app.add_option("-T,--datatype", opt.dtype, "datatype: " + joined(dtypes) + " (default float32)");
  CLI::Option* opOpt =
      app.add_option("-o,--op", opt.op,
                     "reduction op of allreduce, reduce and reduce_scatter: " + joined(ops) +
                         " (default sum; adasum: allreduce of floating types only)");
  CLI::Option* rootOpt =
      app.add_option("-r,--root", opt.root, "root of broadcast and reduce (default 0)");
  app.add_flag("--in-place", opt.inPlace, "in place (NCCL buffer conventions)");
  app.add_flag("--vs-mpi", opt.vsMpi, "also time the same MPI collective, interleaved");
  app.add_flag("--floor", opt.floor,
               "also measure the floor: the least data movement the collective needs on this "
               "layout (bench/bench_floor.h), and the collective's time as a multiple of it");
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same command line. --help exits 0; any parse error exits 2 like the
    // benchmark's own usage errors (CLI11's own codes would be 1xx).
    const int code = e.get_exit_code();
    if (rank == 0) app.exit(e);
    return code == static_cast<int>(CLI::ExitCodes::Success) ? 0 : 2;
  }
  opt.rootGiven = rootOpt->count() > 0;
  opt.opGiven = opOpt->count() > 0;
  opt.sizesGiven = app.get_option("-m")->count() > 0;
  return -1;
}

}  // namespace bench
}  // namespace mtxcomm
