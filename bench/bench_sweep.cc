// mtxcomm_bench report (bench_sweep.h).
#include "bench/bench_sweep.h"

#include <mpi.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "algos/registry.h"
#include "bench/bench_descriptors.h"
#include "bench/bench_tune.h"
#include "lib/base/topology.h"
#include "lib/comm/cost_model.h"
#include "lib/comm/select.h"

namespace mtxcomm {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

bool makeDir(const std::string& path) {
  std::string partial;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') partial = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The interpreter the page is rendered with: $MTXCOMM_PYTHON; else the project's virtual
// environment when this program runs from a build tree inside the checkout that has one
// (<checkout>/build/bench/mtxcomm_bench next to <checkout>/.venv, as scripts/setup_and_run.sh
// makes them), so that the report renders without an activated environment; else python3.
std::string renderPython() {
  const char* py = std::getenv("MTXCOMM_PYTHON");
  if (py && *py) return py;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    for (int up = 0; up < 4; ++up) {
      const size_t slash = dir.rfind('/');
      if (slash == std::string::npos || slash == 0) break;
      dir.resize(slash);
      const std::string venv = dir + "/.venv/bin/python";
      if (access(venv.c_str(), X_OK) == 0) return venv;
    }
  }
  return "python3";
}

extern "C" char** environ;

// Runs `python -m mtxcomm.bench_report outDir` without a shell (any character in the paths is
// safe); returns a description of how it ended: empty when it exited 0.
std::string runRenderer(const std::string& python, const std::string& outDir) {
  std::vector<std::string> args{python, "-m", "mtxcomm.bench_report", outDir};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
  if (err != 0) return "cannot start " + python + ": " + std::strerror(err);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return std::string("waitpid: ") + std::strerror(errno);
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st) == 0 ? "" : "exit " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return "killed by signal " + std::to_string(WTERMSIG(st));
  return "ended with status " + std::to_string(st);
}

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string firstLineWith(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) return "";
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  }
  return "";
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// This machine (rank 0's): CPU model, cores, caches, memory.
nlohmann::json machine() {
  nlohmann::json m;
  m["cpu"] = firstLineWith("/proc/cpuinfo", "model name");
  m["logical_cpus"] = sysconf(_SC_NPROCESSORS_ONLN);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  m["memory_bytes"] = static_cast<double>(pages) * static_cast<double>(page);
  nlohmann::json caches = nlohmann::json::array();
  for (int i = 0; i < 8; ++i) {
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string size = trimmed(readFile(base + "size"));
    if (size.empty()) break;
    caches.push_back({{"level", trimmed(readFile(base + "level"))},
                      {"type", trimmed(readFile(base + "type"))},
                      {"size", size},
                      {"shared_cpu_list", trimmed(readFile(base + "shared_cpu_list"))}});
  }
  m["caches"] = caches;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  m["host"] = host;
  return m;
}

// The job's layout: ranks, nodes (by MPI's shared-memory split), ranks per node, hosts.
nlohmann::json layout(int worldRank, int worldSize) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, worldRank, MPI_INFO_NULL, &node);
  int local = 0, localSize = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &localSize);
  MPI_Comm_free(&node);
  int leader = local == 0 ? 1 : 0, nodes = 0, maxLocal = 0;
  MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&localSize, &maxLocal, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(static_cast<size_t>(worldSize) * MPI_MAX_PROCESSOR_NAME);
  MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
             0, MPI_COMM_WORLD);
  nlohmann::json hosts = nlohmann::json::array();
  for (int r = 0; r < worldSize; ++r)
    hosts.push_back(std::string(&all[r * MPI_MAX_PROCESSOR_NAME]));
  return {{"ranks", worldSize}, {"nodes", nodes}, {"ranks_per_node", maxLocal}, {"hosts", hosts}};
}

std::string duration(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600,
                  static_cast<int>(s) % 3600 / 60);
  }
  return buf;
}

// Rank 0's progress line: "[run 3/40] allreduce -a ring  12/25 sizes  4m10s elapsed, ETA 6m".
// The ETA weighs each size by 1 + bytes / 16 KiB (a large size takes far longer than a small
// one, even with fewer iterations), from the time the weights done so far took.
class Progress {
 public:
  Progress(size_t runs, const std::vector<size_t>& sizes)
      : runs_(runs), start_(Clock::now()), tty_(isatty(STDERR_FILENO) != 0) {
    double sum = 0;
    for (const size_t b : sizes) {
      sum += weight(b);
      cumulative_.push_back(sum);
    }
    if (cumulative_.empty()) cumulative_.push_back(1);
    perRun_ = cumulative_.back();
  }
  void begin(size_t run, const std::string& what) {
    run_ = run;
    what_ = what;
    show(0, cumulative_.size());
  }
  void size(size_t done, size_t total) { show(done, total); }
  void end(size_t total) {
    finished_ += perRun_;
    show(total, total, /*ended=*/true);
    if (!tty_) return;
    std::fputc('\n', stderr);
  }

 private:
  static double weight(size_t bytes) { return 1.0 + static_cast<double>(bytes) / 16384.0; }
  void show(size_t done, size_t total, bool ended = false) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    double within = 0;
    if (!ended && done > 0) within = cumulative_[std::min(done, cumulative_.size()) - 1];
    const double unitsDone = finished_ + within;
    const double unitsAll = static_cast<double>(runs_) * perRun_;
    std::string eta = "?";
    if (unitsDone > 0) eta = duration(elapsed / unitsDone * std::max(0.0, unitsAll - unitsDone));
    std::fprintf(stderr, "%s[run %zu/%zu] %-34s %3zu/%zu sizes  %s elapsed, ETA %s%s",
                 tty_ ? "\r" : "", run_ + 1, runs_, what_.c_str(), done, total,
                 duration(elapsed).c_str(), eta.c_str(), tty_ ? "\033[K" : "\n");
    std::fflush(stderr);
  }
  size_t runs_, run_ = 0;
  double perRun_ = 1, finished_ = 0;
  std::vector<double> cumulative_;
  std::string what_;
  Clock::time_point start_;
  bool tty_;
};

void writeAtomically(const std::string& path, const nlohmann::json& doc) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << doc.dump(1) << "\n";
  }
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

nlohmann::json projection(const std::string& tuningPath, int ranksPerNode, bool networkMeasured) {
  CostParams params;
  std::string source = "the library's default parameters (lib/comm/cost_model.h)";
  if (!tuningPath.empty()) {
    params = loadTuningFile(tuningPath);
    source = tuningPath;
    if (!networkMeasured) {
      params.inter = CostParams{}.inter;
      source +=
          " (intra-node level; inter-node: the library's defaults, this job has no "
          "network to measure)";
    }
  }
  const char* names[] = {"ring", "recursive_doubling", "hierarchical"};
  nlohmann::json rows = nlohmann::json::array();
  const size_t sizes[] = {size_t{1} << 20, size_t{16} << 20, size_t{256} << 20};
  for (int nodes = 2; nodes <= 1024; nodes *= 2) {
    const int n = nodes * ranksPerNode;
    std::vector<int> nodeOf(n);
    for (int r = 0; r < n; ++r) nodeOf[r] = r / ranksPerNode;
    const Topology topo = Topology::forTest(nodeOf);
    CommInfo info;
    info.nranks = n;
    info.topo = &topo;
    info.cost = &params;
    for (const size_t bytes : sizes) {
      CollArgs args;
      args.coll = Collective::kAllreduce;
      args.count = bytes / 4;
      args.dtype = MTXCOMM_FLOAT32;
      args.elemSize = 4;
      nlohmann::json row = {
          {"nodes", nodes}, {"ranks_per_node", ranksPerNode}, {"ranks", n}, {"bytes", bytes}};
      nlohmann::json pred = nlohmann::json::object();
      for (const char* name : names) {
        const Algorithm* a = findAlgorithm(Collective::kAllreduce, name);
        if (!a) continue;
        if (const char* why = algorithmDeclines(*a, args, info)) {
          pred[name] = nullptr;
          row["declines"][name] = why;
        } else {
          pred[name] = predictSeconds(*a, args, info);
        }
      }
      row["predicted_seconds"] = pred;
      const Algorithm* pick = defaultAlgorithm(args, info);
      row["selected"] = pick ? pick->name : "";
      rows.push_back(row);
    }
  }
  return {
      {"parameters", source},
      {"network_measured", networkMeasured},
      {"intra",
       {{"alpha", params.intra.alpha}, {"beta", params.intra.beta}, {"gamma", params.intra.gamma}}},
      {"inter",
       {{"alpha", params.inter.alpha}, {"beta", params.inter.beta}, {"gamma", params.inter.gamma}}},
      {"rows", rows}};
}

int runReport(const Options& opt, int worldRank, int worldSize,
              const std::function<int(const Options&)>& runOne) {
  if (opt.outDir.empty()) throw UsageError("report needs -o DIR (where the report is written)");
  int ok = 1;
  if (worldRank == 0) ok = makeDir(opt.outDir + "/runs") ? 1 : 0;
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!ok) throw UsageError("report -o " + opt.outDir + ": cannot create the directory");
  const std::string sizes = opt.sizesGiven ? opt.sizes : "4:64M";
  const auto [minBytes, maxBytes] = parseSizeRange(sizes);
  if (minBytes == 0) {
    // A 0-byte call moves nothing: it has no bandwidth, floor or ratio to plot, and the page's
    // axes are log-scaled.
    throw UsageError(
        "report -m " + sizes + ": the sizes must start at 1 byte or more (e.g. -m " +
        (maxBytes > 0 ? "1:" + sizes.substr(sizes.find(':') + 1) : std::string("4:64K")) + ")");
  }
  const size_t sizesPerRun = messageSizes(minBytes, maxBytes).size();

  struct Run {
    const CollDescriptor* desc;
    std::string algo;
  };
  std::vector<Run> runs;
  for (const CollDescriptor& d : descriptors()) {
    runs.push_back({&d, "auto"});
    if (d.coll == Collective::kBarrier) continue;
    for (const char* name : algorithmNames(d.coll)) {
      if (std::string(name) == "adasum") continue;  // op adasum only; the sweep sums
      runs.push_back({&d, name});
    }
  }

  nlohmann::json doc;
  if (worldRank == 0) {
    doc["benchmark"] = "mtxcomm_bench report";
    doc["sizes"] = sizes;
    doc["machine"] = machine();
    doc["complete"] = false;
  }
  const nlohmann::json lay = layout(worldRank, worldSize);
  if (worldRank == 0) {
    doc["layout"] = lay;
    doc["runs"] = nlohmann::json::array();
  }
  const std::string results = opt.outDir + "/results.json";
  if (worldRank == 0) writeAtomically(results, doc);

  Progress progress(runs.size(), messageSizes(minBytes, maxBytes));
  int status = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    Options o;
    o.collective = run.desc->name;
    o.algo = run.algo;
    o.sizes = sizes;
    o.sizesGiven = true;
    o.iters = opt.iters;  // -i and -x, when given, hold for every run of the report
    o.warmup = opt.warmup;
    o.check = true;
    o.vsMpi = true;
    o.floor = true;
    o.quiet = true;
    o.json = opt.outDir + "/runs/" + std::string(run.desc->name) + "." + run.algo + ".json";
    const std::string what = std::string(run.desc->name) + " -a " + run.algo;
    if (worldRank == 0) progress.begin(i, what);
    o.progress = [&](size_t done, size_t total, const std::string&) { progress.size(done, total); };
    int rc = 0;
    try {
      rc = runOne(o);
    } catch (const UsageError& e) {  // every rank alike: the run does not apply
      if (worldRank == 0)
        std::fprintf(stderr, "\nmtxcomm_bench report: %s: %s\n", what.c_str(), e.what());
      rc = -1;
    }
    if (rc > 0) status = 1;  // wrong results
    if (worldRank == 0) {
      progress.end(sizesPerRun);  // a declined run stops early: counted as whole
      nlohmann::json entry = {{"collective", run.desc->name},
                              {"algorithm", run.algo},
                              {"status", rc == 0  ? "ok"
                                         : rc > 0 ? "wrong results"
                                                  : "skipped"}};
      std::ifstream f(o.json);
      if (rc >= 0 && f) {
        try {
          const nlohmann::json r = nlohmann::json::parse(f);
          entry["rows"] = r.value("rows", nlohmann::json::array());
          entry["size_meaning"] = r.value("size_meaning", "");
          entry["transport"] = r.value("transport", "");
          entry["busbw_factor"] = r.value("busbw_factor", "");
          bool declined = false;
          if (run.algo != "auto") {
            for (const auto& row : entry["rows"]) {
              if (row.value("algorithm", "") != run.algo) declined = true;
            }
          }
          entry["declined"] = declined;
        } catch (const std::exception& e) {
          entry["status"] = std::string("unreadable: ") + e.what();
        }
      }
      doc["runs"].push_back(entry);
      writeAtomically(results, doc);
    }
  }

  // The tuner, on the same job; then the projection from its file.
  const std::string tuning = opt.outDir + "/tuning.json";
  {
    mtxcomm_comm_t comm = nullptr;
    if (mtxcomm_comm_init_from_env(&comm) != MTXCOMM_SUCCESS) {
      std::fprintf(stderr, "mtxcomm_bench report: rank %d: init failed: %s\n", worldRank,
                   mtxcomm_get_last_error(nullptr));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (worldRank == 0) std::fprintf(stderr, "[tune] measuring the cost model's parameters\n");
    // At least up to 1 MiB, whatever the sweep's sizes: beta needs large messages to be fitted.
    const size_t tuneMax = std::clamp<size_t>(maxBytes, size_t{1} << 20, size_t{4} << 20);
    const int rc = runTune(comm, tuning, 8, tuneMax);
    mtxcomm_comm_destroy(comm);
    if (rc != 0) status = 1;
  }
  if (worldRank == 0) {
    try {
      doc["tuning"] = nlohmann::json::parse(readFile(tuning));
      doc["projection"] =
          projection(tuning, lay.value("ranks_per_node", 1), lay.value("nodes", 1) > 1);
    } catch (const std::exception& e) {
      doc["projection_error"] = e.what();
    }
    doc["complete"] = true;
    writeAtomically(results, doc);
    const std::string python = renderPython();
    std::fprintf(stderr, "[render] %s -m mtxcomm.bench_report %s\n", python.c_str(),
                 opt.outDir.c_str());
    const std::string how = runRenderer(python, opt.outDir);
    if (!how.empty()) {
      std::fprintf(stderr,
                   "mtxcomm_bench report: rendering failed (%s); the measurements are in %s. "
                   "Render them with `python3 -m mtxcomm.bench_report %s` in an environment "
                   "with the mtxcomm package and matplotlib (scripts/setup_python.sh), or set "
                   "MTXCOMM_PYTHON to such an interpreter.\n",
                   how.c_str(), results.c_str(), opt.outDir.c_str());
      status = 1;
    } else {
      std::fprintf(stderr, "mtxcomm_bench report: %s/index.html\n", opt.outDir.c_str());
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return status;
}

}  // namespace bench
}  // namespace mtxcomm
