// Microbenchmarks for the CPU reduction kernels (lib/base/reduce.h), with a memcpy baseline in the
// same binary. Bytes processed count every byte read and written (in-place SUM: 2 reads +
// 1 write per element; memcpy and conversions: 1 read + 1 write), so the GB/s columns compare
// memory traffic directly.
//
//   mtxcomm_kernel_bench --benchmark_min_time=0.1
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "lib/base/dtype.h"
#include "lib/base/reduce.h"

namespace mtxcomm {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;

// Fills a buffer of count elements of dt with small finite values (no NaN, no overflow in SUM).
std::vector<unsigned char> makeBuffer(mtxcomm_datatype_t dt, size_t count, int seed) {
  const size_t size = datatypeSize(dt);
  std::vector<unsigned char> buf(count * size);
  for (size_t i = 0; i < count; ++i) {
    const float v = static_cast<float>((i * 7 + static_cast<size_t>(seed)) % 13) * 0.25f;
    storeElement(dt, buf.data(), i, isFloatingType(dt) ? v : static_cast<double>(v * 4));
  }
  return buf;
}

// dst == a (in place), as the collectives use it. state.range(0): buffer size in bytes.
void bmReduceSum(benchmark::State& state, mtxcomm_datatype_t dt) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / datatypeSize(dt);
  auto acc = makeBuffer(dt, count, 1);
  const auto b = makeBuffer(dt, count, 2);
  for (auto _ : state) {
    reduceBuffers(dt, MTXCOMM_SUM, acc.data(), acc.data(), b.data(), count);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(3 * bytes));
  state.counters["elems"] = static_cast<double>(count);
}

void bmMemcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * bytes));
}

// state.range(0): size of the float32 side in bytes.
void bmWiden(benchmark::State& state, mtxcomm_datatype_t dt) {
  const size_t count = static_cast<size_t>(state.range(0)) / 4;
  const auto in = makeBuffer(dt, count, 3);
  std::vector<float> out(count);
  for (auto _ : state) {
    widenToFloat(dt, reinterpret_cast<const uint16_t*>(in.data()), out.data(), count);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(count * 6));
}

void bmNarrow(benchmark::State& state, mtxcomm_datatype_t dt) {
  const size_t count = static_cast<size_t>(state.range(0)) / 4;
  const auto in = makeBuffer(MTXCOMM_FLOAT32, count, 4);
  std::vector<uint16_t> out(count);
  for (auto _ : state) {
    // cppcheck-suppress invalidPointerCast ; the vector's storage is float-aligned
    narrowFromFloat(dt, reinterpret_cast<const float*>(in.data()), out.data(), count);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(count * 6));
}

void reduceSizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : {4 * kKiB, 256 * kKiB, 16 * kMiB, 64 * kMiB}) b->Arg(bytes);
}

BENCHMARK(bmMemcpy)->Apply(reduceSizes);
BENCHMARK_CAPTURE(bmReduceSum, float32, MTXCOMM_FLOAT32)->Apply(reduceSizes);
BENCHMARK_CAPTURE(bmReduceSum, float64, MTXCOMM_FLOAT64)->Apply(reduceSizes);
BENCHMARK_CAPTURE(bmReduceSum, int32, MTXCOMM_INT32)->Apply(reduceSizes);
BENCHMARK_CAPTURE(bmReduceSum, float16, MTXCOMM_FLOAT16)->Apply(reduceSizes);
BENCHMARK_CAPTURE(bmReduceSum, bfloat16, MTXCOMM_BFLOAT16)->Apply(reduceSizes);
BENCHMARK_CAPTURE(bmReduceSum, int16, MTXCOMM_INT16)->Apply(reduceSizes);
BENCHMARK_CAPTURE(bmReduceSum, bool, MTXCOMM_BOOL)->Apply(reduceSizes);  // logical OR
BENCHMARK_CAPTURE(bmWiden, float16, MTXCOMM_FLOAT16)->Arg(16 * kMiB);
BENCHMARK_CAPTURE(bmWiden, bfloat16, MTXCOMM_BFLOAT16)->Arg(16 * kMiB);
BENCHMARK_CAPTURE(bmNarrow, float16, MTXCOMM_FLOAT16)->Arg(16 * kMiB);
BENCHMARK_CAPTURE(bmNarrow, bfloat16, MTXCOMM_BFLOAT16)->Arg(16 * kMiB);

}  // namespace
}  // namespace mtxcomm

BENCHMARK_MAIN();
