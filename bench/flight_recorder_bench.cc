// The flight recorder's cost per call on the calling thread (lib/comm/flight_recorder.h): enter
// (with a label), the path, and the end of one call, as Comm::run records every collective,
// against the same loop without them. The per-call figure in a job is bench/ab_compare.py with
// MTXCOMM_FLIGHT_RECORDER=0 on one side (bench/RESULTS.md, "Flight recorder").
//
//   mtxcomm_flight_recorder_bench --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <cstring>

#include "lib/base/call.h"
#include "lib/comm/flight_recorder.h"

namespace mtxcomm {
namespace {

CallSignature signature(uint64_t seq) {
  CollArgs a;
  a.coll = Collective::kAllreduce;
  a.count = 2;
  a.dtype = MTXCOMM_FLOAT32;
  return callSignature(a, seq);
}

void BM_EmptyCall(benchmark::State& state) {
  uint64_t seq = 0;
  for (auto _ : state) {
    CallSignature s = signature(++seq);
    benchmark::DoNotOptimize(s);
  }
}
BENCHMARK(BM_EmptyCall);

void BM_RecordedCall(benchmark::State& state) {
  FlightRecorder r(static_cast<size_t>(state.range(0)), "world", 0, 2);
  uint64_t seq = 0;
  FlightRecorder::Label label = {};
  if (state.range(1)) std::strcpy(label, "dense_1/kernel:0");
  for (auto _ : state) {
    CallSignature s = signature(++seq);
    benchmark::DoNotOptimize(s);
    r.enter(s, label);
    r.setPath("shm", "shm");
    r.end(FlightRecorder::State::kDone);
  }
}
BENCHMARK(BM_RecordedCall)->Args({64, 0})->Args({64, 1})->Args({4096, 1});

}  // namespace
}  // namespace mtxcomm

BENCHMARK_MAIN();
