// The engine's executor: runs the operations every rank agreed on (negotiation.h) on the
// communicator, in the agreed order — allreduces ready together fused into one buffer of up to
// MTXCOMM_FUSION_BYTES (tensor fusion, as in Horovod), the other collectives one by one with the
// padding an uneven allgather or reduce-scatter needs.
#ifndef MTXCOMM_BINDINGS_COMMON_EXECUTOR_H_
#define MTXCOMM_BINDINGS_COMMON_EXECUTOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings/common/entry.h"
#include "bindings/common/negotiation.h"
#include "bindings/common/timeline.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm::binding {

// One agreed operation and this rank's entry for it (for a rank that had joined, a stand-in
// entry: zero inputs, outputs thrown away).
struct ReadyOp {
  Agreed agreed;
  Entry entry;
  std::chrono::steady_clock::time_point agreedAt;
};

class OpExecutor {
 public:
  OpExecutor(mtxcomm_comm_t comm, int rank, int nranks, size_t fusionBytes, Timeline* timeline)
      : comm_(comm), rank_(rank), nranks_(nranks), fusionBytes_(fusionBytes), timeline_(timeline) {}

  // Consecutive agreed allreduces with one op (each entry with one or more tensors): tensors
  // are bucketed by dtype in their agreed order, and each bucket is reduced in fusion-buffer
  // sized pieces; a tensor larger than the fusion buffer, alone in its piece, or of at least
  // kAloneBytes (1 MiB) is reduced straight from its input into its output. Calls every entry's
  // done. Returns the library's failure when a collective failed and poisoned the communicator,
  // else OK (a call every rank refused, MTXCOMM_INVALID_ARGUMENT, fails only its entries).
  Status runAllreduces(const std::vector<ReadyOp*>& group);
  // A broadcast, allgather, reduce-scatter (each of one or more tensors, one collective per
  // tensor) or alltoall. Calls the entry's done; returns as above.
  Status runOne(ReadyOp& op);
  // Library collectives run for submitted requests (not counting negotiation).
  uint64_t collectives() const { return collectives_.load(); }

 private:
  Status libraryStatus(mtxcomm_result_t rc, const std::string& what) const;
  static bool usable(const Status& st);
  // "allgather 'name'", for errors.
  std::string describe(const ReadyOp& op) const;
  // The flight recorder's label of the next collective: the tensor names it carries.
  void label(const std::string& names) const;
  void* output(ReadyOp& op, size_t t, const std::vector<int64_t>& shape, std::string* err);
  // Tensor t of a (grouped) request; alltoall has one tensor and a second output, the rows
  // received from each rank (int32[size]).
  Status broadcastOne(ReadyOp& op, size_t t, std::string* err);
  Status allgatherOne(ReadyOp& op, size_t t, std::string* err);
  Status reduceScatterOne(ReadyOp& op, size_t t, std::string* err);
  Status alltoallOne(ReadyOp& op, std::string* err);
  // Timeline: QUEUE from agreement to start, then the collective (algorithm, bytes).
  void traceCall(const ReadyOp& op, const char* name, std::chrono::steady_clock::time_point start,
                 std::chrono::steady_clock::time_point end, size_t bytes);

  mtxcomm_comm_t comm_;
  int rank_, nranks_;
  // A tensor of at least this many bytes is reduced from its own buffers, never fused: copying
  // it into the fusion buffer and back costs two passes over memory (4 MiB: about 0.2 ms,
  // mostly out of cache) where a collective of its own costs a few microseconds more latency.
  static constexpr size_t kAloneBytes = size_t{1} << 20;
  size_t fusionBytes_;
  Timeline* timeline_;
  std::vector<char> fusion_;
  std::atomic<uint64_t> collectives_{0};
};

}  // namespace mtxcomm::binding

#endif  // MTXCOMM_BINDINGS_COMMON_EXECUTOR_H_
