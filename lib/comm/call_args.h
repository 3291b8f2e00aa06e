// A call as the communicator receives it from the C API and as its algorithms see it:
//   - checkArgs: the argument checks on the calling rank, before any byte moves;
//   - AlgorithmCall: the algorithm-level form of a user-level call — AVG runs as SUM and is
//     divided afterwards, float16/bfloat16 reductions run in float32 on a widened copy and
//     are rounded once at the end (the library's numbers contract, include/mtxcomm/mtxcomm.h);
//     except op adasum, which reaches its algorithm in the user's datatype (it rounds per level).
#ifndef MTXCOMM_LIB_COMM_CALL_ARGS_H_
#define MTXCOMM_LIB_COMM_CALL_ARGS_H_

#include <cstddef>
#include <memory>

#include "lib/base/call.h"

namespace mtxcomm {

// Throws MTXCOMM_INVALID_ARGUMENT naming the argument: datatype, op (also an op the datatype
// does not take: AVG on bool, ADASUM on a non-floating type; and ADASUM on anything but
// allreduce), root, a count whose bytes overflow size_t, a NULL buffer with a count, partially
// overlapping buffers; alltoall and alltoallv: any overlap, NULL count or displacement arrays,
// sendcounts[rank] != recvcounts[rank].
void checkArgs(const CollArgs& args, int rank, int nranks);

// Elements this rank's recvbuf holds for the call (what AVG divides and narrowing writes).
size_t resultCount(const CollArgs& args, int rank, int nranks);

class AlgorithmCall {
 public:
  // user: a checked call with count > 0 on more than one rank; it must outlive this object.
  AlgorithmCall(const CollArgs& user, int rank, int nranks);
  ~AlgorithmCall();
  AlgorithmCall(const AlgorithmCall&) = delete;
  AlgorithmCall& operator=(const AlgorithmCall&) = delete;
  // What the algorithm runs: AVG as SUM, 16-bit floats as float32 (elemSize set; not for
  // ADASUM).
  const CollArgs& args() const { return args_; }
  // After the algorithm: divides for AVG unless the algorithm did (averaged: it applied
  // args().avgDivisor itself, registry.h) and rounds back to the user's 16-bit type.
  void finish(bool averaged);

 private:
  struct Buffer;
  const CollArgs& user_;
  CollArgs args_;
  int nranks_;
  bool avg_ = false, widen_ = false;
  size_t outCount_ = 0;
  std::unique_ptr<Buffer> wideIn_, wideOut_;
};

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_CALL_ARGS_H_
