#include "algos/schedule.h"

#include <cstdlib>
#include <sstream>

#include "lib/base/error.h"

namespace mtxcomm {

Step& Schedule::current() {
  if (!open_) {
    steps_.emplace_back();
    steps_.back().overlapPrevious = nextOverlaps_;
    nextOverlaps_ = false;
    open_ = true;
  }
  return steps_.back();
}

void Schedule::send(int peer, const void* buf, size_t bytes) {
  current().comm.push_back(CommOp{true, peer, const_cast<void*>(buf), bytes});
}

void Schedule::recv(int peer, void* buf, size_t bytes) {
  current().comm.push_back(CommOp{false, peer, buf, bytes});
}

void Schedule::reduce(void* dst, const void* a, const void* b, size_t count) {
  if (count == 0) return;
  current().local.push_back(LocalOp{LocalOp::kReduce, dst, a, b, count});
}

void Schedule::adasum(void* dst, const void* a, const void* b, size_t count) {
  if (count == 0) return;
  current().local.push_back(LocalOp{LocalOp::kAdasum, dst, a, b, count});
}

void Schedule::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  current().local.push_back(LocalOp{LocalOp::kCopy, dst, src, nullptr, bytes});
}

void Schedule::endStep(bool overlapNext) {
  if (open_) {
    open_ = false;
    nextOverlaps_ = overlapNext;
  }
}

void Schedule::FreeDeleter::operator()(char* p) const { std::free(p); }

char* Schedule::scratch(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) fail(MTXCOMM_SYSTEM_ERROR, "out of memory allocating ", bytes, " bytes of scratch");
  scratch_.emplace_back(static_cast<char*>(p));
  return static_cast<char*>(p);
}

std::string Schedule::toString() const {
  std::ostringstream os;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    os << "step " << i << (s.overlapPrevious ? " (overlaps previous)" : "") << ":";
    for (const CommOp& c : s.comm) {
      os << (c.isSend ? " send " : " recv ") << c.bytes << " B " << (c.isSend ? "-> " : "<- ")
         << "rank " << c.peer << ";";
    }
    for (const LocalOp& l : s.local) {
      if (l.kind == LocalOp::kReduce) {
        os << " reduce " << l.count << " elements;";
      } else if (l.kind == LocalOp::kAdasum) {
        os << " adasum " << l.count << " elements;";
      } else {
        os << " copy " << l.count << " B;";
      }
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace mtxcomm
