// Closed-form test data for mtxcomm_bench -c: what rank r puts at element i of its input, and
// what a reduction over all ranks must give there, encoded in the benchmark's datatype.
//
// Inputs are small integers with period kPeriod in i, so every floating sum is exact in the
// accumulation type and the expected value is computed the way the library's contract says
// (16-bit floats: float32 then one rounding; integers wrap; AVG = SUM / nranks, integers
// truncating; bool: bytes with non-canonical trues among them, reduced logically to 0/1). The
// check is bitwise. For ADASUM the ranks' inputs are orthogonal (each element non-zero on one
// rank only), so the adaptive sum equals the plain sum exactly (bench_data.cc).
#ifndef MTXCOMM_BENCH_BENCH_DATA_H_
#define MTXCOMM_BENCH_BENCH_DATA_H_

#include <cstddef>
#include <vector>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace bench {

class TestData {
 public:
  // op is used only for the reduced values and to pick the PROD inputs (1 or 2, sparse).
  TestData(mtxcomm_datatype_t dtype, mtxcomm_op_t op, int nranks);

  // Writes rank's input elements [first, first + count) (global element indices) to dst.
  void fillInput(int rank, size_t first, size_t count, void* dst) const;
  // Elements of buf (holding indices [first, first + count)) that differ from rank's input.
  size_t countWrongInput(int rank, size_t first, size_t count, const void* buf) const;
  // Elements of buf that differ from the reduction over all ranks' inputs.
  size_t countWrongReduced(size_t first, size_t count, const void* buf) const;

 private:
  size_t elemSize_;
  // Each line holds 2 * kPeriod encoded elements, so any kPeriod-long window starts in it.
  std::vector<std::vector<unsigned char>> inputLines_;  // one per rank
  std::vector<unsigned char> reducedLine_;
};

}  // namespace bench
}  // namespace mtxcomm

#endif  // MTXCOMM_BENCH_BENCH_DATA_H_
