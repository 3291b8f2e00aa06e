#include "algos/executor.h"

#include "lib/base/error.h"
#include "lib/base/reduce.h"

namespace mtxcomm {

namespace {

void post(const Step& step, Transport& t, int tag, std::vector<RequestPtr>& reqs) {
  // Receives first, so a peer's eager send finds its receive already posted.
  for (const CommOp& c : step.comm) {
    if (!c.isSend) reqs.push_back(t.irecv(c.peer, tag, c.buf, c.bytes));
  }
  for (const CommOp& c : step.comm) {
    if (c.isSend) reqs.push_back(t.isend(c.peer, tag, c.buf, c.bytes));
  }
}

void runLocal(const Step& step, const Schedule& s) {
  for (const LocalOp& l : step.local) {
    if (l.kind == LocalOp::kReduce) {
      reduceBuffers(s.dtype(), s.op(), l.dst, l.a, l.b, l.count);
    } else if (l.kind == LocalOp::kAdasum) {
      adasumBuffers(s.dtype(), l.dst, l.a, l.b, l.count);
    } else {
      copyBytes(l.dst, l.a, l.count);
    }
  }
}

}  // namespace

void executeSchedule(const Schedule& s, Transport& t, int tag, double timeoutSeconds) {
  const auto& steps = s.steps();
  const auto timeout =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeoutSeconds));
  std::vector<RequestPtr> current, next;
  bool nextPosted = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    try {
      if (!nextPosted) post(steps[i], t, tag, current);
      if (!current.empty()) t.waitAll(current, Clock::now() + timeout);
      current.clear();
      nextPosted = i + 1 < steps.size() && steps[i + 1].overlapPrevious;
      if (nextPosted) post(steps[i + 1], t, tag, current);
    } catch (const Error& e) {
      throw Error(e.code(), strCat("step ", i + 1, " of ", steps.size(), ": ", e.what()));
    }
    runLocal(steps[i], s);
  }
}

}  // namespace mtxcomm
