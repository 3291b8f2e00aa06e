// mtxcomm_bench's command line: the options, their parsing and validation helpers, and the two
// UsageError (a bad command line or configuration).
#ifndef MTXCOMM_BENCH_BENCH_OPTIONS_H_
#define MTXCOMM_BENCH_BENCH_OPTIONS_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_descriptors.h"

namespace mtxcomm {
namespace bench {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;
constexpr size_t kMaxBytes = size_t{1} << 40;

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
  bool sizesGiven = false;      // -m on the command line
  bool floor = false;           // --floor: the least data movement's time beside each size
  std::string outDir;           // report -o DIR
  // Set by `report` (bench_sweep.h): no table on stdout, and after each size this is called
  // on rank 0 with the sizes done and the sizes of the run.
  bool quiet = false;
  std::function<void(size_t done, size_t total, const std::string& algorithm)> progress;
};

// A bad command line or configuration: rank 0 prints it, every rank exits with status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses the command line into opt (every rank parses the same). Returns -1 to go on, or the
// exit status (--help: 0, a bad command line: 2, after printing on rank 0).
int parseCommandLine(int argc, char** argv, int rank, Options& opt);

// Iterations and warmup per size when -i / -x are not given (like OSU: many for small messages,
// fewer for large ones).
int defaultIters(size_t bytes);
int defaultWarmup(size_t bytes);
// The two rules above in words, for --help and the output's header.
const char* defaultItersText();
const char* defaultWarmupText();

// "4", "64K", "4M", "1G", "1T" (binary multiples: K = 1024; case-insensitive; an optional
// trailing B or iB, as in 4KB or 4KiB; a bare B means bytes). At most kMaxBytes (1T).
std::optional<size_t> parseBytes(std::string s);
// -m MIN:MAX or -m MAX (MIN then defaults to min(4, MAX)), as OSU. Throws UsageError.
std::pair<size_t, size_t> parseSizeRange(const std::string& s);
// Sizes double from MIN up to MAX (0 first when MIN is 0, then 1, 2, 4, ...).
std::vector<size_t> messageSizes(size_t minBytes, size_t maxBytes);
std::string joined(const std::vector<std::string>& v);
mtxcomm_datatype_t parseDatatypeOrThrow(const std::string& name);
mtxcomm_op_t parseOpOrThrow(const std::string& name);
// Throws UsageError unless algo is "auto" or one of desc's algorithms.
void checkAlgorithm(const CollDescriptor& desc, const std::string& algo);

// Environment variables that shape the results, recorded in the header and in --json (the
// collective's MTXCOMM_<COLLECTIVE>_ALGO is recorded as the Algorithm line).
inline constexpr const char* kEnvRecorded[] = {"MTXCOMM_SHM", "MTXCOMM_SHM_SLOT_BYTES",
                                               "MTXCOMM_SEGMENT_BYTES"};
std::string envValue(const char* name);

}  // namespace bench
}  // namespace mtxcomm

#endif  // MTXCOMM_BENCH_BENCH_OPTIONS_H_
