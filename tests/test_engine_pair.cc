// The binding engine in a world of two ranks on one node: this process and a forked child, over
// a file store. Where a small request may run its cycle on the submitting thread
// (Entry::mayRunInline) and its peer already waits in the next cycle, it completes inside
// enqueue, on the submitter's thread; one that may not (a training step's gradients, the torch
// backend) always completes on the engine's thread; a request an inline cycle could not finish
// (its peer submitted another) is finished by the engine's thread; and many requests from
// several threads per rank, small and large, inline or not, all get the right sums. The child
// reports its failures through its exit status and stderr.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings/common/engine.h"
#include "common/engine_outcome.h"

namespace mtxcomm::binding {
namespace {

using testing::Outcome;

// A request and its input: element i of rank r's input is r + 1 + i.
struct Call : Outcome {
  std::vector<float> in;
};

// Submits an allreduce (sum) of c->in named `name`.
void submit(const std::string& name, Call* c, bool mayRunInline) {
  enqueue(testing::request(Kind::kAllreduce, name, c->in, c, mayRunInline));
}

// A rank's failures, as text (the child has no gtest of its own to report them).
struct Errors {
  std::mutex mu;
  std::string text;
  void add(const std::string& s) {
    std::lock_guard<std::mutex> lk(mu);
    text += "rank " + std::to_string(rank()) + ": " + s + "\n";
  }
};

// Waits for o and checks its sum: element i of rank r's input is r + 1 + i, so the sum over
// two ranks is 3 + 2 i.
void check(const std::string& name, Call* o, Errors* errors) {
  if (!o->wait(60)) return errors->add(name + ": no completion within 60 s");
  if (!o->status.ok()) return errors->add(name + ": " + o->status.message);
  for (size_t i = 0; i < o->out.size(); ++i) {
    if (o->out[i] != 3.0f + 2.0f * static_cast<float>(i)) {
      return errors->add(name + ": element " + std::to_string(i) + " is " +
                         std::to_string(o->out[i]));
    }
  }
}

std::unique_ptr<Call> outcome(size_t count) {
  auto o = std::make_unique<Call>();
  for (size_t i = 0; i < count; ++i) o->in.push_back(static_cast<float>(rank() + 1 + i));
  return o;
}

// A word both ranks see (shared memory mapped before the fork): a rank announces a step of its
// own, the other reacts within microseconds.
struct Shared {
  std::atomic<int> step{0};
  std::atomic<uint64_t> count{0};
  // Waits until the other rank's step reaches k; after 60 s (that rank failed) the waiting
  // rank fails too, never spinning on.
  void waitFor(int k) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (step.load() < k) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "rank %d: the other rank never reached step %d\n", rank(), k);
        std::fflush(nullptr);
        _exit(2);
      }
      std::this_thread::yield();
    }
  }
};

// Runs body(errors, shared) on rank 0 (this process) and rank 1 (a forked child) of a fresh
// job; the test fails with each rank's errors.
void twoRanks(const std::function<void(Errors*, Shared*)>& body) {
  char dir[] = "/tmp/mtxcomm_engine_pair_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  void* mem =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  Shared* shared = new (mem) Shared();
  setenv("MTXCOMM_PLACEMENT", "off", 1);  // do not bind the test process
  setenv("MTXCOMM_SIZE", "2", 1);
  setenv("MTXCOMM_STORE", (std::string("file:") + dir + "/store").c_str(), 1);
  setenv("MTXCOMM_TIMEOUT", "60", 1);
  std::fflush(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
  setenv("MTXCOMM_RANK", child == 0 ? "1" : "0", 1);
  Errors errors;
  Status st = init();
  if (!st.ok()) {
    errors.add("init: " + st.message);
  } else {
    body(&errors, shared);
    shutdown();
  }
  if (child == 0) {
    if (!errors.text.empty()) std::fprintf(stderr, "%s", errors.text.c_str());
    std::fflush(nullptr);
    _exit(errors.text.empty() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "rank 1 failed (its errors are on stderr above), status " << status;
  EXPECT_EQ(errors.text, "");
  munmap(mem, sizeof(Shared));
  for (const char* v : {"MTXCOMM_SIZE", "MTXCOMM_RANK", "MTXCOMM_STORE", "MTXCOMM_TIMEOUT"}) {
    unsetenv(v);
  }
  std::string rm = std::string("rm -rf ") + dir;
  EXPECT_EQ(std::system(rm.c_str()), 0);
}

// Up to this many trials of a case that needs the later rank to submit within about 1 ms of the
// earlier one (before the earlier rank's engine wakes the idle later one, kOwedWakeDelay): a
// trial the scheduler delays longer takes the engine's thread, correctly but not the case.
constexpr int kTrials = 20;

// Trial k: rank 0 submits "late/k" (its submitter asks rank 1 to the next cycle, waits the
// spin for it, then hands the request to its engine's thread), and only then rank 1 submits
// hers, finding rank 0 in the cycle: it completes inside enqueue on its submitter when it may,
// never on rank 0's side, and never when it may not.
void lateSubmitter(bool mayRunInline) {
  twoRanks([mayRunInline](Errors* errors, Shared* shared) {
    int inlined = 0;
    for (int k = 1; k <= kTrials && inlined == 0; ++k) {
      auto o = outcome(64);
      const std::string name = "late/" + std::to_string(k);
      const int base = 10 * k;  // the steps of trial k: base + 1, then base + 3 or base + 8
      const uint64_t before = inlineCycleCount();
      if (rank() == 0) {
        submit(name, o.get(), mayRunInline);
        shared->step = base + 1;
      } else {
        shared->waitFor(base + 1);
        submit(name, o.get(), mayRunInline);
      }
      check(name, o.get(), errors);
      const uint64_t ran = inlineCycleCount() - before;
      // done ran on the submitting thread only inside enqueue: the cycle ran there.
      const bool inside = o->thread == std::this_thread::get_id();
      if (ran != (inside ? 1u : 0u)) {
        errors->add(name + ": completed on the submitter " + std::to_string(inside) +
                    ", inline cycles " + std::to_string(ran));
      }
      if (inside && (rank() == 0 || !mayRunInline)) {
        errors->add(name + ": ran on the submitting thread" +
                    (rank() == 0 ? " of the earlier rank" : ", which it may not"));
      }
      // Both ranks stop at the same trial: rank 1 tells whether hers ran inline.
      if (rank() == 1) {
        inlined = inside ? 1 : 0;
        shared->step = base + (inside ? 8 : 3);
      } else {
        shared->waitFor(base + 3);
        inlined = shared->step.load() == base + 8 ? 1 : 0;
      }
    }
    if (mayRunInline && inlined == 0) {
      errors->add("the later rank's request never completed inside enqueue in " +
                  std::to_string(kTrials) + " trials");
    }
  });
}

TEST(EnginePair, ALateSubmitterWhosePeerWaitsRunsTheCycleItself) { lateSubmitter(true); }

TEST(EnginePair, ARequestThatMayNotRunInlineAlwaysGoesToTheEnginesThread) { lateSubmitter(false); }

// Trial k: rank 0 submits "a/k"; then rank 1 submits "b/k", finds rank 0 in the next cycle and
// runs it on its submitter, but that cycle makes nothing ready: "b/k" waits. Rank 1 then submits
// "a/k" and rank 0 "b/k"; both complete, "b/k" on rank 1 through its engine's thread.
TEST(EnginePair, ARequestAnInlineCycleLeftWaitingIsFinishedByTheEnginesThread) {
  twoRanks([](Errors* errors, Shared* shared) {
    bool inlined = false;
    for (int k = 1; k <= kTrials && !inlined; ++k) {
      auto a = outcome(8), b = outcome(8);
      const std::string an = "a/" + std::to_string(k), bn = "b/" + std::to_string(k);
      const int base = 10 * k;
      if (rank() == 0) {
        submit(an, a.get(), true);
        shared->step = base + 1;
        shared->waitFor(base + 2);
        submit(bn, b.get(), true);
      } else {
        shared->waitFor(base + 1);
        const uint64_t before = inlineCycleCount();
        submit(bn, b.get(), true);
        inlined = inlineCycleCount() > before;
        submit(an, a.get(), true);
        shared->step = base + 2;
      }
      check(an, a.get(), errors);
      check(bn, b.get(), errors);
      if (rank() == 1 && b->thread == std::this_thread::get_id()) {
        errors->add(bn + " completed on its submitter, not on the engine's thread");
      }
      if (rank() == 1) shared->step = base + 3 + (inlined ? 5 : 0);
      if (rank() == 0) {
        shared->waitFor(base + 3);
        inlined = shared->step.load() == base + 8;
      }
    }
    if (!inlined) errors->add("rank 1's b never ran its cycle on the submitter");
  });
}

// Two submitting threads per rank, 300 requests each, with a few requests in flight per thread:
// small and large (over the 128 KiB a submitter takes), inline allowed or not, in the same order
// on both ranks. Every sum is right, and some cycles ran on submitting threads.
TEST(EnginePair, ManyRequestsFromSeveralThreadsGetTheRightSums) {
  twoRanks([](Errors* errors, Shared* shared) {
    const uint64_t before = inlineCycleCount();
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([t, errors] {
        constexpr int kCalls = 300, kInFlight = 3;
        std::vector<std::unique_ptr<Call>> window(kInFlight);
        std::vector<std::string> names(kInFlight);
        for (int k = 0; k < kCalls + kInFlight; ++k) {
          const int slot = k % kInFlight;
          if (window[slot]) check(names[slot], window[slot].get(), errors);
          window[slot].reset();
          if (k >= kCalls) continue;
          const size_t count = k % 37 == 0 ? (300 << 10) / 4 : 1 + (k * 7 + t) % 300;
          window[slot] = outcome(count);
          names[slot] = "t" + std::to_string(t) + "/" + std::to_string(k);
          submit(names[slot], window[slot].get(), k % 5 != 0);
        }
      });
    }
    for (auto& th : threads) th.join();
    // Some cycles ran on a submitting thread, of one rank or the other.
    if (rank() == 1) {
      shared->count = inlineCycleCount() - before;
      shared->step = 1;
    } else {
      shared->waitFor(1);
      if (inlineCycleCount() - before + shared->count.load() == 0) {
        errors->add("no cycle ran on a submitting thread of either rank");
      }
    }
  });
}

}  // namespace
}  // namespace mtxcomm::binding
