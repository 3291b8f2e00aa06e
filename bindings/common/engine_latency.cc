// The binding engine's own latency, without a framework: one thread submits an allreduce of
// COUNT floats, waits for its completion callback, and repeats; blocks of 100 calls alternate
// between requests that may run the cycle on the submitting thread (Entry::mayRunInline: only in
// a world of one rank, as TensorFlow's kernels and the array API submit) and requests that
// always hand over to the engine's thread (the torch backend). Prints each mode's median.
// Run: mpirun -np 2 build/bindings/common/mtxcomm_engine_latency [COUNT] [CALLS]
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "bindings/common/engine.h"

namespace eng = mtxcomm::binding;

int main(int argc, char** argv) {
  const size_t count = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 2000;
  constexpr int kBlock = 100;
  eng::Status st = eng::init();
  if (!st.ok()) {
    std::fprintf(stderr, "init: %s\n", st.message.c_str());
    return 1;
  }
  std::vector<float> in(count, 1.0f), out(count);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<double> us[2];
  int failed = 0;
  for (int k = 0; k < calls; ++k) {
    const bool inlined = (k / kBlock) % 2 == 0;
    bool done = false;
    eng::Entry e;
    e.request.kind = eng::Kind::kAllreduce;
    e.request.name = "x";
    e.request.op = MTXCOMM_SUM;
    e.request.tensors.push_back({MTXCOMM_FLOAT32, {static_cast<int64_t>(count)}});
    e.inputs.push_back(in.data());
    e.mayRunInline = inlined;
    e.allocate = [&](size_t, const std::vector<int64_t>&, std::string*) -> void* {
      return out.data();
    };
    e.done = [&](const eng::Status& s) {
      std::lock_guard<std::mutex> lk(mu);
      if (!s.ok()) ++failed;
      done = true;
      cv.notify_one();
    };
    const auto t0 = std::chrono::steady_clock::now();
    eng::enqueue(std::move(e));
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done; });
    us[inlined].push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (out[0] != static_cast<float>(eng::size())) ++failed;
  }
  if (eng::rank() == 0) {
    for (int mode : {1, 0}) {
      std::vector<double>& v = us[mode];
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      std::printf(
          "engine allreduce of %zu floats on %d ranks, %s: median %.1f us, p10 %.1f, "
          "p90 %.1f (%zu calls)\n",
          count, eng::size(), mode ? "may run inline" : "engine thread only", v[v.size() / 2],
          v[v.size() / 10], v[v.size() * 9 / 10], v.size());
    }
    std::printf("%d failed\n", failed);
  }
  eng::shutdown();
  return failed ? 1 : 0;
}
