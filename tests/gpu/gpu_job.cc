// One rank of a multi-process device-buffer job (tests/gpu/gpu_driver.sh starts the ranks
// through MTXCOMM_STORE, with MTXCOMM_CUDA_PATH set to the path under test). Every collective,
// several datatypes and ops, counts that take several chunks of the scratch; inputs written,
// the call made and the result read back on one stream with no synchronisation in between
// (stream ordering). Prints "PASS" or a "FAIL: ..." line per failed check; exits 77 without a
// device, 1 on any failure.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/gpu_data.h"
#include "lib/c_api.h"

using mtxcomm::Collective;
namespace gd = mtxcomm::gpudata;

namespace {

int failures = 0;

#define CHECK_CUDA(call)                                                           \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                       \
      std::printf("FAIL: rank %d: %s: %s\n", rank, #call, cudaGetErrorString(e_)); \
      ++failures;                                                                  \
      return;                                                                      \
    }                                                                              \
  } while (0)

void runOne(mtxcomm_comm_t comm, int rank, int n, Collective c, mtxcomm_datatype_t dt,
            mtxcomm_op_t op, size_t count, const std::string& wantPath, cudaStream_t stream) {
  const size_t es = mtxcomm::datatypeSize(dt);
  const int root = n - 1;
  const size_t sendElems = c == Collective::kReduceScatter ? count * n : count;
  const size_t recvElems = c == Collective::kAllgather ? count * n : count;
  std::vector<unsigned char> in(sendElems * es), out(recvElems * es);
  for (size_t i = 0; i < sendElems; ++i) gd::store(dt, in.data(), i, gd::input(rank, i));
  void *send, *recv;
  CHECK_CUDA(cudaMalloc(&send, sendElems * es));
  CHECK_CUDA(cudaMalloc(&recv, recvElems * es));
  CHECK_CUDA(cudaMemsetAsync(recv, 0, recvElems * es, stream));
  CHECK_CUDA(cudaMemcpyAsync(send, in.data(), sendElems * es, cudaMemcpyHostToDevice, stream));
  mtxcomm_result_t r = MTXCOMM_SUCCESS;
  switch (c) {
    case Collective::kAllreduce:
      r = mtxcomm_allreduce(send, recv, count, dt, op, comm, stream);
      break;
    case Collective::kBroadcast:
      r = mtxcomm_broadcast(send, recv, count, dt, root, comm, stream);
      break;
    case Collective::kReduce:
      r = mtxcomm_reduce(send, recv, count, dt, op, root, comm, stream);
      break;
    case Collective::kAllgather:
      r = mtxcomm_allgather(send, recv, count, dt, comm, stream);
      break;
    default:
      r = mtxcomm_reduce_scatter(send, recv, count, dt, op, comm, stream);
  }
  const std::string what = std::string(mtxcomm::collectiveName(c)) + " " +
                           mtxcomm::datatypeName(dt) + " " + mtxcomm::opName(op) + " count " +
                           std::to_string(count);
  if (r != MTXCOMM_SUCCESS) {
    std::printf("FAIL: rank %d: %s: %s\n", rank, what.c_str(), mtxcomm_get_last_error(comm));
    ++failures;
    return;
  }
  const std::string path = mtxcomm::unwrapComm(comm)->lastAlgorithm();
  if (path != wantPath) {
    std::printf("FAIL: rank %d: %s took path %s, not %s\n", rank, what.c_str(), path.c_str(),
                wantPath.c_str());
    ++failures;
  }
  CHECK_CUDA(cudaMemcpyAsync(out.data(), recv, recvElems * es, cudaMemcpyDeviceToHost, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  size_t wrong = 0, first = 0;
  const bool hasResult = c != Collective::kReduce || rank == root;
  for (size_t i = 0; hasResult && i < recvElems; ++i) {
    if (gd::load(dt, out.data(), i) != gd::expected(c, op, dt, n, rank, root, count, i)) {
      if (wrong++ == 0) first = i;
    }
  }
  if (wrong) {
    std::printf("FAIL: rank %d: %s: %zu wrong, first at %zu: %g, want %g\n", rank, what.c_str(),
                wrong, first, gd::load(dt, out.data(), first),
                gd::expected(c, op, dt, n, rank, root, count, first));
    ++failures;
  }
  cudaFree(send);
  cudaFree(recv);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device visible\n");
    return 77;
  }
  mtxcomm_comm_t comm = nullptr;
  if (mtxcomm_comm_init_from_env(&comm) != MTXCOMM_SUCCESS) {
    std::printf("FAIL: init: %s\n", mtxcomm_get_last_error(nullptr));
    return 1;
  }
  int rank = 0, n = 1;
  mtxcomm_comm_rank(comm, &rank);
  mtxcomm_comm_size(comm, &n);
  cudaSetDevice(rank % devices);
  const char* forced = std::getenv("MTXCOMM_CUDA_PATH");
  const std::string path = forced ? forced : "host_staging";
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (Collective c : {Collective::kAllreduce, Collective::kBroadcast, Collective::kReduce,
                       Collective::kAllgather, Collective::kReduceScatter}) {
    // With MTXCOMM_CUDA_IPC_BYTES=1M, 400003 floats take several chunks.
    for (size_t count : {size_t{1}, size_t{1001}, size_t{400003}}) {
      runOne(comm, rank, n, c, MTXCOMM_FLOAT32, MTXCOMM_SUM, count, path, stream);
    }
  }
  runOne(comm, rank, n, Collective::kAllreduce, MTXCOMM_BFLOAT16, MTXCOMM_AVG, 300001, path,
         stream);
  runOne(comm, rank, n, Collective::kAllreduce, MTXCOMM_FLOAT16, MTXCOMM_SUM, 4097, path, stream);
  runOne(comm, rank, n, Collective::kReduceScatter, MTXCOMM_INT32, MTXCOMM_MAX, 70001, path,
         stream);
  runOne(comm, rank, n, Collective::kAllreduce, MTXCOMM_INT64, MTXCOMM_PROD, 999, path, stream);
  runOne(comm, rank, n, Collective::kReduce, MTXCOMM_FLOAT64, MTXCOMM_MIN, 12345, path, stream);
  cudaStreamDestroy(stream);
  mtxcomm_comm_destroy(comm);
  if (failures == 0) std::printf("rank %d: PASS\n", rank);
  return failures ? 1 : 0;
}
