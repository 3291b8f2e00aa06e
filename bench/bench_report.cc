#include "bench/bench_report.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>

#include "lib/base/dtype.h"

namespace mtxcomm {
namespace bench {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

// Aligned columns: the first one ("# Size") left-aligned, the others right-aligned.
void Report::Table::add(const std::string& title, int width) {
  cols_.push_back({title, std::max<int>(width, static_cast<int>(title.size()) + 2)});
}

void Report::Table::printHeader() const {
  std::string line;
  for (size_t i = 0; i < cols_.size(); ++i)
    line += cell(i, i == 0 ? "# " + cols_[i].title : cols_[i].title);
  std::printf("%s\n", line.c_str());
}

void Report::Table::printRow(const std::vector<std::string>& values) const {
  std::string line;
  for (size_t i = 0; i < values.size(); ++i) line += cell(i, values[i]);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string Report::Table::cell(size_t i, const std::string& v) const {
  const int w = cols_[i].width;
  char buf[256];
  std::snprintf(buf, sizeof buf, i == 0 ? "%-*s" : "%*s", w, v.c_str());
  return buf;
}

Report::Report(const Options& opt, const BenchContext& ctx, const RunInfo& info)
    : opt_(opt), ctx_(ctx), info_(info) {
  int jsonOk = 1;
  if (ctx.rank == 0 && !opt.json.empty()) {
    json_.open(opt.json);
    jsonOk = json_.is_open() ? 1 : 0;
  }
  MPI_Bcast(&jsonOk, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!jsonOk) throw UsageError("--json " + opt.json + ": cannot open for writing");
  table_.add("Size", 10);
  table_.add("Avg Latency(us)", 17);
  table_.add("Min Latency(us)", 17);
  table_.add("Max Latency(us)", 17);
  table_.add("Iterations", 12);
  table_.add("algbw(GB/s)", 13);
  table_.add("busbw(GB/s)", 13);
  table_.add("#wrong", 8);
  table_.add("Algorithm", 20);
  if (opt.vsMpi) {
    table_.add("MPI Avg(us)", 13);
    if (opt.full) {
      table_.add("MPI Min(us)", 13);
      table_.add("MPI Max(us)", 13);
    }
    if (opt.check) table_.add("MPI #wrong", 11);
    table_.add("Ratio", 8);
  }
  if (opt.full) table_.add("Slowest rank", 14);
  if (opt.predict) table_.add("Predicted(us)", 15);
  if (opt.floor) {
    table_.add("Floor(us)", 12);
    table_.add("x floor", 9);
    table_.add("Best(us)", 11);
    table_.add("best x floor", 14);
  }
}

void Report::printHeader() const {
  if (ctx_.rank != 0 || opt_.quiet) return;
  std::printf("# mtxcomm_bench %s: %s%s%s, %d ranks, transport %s, %s, check %s\n",
              info_.desc->name, info_.hasData ? datatypeName(ctx_.dtype) : "no data",
              info_.reduces ? " " : "", info_.reduces ? opName(ctx_.op) : "", ctx_.nranks,
              info_.transport.c_str(), ctx_.inPlace ? "in-place" : "out-of-place",
              opt_.check ? "on" : "off");
  std::printf("# %s\n", info_.desc->sizeNote);
  if (ctx_.stream) {
    std::printf(
        "# Buffers: device memory (-d cuda), one stream; latency includes waiting for "
        "the stream; the Algorithm column names the device path\n");
  }
  if (info_.unitBytes > ctx_.elemSize) {
    std::printf(
        "# Sizes are rounded down to a multiple of n * elemsize = %zu bytes; smaller "
        "ones are skipped\n",
        info_.unitBytes);
  }
  if (info_.rooted) std::printf("# root %d\n", ctx_.root);
  std::string envText;
  for (const char* name : kEnvRecorded) {
    envText += (envText.empty() ? "" : ", ") + std::string(name) + "=" + envValue(name);
  }
  std::printf("# Environment: %s\n", envText.c_str());
  std::printf("# Algorithm: %s (the column names the one each size used)\n",
              info_.algoText.c_str());
  const std::string itersText =
      opt_.iters > 0 ? std::to_string(opt_.iters) + " per size" : defaultItersText();
  const std::string warmupText =
      opt_.warmup >= 0 ? std::to_string(opt_.warmup) : defaultWarmupText();
  std::printf("# Iterations: %s; warmup %s\n", itersText.c_str(), warmupText.c_str());
  std::printf("# Latency: per-rank average per call, then Avg/Min/Max over ranks (OSU)%s\n",
              opt_.check ? "; -c: each call timed alone, refill/check untimed" : "");
  if (info_.desc->hasBandwidth) {
    std::printf("# algbw = bytes / Avg latency (GB/s = 1e9 B/s); busbw = algbw * %s (nccl-tests)\n",
                info_.desc->busbwFormula);
  }
  if (opt_.check) {
    std::printf(
        "# #wrong: elements differing bitwise from the expected value, summed over ranks "
        "and all calls (warmup too)\n");
  }
  if (opt_.vsMpi) {
    std::printf(
        "# MPI: %s%s, warmed up and timed in blocks alternating with "
        "mtxcomm's; Ratio = the median over the block pairs of mtxcomm's time / MPI's (a "
        "preempted block moves one pair; < 1: mtxcomm faster)\n",
        info_.desc->mpiName, info_.hasData ? " on the same buffers" : "");
  }
  table_.printHeader();
  std::fflush(stdout);
}

void Report::addRow(const Layout& layout, const Timing& timing, const Measurement& m) {
  if (ctx_.rank != 0) return;
  const double algbw = m.lat.avgUs > 0 ? layout.algBytes / (m.lat.avgUs * 1e-6) / 1e9 : 0;
  const double busbw = algbw * info_.desc->busbwFactor(ctx_.nranks);
  std::vector<std::string> cells{std::to_string(layout.bytes),
                                 fmt("%.2f", m.lat.avgUs),
                                 fmt("%.2f", m.lat.minUs),
                                 fmt("%.2f", m.lat.maxUs),
                                 std::to_string(timing.iters),
                                 info_.desc->hasBandwidth ? fmt("%.2f", algbw) : "-",
                                 info_.desc->hasBandwidth ? fmt("%.2f", busbw) : "-",
                                 opt_.check ? std::to_string(m.wrong) : "N/A",
                                 m.algorithm};
  if (opt_.vsMpi) {
    cells.push_back(fmt("%.2f", m.mpiLat.avgUs));
    if (opt_.full) {
      cells.push_back(fmt("%.2f", m.mpiLat.minUs));
      cells.push_back(fmt("%.2f", m.mpiLat.maxUs));
    }
    if (opt_.check) cells.push_back(std::to_string(m.mpiWrong));
    cells.push_back(m.ratio > 0 ? fmt("%.2f", m.ratio) : "-");
  }
  if (opt_.full) cells.push_back(std::to_string(m.lat.slowestRank));
  if (opt_.predict) cells.push_back(fmt("%.2f", m.predictedUs));
  if (opt_.floor) {
    cells.push_back(m.floorUs >= 0 ? fmt("%.2f", m.floorUs) : "-");
    cells.push_back(m.floorUs > 0 ? fmt("%.2f", m.lat.avgUs / m.floorUs) : "-");
    cells.push_back(m.bestUs >= 0 ? fmt("%.2f", m.bestUs) : "-");
    cells.push_back(m.floorUs > 0 && m.bestUs >= 0 ? fmt("%.2f", m.bestUs / m.floorUs) : "-");
  }
  if (!opt_.quiet) table_.printRow(cells);

  nlohmann::json row = {{"size", layout.bytes},       {"count", layout.count},
                        {"iterations", timing.iters}, {"warmup", timing.warmup},
                        {"avg_us", m.lat.avgUs},      {"min_us", m.lat.minUs},
                        {"max_us", m.lat.maxUs},      {"slowest_rank", m.lat.slowestRank},
                        {"algorithm", m.algorithm},   {"predicted_us", m.predictedUs}};
  if (info_.desc->hasBandwidth) {
    row["algbw_gbps"] = algbw;
    row["busbw_gbps"] = busbw;
  }
  if (opt_.check) row["wrong"] = m.wrong;
  if (opt_.vsMpi) {
    row["mpi_avg_us"] = m.mpiLat.avgUs;
    row["mpi_min_us"] = m.mpiLat.minUs;
    row["mpi_max_us"] = m.mpiLat.maxUs;
    if (opt_.check) row["mpi_wrong"] = m.mpiWrong;
    if (m.ratio > 0) row["ratio"] = m.ratio;
  }
  if (opt_.floor && m.floorUs >= 0) {
    row["floor_us"] = m.floorUs;
    if (m.floorUs > 0) row["x_floor"] = m.lat.avgUs / m.floorUs;
    if (m.bestUs >= 0) row["best_us"] = m.bestUs;
    if (m.floorUs > 0 && m.bestUs >= 0) row["best_x_floor"] = m.bestUs / m.floorUs;
  }
  rows_.push_back(std::move(row));
}

void Report::finish(unsigned long long totalWrong) {
  if (ctx_.rank != 0) return;
  if (opt_.check && !opt_.quiet) {
    std::printf("# Check: %s (%llu wrong elements)\n", totalWrong == 0 ? "passed" : "FAILED",
                totalWrong);
  }
  if (json_.is_open()) {
    nlohmann::json doc = {{"benchmark", "mtxcomm_bench"},
                          {"collective", info_.desc->name},
                          {"datatype", datatypeName(ctx_.dtype)},
                          {"ranks", ctx_.nranks},
                          {"transport", info_.transport},
                          {"in_place", ctx_.inPlace},
                          {"check", opt_.check},
                          {"vs_mpi", opt_.vsMpi},
                          {"algorithm", info_.algoText},
                          {"size_meaning", info_.desc->sizeNote},
                          {"rows", rows_}};
    if (info_.reduces) doc["op"] = opName(ctx_.op);
    if (info_.rooted) doc["root"] = ctx_.root;
    if (info_.desc->hasBandwidth) doc["busbw_factor"] = info_.desc->busbwFormula;
    nlohmann::json env = nlohmann::json::object();
    for (const char* name : kEnvRecorded) env[name] = envValue(name);
    doc["environment"] = env;
    json_ << doc.dump(2) << "\n";
    if (!json_) std::fprintf(stderr, "mtxcomm_bench: writing %s failed\n", opt_.json.c_str());
  }
}

}  // namespace bench
}  // namespace mtxcomm
