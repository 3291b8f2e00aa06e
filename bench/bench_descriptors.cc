#include "bench/bench_descriptors.h"

#include <cstring>

namespace mtxcomm {
namespace bench {
namespace {

unsigned char* at(std::vector<unsigned char>& v, const BenchContext& ctx, size_t elem) {
  return v.data() + elem * ctx.elemSize;
}
const unsigned char* at(const std::vector<unsigned char>& v, const BenchContext& ctx, size_t elem) {
  return v.data() + elem * ctx.elemSize;
}

double factorOne(int) { return 1.0; }
double factorRing(int n) { return static_cast<double>(n - 1) / n; }
double factorAllreduce(int n) { return 2.0 * (n - 1) / n; }
size_t unitOne(int) { return 1; }
size_t unitRanks(int n) { return static_cast<size_t>(n); }

// ---- allreduce: Size = the whole buffer, count = Size / elemSize ---------------------------

Layout allreduceLayout(const BenchContext& ctx, size_t bytes) {
  const size_t count = bytes / ctx.elemSize;
  return {bytes, count, ctx.inPlace ? 0 : count, count, static_cast<double>(bytes)};
}
void allreduceFill(const BenchContext& ctx, const Layout& l, Buffers& b) {
  ctx.data->fillInput(ctx.rank, 0, l.count, ctx.inPlace ? b.recv.data() : b.send.data());
}
size_t allreduceWrong(const BenchContext& ctx, const Layout& l, const Buffers& b, bool) {
  return ctx.data->countWrongReduced(0, l.count, b.recv.data());
}
mtxcomm_result_t allreduceRun(const BenchContext& ctx, const Layout& l, Buffers& b) {
  return mtxcomm_allreduce(b.dev(ctx.inPlace ? b.recv.data() : b.send.data()), b.dev(b.recv.data()),
                           l.count, ctx.dtype, ctx.op, ctx.comm, ctx.stream);
}
int allreduceMpi(const BenchContext& ctx, const Layout& l, Buffers& b) {
  return MPI_Allreduce(ctx.inPlace ? MPI_IN_PLACE : b.send.data(), b.recv.data(),
                       static_cast<int>(l.count), ctx.mpiType, ctx.mpiOp, MPI_COMM_WORLD);
}

// ---- broadcast: Size = the whole buffer; out of place, root's data is in send ---------------

Layout broadcastLayout(const BenchContext& ctx, size_t bytes) {
  const size_t count = bytes / ctx.elemSize;
  const bool rootSend = ctx.rank == ctx.root && !ctx.inPlace;
  return {bytes, count, rootSend ? count : 0, count, static_cast<double>(bytes)};
}
void broadcastFill(const BenchContext& ctx, const Layout& l, Buffers& b) {
  if (ctx.rank != ctx.root) return;
  ctx.data->fillInput(ctx.root, 0, l.count, ctx.inPlace ? b.recv.data() : b.send.data());
}
size_t broadcastWrong(const BenchContext& ctx, const Layout& l, const Buffers& b, bool) {
  return ctx.data->countWrongInput(ctx.root, 0, l.count, b.recv.data());
}
mtxcomm_result_t broadcastRun(const BenchContext& ctx, const Layout& l, Buffers& b) {
  const void* send = ctx.rank != ctx.root ? nullptr : ctx.inPlace ? b.recv.data() : b.send.data();
  return mtxcomm_broadcast(b.dev(send), b.dev(b.recv.data()), l.count, ctx.dtype, ctx.root,
                           ctx.comm, ctx.stream);
}
// MPI_Bcast has one buffer: out of place, the root copies send to recv first, which is what
// mtxcomm_broadcast must do on the root too.
int broadcastMpi(const BenchContext& ctx, const Layout& l, Buffers& b) {
  if (ctx.rank == ctx.root && !ctx.inPlace && l.count > 0) {
    std::memcpy(b.recv.data(), b.send.data(), l.count * ctx.elemSize);
  }
  return MPI_Bcast(b.recv.data(), static_cast<int>(l.count), ctx.mpiType, ctx.root, MPI_COMM_WORLD);
}

// ---- reduce: Size = the whole buffer; recv used on the root (and as input when in place) ----

Layout reduceLayout(const BenchContext& ctx, size_t bytes) {
  const size_t count = bytes / ctx.elemSize;
  const bool recv = ctx.inPlace || ctx.rank == ctx.root;
  return {bytes, count, ctx.inPlace ? 0 : count, recv ? count : 0, static_cast<double>(bytes)};
}
void reduceFill(const BenchContext& ctx, const Layout& l, Buffers& b) {
  ctx.data->fillInput(ctx.rank, 0, l.count, ctx.inPlace ? b.recv.data() : b.send.data());
}
size_t reduceWrong(const BenchContext& ctx, const Layout& l, const Buffers& b, bool) {
  return ctx.rank == ctx.root ? ctx.data->countWrongReduced(0, l.count, b.recv.data()) : 0;
}
mtxcomm_result_t reduceRun(const BenchContext& ctx, const Layout& l, Buffers& b) {
  void* recv = b.recv.empty() ? nullptr : b.recv.data();
  return mtxcomm_reduce(b.dev(ctx.inPlace ? b.recv.data() : b.send.data()), b.dev(recv), l.count,
                        ctx.dtype, ctx.op, ctx.root, ctx.comm, ctx.stream);
}
int reduceMpi(const BenchContext& ctx, const Layout& l, Buffers& b) {
  const int count = static_cast<int>(l.count);
  if (ctx.rank == ctx.root) {
    return MPI_Reduce(ctx.inPlace ? MPI_IN_PLACE : b.send.data(), b.recv.data(), count, ctx.mpiType,
                      ctx.mpiOp, ctx.root, MPI_COMM_WORLD);
  }
  return MPI_Reduce(ctx.inPlace ? b.recv.data() : b.send.data(), nullptr, count, ctx.mpiType,
                    ctx.mpiOp, ctx.root, MPI_COMM_WORLD);
}

// ---- allgather: Size = bytes each rank sends (OSU); algbw counts all n * Size bytes ---------

Layout allgatherLayout(const BenchContext& ctx, size_t bytes) {
  const size_t count = bytes / ctx.elemSize;
  return {bytes, count, ctx.inPlace ? 0 : count, count * ctx.nranks,
          static_cast<double>(bytes) * ctx.nranks};
}
void allgatherFill(const BenchContext& ctx, const Layout& l, Buffers& b) {
  ctx.data->fillInput(ctx.rank, 0, l.count,
                      ctx.inPlace ? at(b.recv, ctx, ctx.rank * l.count) : b.send.data());
}
size_t allgatherWrong(const BenchContext& ctx, const Layout& l, const Buffers& b, bool) {
  size_t wrong = 0;
  for (int q = 0; q < ctx.nranks; ++q) {
    wrong += ctx.data->countWrongInput(q, 0, l.count, at(b.recv, ctx, q * l.count));
  }
  return wrong;
}
mtxcomm_result_t allgatherRun(const BenchContext& ctx, const Layout& l, Buffers& b) {
  const void* send = ctx.inPlace ? at(b.recv, ctx, ctx.rank * l.count) : b.send.data();
  return mtxcomm_allgather(b.dev(send), b.dev(b.recv.data()), l.count, ctx.dtype, ctx.comm,
                           ctx.stream);
}
int allgatherMpi(const BenchContext& ctx, const Layout& l, Buffers& b) {
  const int count = static_cast<int>(l.count);
  return MPI_Allgather(ctx.inPlace ? MPI_IN_PLACE : b.send.data(), count, ctx.mpiType,
                       b.recv.data(), count, ctx.mpiType, MPI_COMM_WORLD);
}

// ---- reduce_scatter: Size = the whole input array (nccl-tests), recvcount = Size / (n * e) ---
// In place, mtxcomm leaves rank r's block at send + r * recvcount (NCCL convention), while
// MPI_Reduce_scatter_block with MPI_IN_PLACE leaves it at the start of the array.

Layout reduceScatterLayout(const BenchContext& ctx, size_t bytes) {
  const size_t count = bytes / ctx.elemSize / ctx.nranks;
  return {bytes, count, count * ctx.nranks, ctx.inPlace ? 0 : count, static_cast<double>(bytes)};
}
void reduceScatterFill(const BenchContext& ctx, const Layout& l, Buffers& b) {
  ctx.data->fillInput(ctx.rank, 0, l.count * ctx.nranks, b.send.data());
}
const unsigned char* reduceScatterResult(const BenchContext& ctx, const Layout& l, const Buffers& b,
                                         bool mpi) {
  if (!ctx.inPlace) return b.recv.data();
  return at(b.send, ctx, mpi ? 0 : ctx.rank * l.count);
}
size_t reduceScatterWrong(const BenchContext& ctx, const Layout& l, const Buffers& b, bool mpi) {
  return ctx.data->countWrongReduced(ctx.rank * l.count, l.count,
                                     reduceScatterResult(ctx, l, b, mpi));
}
mtxcomm_result_t reduceScatterRun(const BenchContext& ctx, const Layout& l, Buffers& b) {
  void* recv = ctx.inPlace ? at(b.send, ctx, ctx.rank * l.count) : b.recv.data();
  return mtxcomm_reduce_scatter(b.dev(b.send.data()), b.dev(recv), l.count, ctx.dtype, ctx.op,
                                ctx.comm, ctx.stream);
}
int reduceScatterMpi(const BenchContext& ctx, const Layout& l, Buffers& b) {
  return MPI_Reduce_scatter_block(
      ctx.inPlace ? MPI_IN_PLACE : b.send.data(), ctx.inPlace ? b.send.data() : b.recv.data(),
      static_cast<int>(l.count), ctx.mpiType, ctx.mpiOp, MPI_COMM_WORLD);
}

// ---- alltoall: Size = bytes each rank sends in all (nccl-tests), count = Size / (n * e) per
// rank pair. No in place in mtxcomm: --in-place is refused by the call (INVALID_ARGUMENT).

Layout alltoallLayout(const BenchContext& ctx, size_t bytes) {
  const size_t count = bytes / ctx.elemSize / ctx.nranks;
  return {bytes, count, count * ctx.nranks, count * ctx.nranks, static_cast<double>(bytes)};
}
void alltoallFill(const BenchContext& ctx, const Layout& l, Buffers& b) {
  ctx.data->fillInput(ctx.rank, 0, l.count * ctx.nranks, b.send.data());
}
// Block q of recv is rank q's input at its block for this rank.
size_t alltoallWrong(const BenchContext& ctx, const Layout& l, const Buffers& b, bool) {
  size_t wrong = 0;
  for (int q = 0; q < ctx.nranks; ++q) {
    wrong +=
        ctx.data->countWrongInput(q, ctx.rank * l.count, l.count, at(b.recv, ctx, q * l.count));
  }
  return wrong;
}
mtxcomm_result_t alltoallRun(const BenchContext& ctx, const Layout& l, Buffers& b) {
  return mtxcomm_alltoall(b.dev(b.send.data()), b.dev(b.recv.data()), l.count, ctx.dtype, ctx.comm,
                          ctx.stream);
}
int alltoallMpi(const BenchContext& ctx, const Layout& l, Buffers& b) {
  const int count = static_cast<int>(l.count);
  return MPI_Alltoall(b.send.data(), count, ctx.mpiType, b.recv.data(), count, ctx.mpiType,
                      MPI_COMM_WORLD);
}

// ---- barrier: no data --------------------------------------------------------------------

Layout barrierLayout(const BenchContext&, size_t) { return {}; }
void barrierFill(const BenchContext&, const Layout&, Buffers&) {}
size_t barrierWrong(const BenchContext&, const Layout&, const Buffers&, bool) { return 0; }
mtxcomm_result_t barrierRun(const BenchContext& ctx, const Layout&, Buffers&) {
  return mtxcomm_barrier(ctx.comm);
}
int barrierMpi(const BenchContext&, const Layout&, Buffers&) { return MPI_Barrier(MPI_COMM_WORLD); }

}  // namespace

const std::vector<CollDescriptor>& descriptors() {
  static const std::vector<CollDescriptor> kDescriptors = {
      {"allreduce", Collective::kAllreduce, "MPI_Allreduce",
       "Size = bytes of the whole buffer on each rank (count = Size / elemsize)", true,
       factorAllreduce, "2(n-1)/n", unitOne, allreduceLayout, allreduceFill, allreduceWrong,
       allreduceRun, allreduceMpi},
      {"broadcast", Collective::kBroadcast, "MPI_Bcast",
       "Size = bytes of the whole buffer (count = Size / elemsize); MPI out of place: the root "
       "copies send to recv, then MPI_Bcast",
       true, factorOne, "1", unitOne, broadcastLayout, broadcastFill, broadcastWrong, broadcastRun,
       broadcastMpi},
      {"reduce", Collective::kReduce, "MPI_Reduce",
       "Size = bytes of the whole buffer on each rank (count = Size / elemsize)", true, factorOne,
       "1", unitOne, reduceLayout, reduceFill, reduceWrong, reduceRun, reduceMpi},
      {"allgather", Collective::kAllgather, "MPI_Allgather",
       "Size = bytes each rank sends (OSU; sendcount = Size / elemsize); algbw counts the whole "
       "n * Size output (nccl-tests)",
       true, factorRing, "(n-1)/n", unitOne, allgatherLayout, allgatherFill, allgatherWrong,
       allgatherRun, allgatherMpi},
      {"reduce_scatter", Collective::kReduceScatter, "MPI_Reduce_scatter_block",
       "Size = bytes of the whole input array (nccl-tests; recvcount = Size / (n * elemsize))",
       true, factorRing, "(n-1)/n", unitRanks, reduceScatterLayout, reduceScatterFill,
       reduceScatterWrong, reduceScatterRun, reduceScatterMpi},
      {"alltoall", Collective::kAlltoall, "MPI_Alltoall",
       "Size = bytes each rank sends in all (nccl-tests; count = Size / (n * elemsize) per rank "
       "pair); out of place only",
       true, factorRing, "(n-1)/n", unitRanks, alltoallLayout, alltoallFill, alltoallWrong,
       alltoallRun, alltoallMpi},
      {"barrier", Collective::kBarrier, "MPI_Barrier", "no data (Size 0)", false, factorOne, "-",
       unitOne, barrierLayout, barrierFill, barrierWrong, barrierRun, barrierMpi},
  };
  return kDescriptors;
}

const CollDescriptor* findDescriptor(std::string_view name) {
  for (const CollDescriptor& d : descriptors()) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

}  // namespace bench
}  // namespace mtxcomm
