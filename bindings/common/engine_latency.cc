// The binding engine's own latency, without a framework: one thread submits an allreduce of
// COUNT floats, waits for its completion callback, and repeats; prints the median per call over
// blocks. Run: mpirun -np 2 build/bench/mtxcomm_engine_latency [COUNT] [CALLS]
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
  eng::Status st = eng::init();
  if (!st.ok()) {
    std::fprintf(stderr, "init: %s\n", st.message.c_str());
    return 1;
  }
  std::vector<float> in(count, 1.0f), out(count);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<double> us;
  int failed = 0;
  for (int k = 0; k < calls; ++k) {
    bool done = false;
    eng::Entry e;
    e.request.kind = eng::Kind::kAllreduce;
    e.request.name = "x";
    e.request.op = MTXCOMM_SUM;
    e.request.tensors.push_back({MTXCOMM_FLOAT32, {static_cast<int64_t>(count)}});
    e.inputs.push_back(in.data());
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
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  if (eng::rank() == 0) {
    std::printf(
        "engine allreduce of %zu floats on %d ranks: median %.1f us, p10 %.1f, p90 %.1f "
        "(%d calls, %d failed), result %.0f\n",
        count, eng::size(), us[us.size() / 2], us[us.size() / 10], us[us.size() * 9 / 10], calls,
        failed, static_cast<double>(out[0]));
  }
  eng::shutdown();
  return failed ? 1 : 0;
}
