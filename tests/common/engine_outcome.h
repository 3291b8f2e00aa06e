// What the binding-engine tests (test_engine_alone.cc, test_engine_pair.cc) submit and observe:
// a float32 request whose done records its status, the thread it ran on, and its output.
#ifndef MTXCOMM_TESTS_COMMON_ENGINE_OUTCOME_H_
#define MTXCOMM_TESTS_COMMON_ENGINE_OUTCOME_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings/common/engine.h"

namespace mtxcomm::binding::testing {

// One submitted request's outcome: where its done ran, and what it wrote.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  std::thread::id thread;
  std::vector<float> out;

  // Whether done ran within `seconds`.
  bool wait(int seconds = 30) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(seconds), [&] { return done; });
  }
};

// A request of `kind` (sum; root for a broadcast) on the float32 vector `in`, recorded in *o;
// in and o must outlive its done.
inline Entry request(Kind kind, const std::string& name, const std::vector<float>& in, Outcome* o,
                     bool mayRunInline, int root = 0) {
  Entry e;
  e.request.kind = kind;
  e.request.name = name;
  e.request.op = MTXCOMM_SUM;
  e.request.root = root;
  e.request.tensors.push_back({MTXCOMM_FLOAT32, {static_cast<int64_t>(in.size())}});
  e.inputs.push_back(in.data());
  e.mayRunInline = mayRunInline;
  e.allocate = [o](size_t, const std::vector<int64_t>& shape, std::string*) -> void* {
    o->out.assign(static_cast<size_t>(shape.empty() ? 1 : shape[0]), -1.0f);
    return o->out.data();
  };
  e.done = [o](const Status& st) {
    std::lock_guard<std::mutex> lk(o->mu);
    o->status = st;
    o->thread = std::this_thread::get_id();
    o->done = true;
    o->cv.notify_all();
  };
  return e;
}

}  // namespace mtxcomm::binding::testing

#endif  // MTXCOMM_TESTS_COMMON_ENGINE_OUTCOME_H_
