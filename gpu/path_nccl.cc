// nccl: NCCL as a whole-collective backend for device buffers when every rank owns its own GPU
// (gpu/device.h). NCCL picks its own algorithms (ring, tree, NVLS) and transports (NVLink,
// PCIe, InfiniBand); mtxcomm only bootstraps it and maps the call:
//   - bootstrap: rank 0 calls ncclGetUniqueId; the id goes to every rank by a broadcast over
//     mtxcomm's own host transport; every rank calls ncclCommInitRank (collective, first use);
//   - every collective maps one to one (same in-place conventions as mtxcomm's);
//   - AVG is ncclSum followed by mtxcomm's division kernel on the result, so the numbers are
//     mtxcomm's (sum, then divide; integers truncate) rather than ncclAvg's pre-multiplication.
// Selection keeps away the calls whose numbers NCCL does not promise as mtxcomm does:
// float16/bfloat16 sums on more than 2 ranks (rounded per hop) and floating min/max (NaN); and
// the reductions of int16, uint16 and bool, which NCCL has no type for (broadcast and allgather
// move them as bytes: ncclUint8, count x element size).
// NCCL is loaded at run time (gpu/nccl_api.h): every call goes through ncclApi()'s table.
// Source: NCCL's API (nccl.h, "Creating a communicator with options" in the NCCL docs).
#include <cstdlib>
#include <memory>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/device_paths.h"
#include "gpu/nccl_api.h"
#include "gpu/reduce_kernels.h"
#include "lib/base/dtype.h"

namespace mtxcomm {
namespace gpu {

namespace {

void checkNccl(ncclResult_t r, const char* call, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  const NcclApi& api = ncclApi();  // loaded: the failed call came through it
  const char* last = api.ncclGetLastError(comm);
  fail(MTXCOMM_CUDA_ERROR, call, " failed: ", api.ncclGetErrorString(r),
       last && *last ? strCat(" (", last, ")") : std::string());
}

ncclDataType_t ncclType(mtxcomm_datatype_t dt) {
  switch (dt) {
    case MTXCOMM_INT8:
      return ncclInt8;
    case MTXCOMM_UINT8:
      return ncclUint8;
    case MTXCOMM_INT32:
      return ncclInt32;
    case MTXCOMM_UINT32:
      return ncclUint32;
    case MTXCOMM_INT64:
      return ncclInt64;
    case MTXCOMM_UINT64:
      return ncclUint64;
    case MTXCOMM_FLOAT16:
      return ncclFloat16;
    case MTXCOMM_BFLOAT16:
      return ncclBfloat16;
    case MTXCOMM_FLOAT32:
      return ncclFloat32;
    case MTXCOMM_FLOAT64:
      return ncclFloat64;
    case MTXCOMM_INT16:
    case MTXCOMM_UINT16:
    case MTXCOMM_BOOL:
      // Moved as bytes by NcclPath::run; their reductions never reach this path.
      fail(MTXCOMM_UNSUPPORTED, "nccl: no NCCL datatype for ", datatypeName(dt),
           " reductions (the selector keeps them off this path)");
    default:
      fail(MTXCOMM_INVALID_ARGUMENT, "nccl: invalid datatype ", static_cast<int>(dt));
  }
}

ncclRedOp_t ncclOp(mtxcomm_op_t op) {
  switch (op) {
    case MTXCOMM_SUM:
    case MTXCOMM_AVG:  // divided afterwards
      return ncclSum;
    case MTXCOMM_PROD:
      return ncclProd;
    case MTXCOMM_MIN:
      return ncclMin;
    case MTXCOMM_MAX:
      return ncclMax;
    case MTXCOMM_ADASUM:  // refused before (lib/comm/comm.cc, devicePathDeclines): a guard
      fail(MTXCOMM_UNSUPPORTED, "nccl: op adasum is not supported on device buffers");
    default:
      fail(MTXCOMM_INVALID_ARGUMENT, "nccl: invalid op ", static_cast<int>(op));
  }
}

class NcclPath : public PathRunner {
 public:
  // Loads NCCL first (gpu/nccl_api.h): MTXCOMM_UNSUPPORTED, naming why, before any exchange.
  explicit NcclPath(HostCollectives& host) : api_(&ncclApi()), host_(host) {
    // Rank 0's id, with its result: a failure there fails every rank instead of leaving the
    // others waiting in ncclCommInitRank.
    struct {
      ncclUniqueId id;
      int32_t result;
    } boot{};
    if (host.rank() == 0) boot.result = api_->ncclGetUniqueId(&boot.id);
    CollArgs bc;
    bc.coll = Collective::kBroadcast;
    bc.sendbuf = &boot;
    bc.recvbuf = &boot;
    bc.count = sizeof(boot);
    bc.dtype = MTXCOMM_UINT8;
    host.run(bc);
    if (boot.result != ncclSuccess && host.rank() != 0) {
      fail(MTXCOMM_CUDA_ERROR, "ncclGetUniqueId failed on rank 0: ",
           api_->ncclGetErrorString(static_cast<ncclResult_t>(boot.result)));
    }
    checkNccl(static_cast<ncclResult_t>(boot.result), "ncclGetUniqueId", nullptr);
    checkNccl(api_->ncclCommInitRank(&nccl_, host.size(), boot.id, host.rank()), "ncclCommInitRank",
              nullptr);
  }
  ~NcclPath() override {
    if (nccl_) api_->ncclCommDestroy(nccl_);
  }

  void run(const CollArgs& a, cudaStream_t stream) override {
    const bool reduces = collectiveReduces(a.coll);
    // A data-movement collective of a type NCCL lacks moves its bytes.
    const bool asBytes = !reduces && !ncclReducesDatatype(a.dtype);
    const ncclDataType_t t = asBytes ? ncclUint8 : ncclType(a.dtype);
    const size_t count = asBytes ? a.count * datatypeSize(a.dtype) : a.count;
    const ncclRedOp_t op = reduces ? ncclOp(a.op) : ncclSum;
    switch (a.coll) {
      case Collective::kAllreduce:
        checkNccl(api_->ncclAllReduce(a.sendbuf, a.recvbuf, a.count, t, op, nccl_, stream),
                  "ncclAllReduce", nccl_);
        break;
      case Collective::kBroadcast:
        checkNccl(api_->ncclBroadcast(a.sendbuf, a.recvbuf, count, t, a.root, nccl_, stream),
                  "ncclBroadcast", nccl_);
        break;
      case Collective::kReduce:
        checkNccl(api_->ncclReduce(a.sendbuf, a.recvbuf, a.count, t, op, a.root, nccl_, stream),
                  "ncclReduce", nccl_);
        break;
      case Collective::kAllgather:
        checkNccl(api_->ncclAllGather(a.sendbuf, a.recvbuf, count, t, nccl_, stream),
                  "ncclAllGather", nccl_);
        break;
      case Collective::kReduceScatter:
        checkNccl(api_->ncclReduceScatter(a.sendbuf, a.recvbuf, a.count, t, op, nccl_, stream),
                  "ncclReduceScatter", nccl_);
        break;
      case Collective::kBarrier:
        break;
      case Collective::kAlltoall:  // refused by the communicator and devicePathDeclines
        fail(MTXCOMM_INTERNAL_ERROR, "alltoall reached the nccl device path");
    }
    const bool hasResult = a.coll != Collective::kReduce || host_.rank() == a.root;
    if (a.op == MTXCOMM_AVG && collectiveReduces(a.coll) && hasResult) {
      ReduceSources src;
      src.n = 1;
      src.p[0] = a.recvbuf;
      launchReduce(a.dtype, MTXCOMM_SUM, a.recvbuf, src, a.count, host_.size(), stream);
    }
  }

 private:
  const NcclApi* api_;
  HostCollectives& host_;
  ncclComm_t nccl_ = nullptr;
};

}  // namespace

bool ncclBuilt() { return true; }

bool ncclLoaded() { return ncclLoadResult().error.empty(); }

std::string ncclSummary() { return ncclLibrarySummary(); }

int ncclLoadedVersion(std::string* why) {
  const NcclLoad& l = ncclLoadResult();
  if (l.error.empty()) return l.version;
  *why = "nccl: cannot load NCCL: " + l.error;
  return 0;
}

bool ncclSharesGpus() {
  const char* v = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  return ncclLoaded() && ncclLoadResult().version >= kNcclSharedGpuVersion && v &&
         std::string(v) == "1";
}

std::unique_ptr<PathRunner> makeNcclPath(HostCollectives& host, int device) {
  return std::make_unique<NcclPath>(host);
}

}  // namespace gpu
}  // namespace mtxcomm
