// A Schedule is one rank's part of one collective call as an explicit list of steps. A step
// posts its sends and receives together, waits for all of them, then runs its local operations
// (reduce, copy, adasum) in order. The executor (algos/executor.cc) runs it over any Transport; the
// same schedule can be printed (toString) when debugging.
//
// Overlap: a step marked overlapPrevious has its sends and receives posted *before* the local
// operations of the previous step run, so a transfer proceeds while the previous segment is
// reduced. The algorithm marks a step so only when its buffers are disjoint from those the
// previous step's local operations read or write.
#ifndef MTXCOMM_ALGOS_SCHEDULE_H_
#define MTXCOMM_ALGOS_SCHEDULE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "lib/base/call.h"

namespace mtxcomm {

struct CommOp {
  bool isSend;
  int peer;
  void* buf;  // const for sends
  size_t bytes;
};

struct LocalOp {
  enum Kind { kReduce, kCopy, kAdasum };
  Kind kind;
  void* dst;
  const void* a;  // reduce, adasum: first operand; copy: source
  const void* b;  // reduce, adasum: second operand
  size_t count;   // reduce, adasum: elements; copy: bytes
};

struct Step {
  std::vector<CommOp> comm;
  std::vector<LocalOp> local;
  bool overlapPrevious = false;
};

class Schedule {
 public:
  Schedule(mtxcomm_datatype_t dtype, size_t elemSize, mtxcomm_op_t op)
      : dtype_(dtype), elemSize_(elemSize), op_(op) {}

  // Adds to the current step. send/recv always add a message (also of zero bytes);
  // sendData/recvData skip zero-byte transfers — safe because both sides compute the same size.
  void send(int peer, const void* buf, size_t bytes);
  void recv(int peer, void* buf, size_t bytes);
  void sendData(int peer, const void* buf, size_t bytes) {
    if (bytes) send(peer, buf, bytes);
  }
  void recvData(int peer, void* buf, size_t bytes) {
    if (bytes) recv(peer, buf, bytes);
  }
  // dst[i] = a[i] (op) b[i], count elements. Skipped when count is 0.
  void reduce(void* dst, const void* a, const void* b, size_t count);
  // dst = adasum(a, b) over the whole count elements (adasumBuffers, lib/base/reduce.h: one
  // vector-wide operation, not elementwise: a and b are complete vectors). Skipped when count
  // is 0.
  void adasum(void* dst, const void* a, const void* b, size_t count);
  // Skipped when bytes is 0 or dst == src.
  void copy(void* dst, const void* src, size_t bytes);
  // Closes the current step (an empty step is dropped). The next step overlaps this one's
  // local operations if overlapNext is true.
  void endStep(bool overlapNext = false);

  // Scratch memory owned by the schedule, freed with it. Aligned to 64 bytes.
  char* scratch(size_t bytes);

  const std::vector<Step>& steps() const { return steps_; }
  mtxcomm_datatype_t dtype() const { return dtype_; }
  mtxcomm_op_t op() const { return op_; }
  size_t elemSize() const { return elemSize_; }
  // One line per step: "step 3: send 1 -> rank 2 (4096 B), recv ... ; reduce 1024".
  std::string toString() const;

 private:
  Step& current();
  mtxcomm_datatype_t dtype_;
  size_t elemSize_;
  mtxcomm_op_t op_;
  std::vector<Step> steps_;
  bool open_ = false;
  bool nextOverlaps_ = false;
  struct FreeDeleter {
    void operator()(char* p) const;
  };
  std::vector<std::unique_ptr<char, FreeDeleter>> scratch_;
};

}  // namespace mtxcomm

#endif  // MTXCOMM_ALGOS_SCHEDULE_H_
