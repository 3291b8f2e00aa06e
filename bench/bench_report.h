// mtxcomm_bench's output: the header lines, one aligned row per message size (OSU's columns,
// then nccl-tests' algbw, busbw and #wrong, the algorithm, the MPI baseline and ratio, the
// prediction), the final check line, and the same rows as JSON (--json).
#ifndef MTXCOMM_BENCH_BENCH_REPORT_H_
#define MTXCOMM_BENCH_BENCH_REPORT_H_

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_descriptors.h"
#include "bench/bench_options.h"
#include "bench/bench_run.h"

namespace mtxcomm {
namespace bench {

// What the header says about the run.
struct RunInfo {
  const CollDescriptor* desc = nullptr;
  bool reduces = false;
  bool rooted = false;
  bool hasData = true;
  size_t unitBytes = 0;   // sizes are multiples of this
  std::string algoText;   // how the algorithm was chosen
  std::string transport;  // the communicator's point-to-point transport
};

class Report {
 public:
  // Collective: rank 0 opens opt.json (when given); every rank throws UsageError when it cannot.
  Report(const Options& opt, const BenchContext& ctx, const RunInfo& info);
  // Rank 0 prints the header lines and the column titles.
  void printHeader() const;
  // Rank 0 prints the row of one size and keeps it for the JSON document.
  void addRow(const Layout& layout, const Timing& timing, const Measurement& m);
  // Rank 0 prints the check line and writes the JSON document.
  void finish(unsigned long long totalWrong);

 private:
  class Table {
   public:
    void add(const std::string& title, int width = 0);
    void printHeader() const;
    void printRow(const std::vector<std::string>& values) const;

   private:
    std::string cell(size_t i, const std::string& v) const;
    struct Column {
      std::string title;
      int width;
    };
    std::vector<Column> cols_;
  };

  const Options& opt_;
  const BenchContext& ctx_;
  RunInfo info_;
  Table table_;
  std::ofstream json_;
  nlohmann::json rows_ = nlohmann::json::array();
};

}  // namespace bench
}  // namespace mtxcomm

#endif  // MTXCOMM_BENCH_BENCH_REPORT_H_
