// One small descriptor per collective for mtxcomm_bench (after nccl-tests' src/common.h plus
// src/all_reduce.cu etc.): how a message size maps to counts and buffers, how to fill inputs and
// check outputs, the busbw factor, and how to call mtxcomm and the equivalent MPI collective.
// The driver (mtxcomm_bench.cc) knows nothing collective-specific.
#ifndef MTXCOMM_BENCH_BENCH_DESCRIPTORS_H_
#define MTXCOMM_BENCH_BENCH_DESCRIPTORS_H_

#include <mpi.h>

#include <cstddef>
#include <string_view>
#include <vector>

#include "bench/bench_data.h"
#include "lib/base/call.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace bench {

// What every call of one run shares.
struct BenchContext {
  mtxcomm_comm_t comm = nullptr;
  int rank = 0;
  int nranks = 1;
  int root = 0;
  mtxcomm_datatype_t dtype = MTXCOMM_FLOAT32;
  mtxcomm_op_t op = MTXCOMM_SUM;
  size_t elemSize = 4;
  bool inPlace = false;
  MPI_Datatype mpiType = MPI_DATATYPE_NULL;  // MPI_DATATYPE_NULL without --vs-mpi
  MPI_Op mpiOp = MPI_OP_NULL;
  const TestData* data = nullptr;
  void* stream = nullptr;  // -d cuda: the cudaStream_t of every mtxcomm call
};

// One message size, as the descriptor lays it out.
struct Layout {
  size_t bytes = 0;      // the message size (Size column), see CollDescriptor::sizeNote
  size_t count = 0;      // the count argument of the call (elements)
  size_t sendElems = 0;  // elements of the send buffer on this rank (0: unused)
  size_t recvElems = 0;  // elements of the receive buffer on this rank (0: unused)
  double algBytes = 0;   // bytes algbw is computed from (nccl-tests convention)
};

// The host buffers the descriptors fill and check. With -d cuda the calls run on device
// copies of the same sizes (dsend, drecv; the driver copies between them), and the
// descriptors pass dev(p), the device address of host address p.
struct Buffers {
  std::vector<unsigned char> send;
  std::vector<unsigned char> recv;
  unsigned char* dsend = nullptr;
  unsigned char* drecv = nullptr;
  template <class T>
  T* dev(T* p) const {
    const auto* c = reinterpret_cast<const unsigned char*>(p);
    if (!p || (!dsend && !drecv)) return p;
    if (dsend && c >= send.data() && c < send.data() + send.size()) {
      return reinterpret_cast<T*>(dsend + (c - send.data()));
    }
    return reinterpret_cast<T*>(drecv + (c - recv.data()));
  }
};

struct CollDescriptor {
  const char* name;  // the collective's name as in algos/registry.h
  Collective coll;
  const char* mpiName;   // the MPI collective --vs-mpi times
  const char* sizeNote;  // what Size means, for the output header
  bool hasBandwidth;     // false for barrier
  // busbw = algbw * busbwFactor(nranks), nccl-tests factors (../shared/DESIGN.md).
  double (*busbwFactor)(int nranks);
  const char* busbwFormula;
  // A message size must be a multiple of unitElems(nranks) elements (sizes are rounded down).
  size_t (*unitElems)(int nranks);
  Layout (*layout)(const BenchContext& ctx, size_t bytes);
  // Writes this rank's inputs where the call reads them (in place: into recv).
  void (*fillInput)(const BenchContext& ctx, const Layout& l, Buffers& b);
  // Wrong elements of this rank's result; mpi says which library produced it (the in-place
  // MPI_Reduce_scatter_block leaves its result elsewhere).
  size_t (*countWrong)(const BenchContext& ctx, const Layout& l, const Buffers& b, bool mpi);
  mtxcomm_result_t (*runMtxcomm)(const BenchContext& ctx, const Layout& l, Buffers& b);
  int (*runMpi)(const BenchContext& ctx, const Layout& l, Buffers& b);
};

// The descriptors in the order of algos/registry.h; nullptr for an unknown name.
const std::vector<CollDescriptor>& descriptors();
const CollDescriptor* findDescriptor(std::string_view name);

}  // namespace bench
}  // namespace mtxcomm

#endif  // MTXCOMM_BENCH_BENCH_DESCRIPTORS_H_
