// The NCCL functions the nccl device path calls (gpu/path_nccl.cc), loaded at run time.
//
// Why: a CUDA build of mtxcomm serves host-only users too (the Python wheel, a CPU node of a
// GPU cluster); they must never need libnccl. And NCCL usually arrives with the framework, not
// the system: PyTorch's and JAX's CUDA wheels depend on the `nvidia-nccl-cu*` package, whose
// libnccl.so.2 lives in site-packages, outside the loader's search path. So libmtxcomm does not
// link NCCL; the first use of the nccl path (or the first device call, which asks whether NCCL
// is there) loads it.
//
// What: dlopen(libnccl.so.2, RTLD_NOW | RTLD_LOCAL), tried in this order:
//   1. MTXCOMM_NCCL_LIBRARY, a path to the library (when set, the only place tried);
//   2. the name, by the loader's usual search: LD_LIBRARY_PATH, the cache, the default
//      directories, and a libnccl.so.2 the process has already loaded (PyTorch loads its wheel's
//      NCCL on `import torch`, so the process keeps one NCCL);
//   3. the directory NCCL was found in at build time (MTXCOMM_NCCL_LIBDIR: the CUDA toolkit's,
//      or the Python environment's nvidia/nccl/lib).
// Every function of NcclApi is resolved at once (dlsym); the library is never unloaded. NCCL's
// header (nccl.h, from the same places at build time) gives the types and constants. A library
// older than kMinNcclVersion is refused: ncclGetLastError, used in every error message, came
// with NCCL 2.13.
//
// Errors: ncclApi() throws MTXCOMM_UNSUPPORTED naming the places tried and dlerror(); it tries
// once per process (thread-safe) and every later call throws the same error.
#ifndef MTXCOMM_GPU_NCCL_API_H_
#define MTXCOMM_GPU_NCCL_API_H_

#include <nccl.h>

#include <string>

namespace mtxcomm {
namespace gpu {

// NCCL_VERSION_CODE of the oldest NCCL accepted (2.13.0).
constexpr int kMinNcclVersion = 21300;
// NCCL_VERSION_CODE of the first NCCL that runs several ranks on one GPU
// (NCCL_MULTI_RANK_GPU_ENABLE=1, 2.30.0).
constexpr int kNcclSharedGpuVersion = 23000;

// One pointer per NCCL function used, named as the function (a grep for the NCCL name finds
// the call) and typed from NCCL's own declaration.
struct NcclApi {
  decltype(&::ncclGetVersion) ncclGetVersion;
  decltype(&::ncclGetUniqueId) ncclGetUniqueId;
  decltype(&::ncclCommInitRank) ncclCommInitRank;
  decltype(&::ncclCommDestroy) ncclCommDestroy;
  decltype(&::ncclGetErrorString) ncclGetErrorString;
  decltype(&::ncclGetLastError) ncclGetLastError;
  decltype(&::ncclAllReduce) ncclAllReduce;
  decltype(&::ncclBroadcast) ncclBroadcast;
  decltype(&::ncclReduce) ncclReduce;
  decltype(&::ncclAllGather) ncclAllGather;
  decltype(&::ncclReduceScatter) ncclReduceScatter;
};

// What one attempt to load NCCL found.
struct NcclLoad {
  NcclApi api{};
  int version = 0;    // NCCL_VERSION_CODE of the loaded library (ncclGetVersion)
  std::string path;   // the file loaded (dladdr), when loaded
  std::string error;  // "" = loaded
};

// One attempt: explicitPath (MTXCOMM_NCCL_LIBRARY) when not empty, else name by the loader's
// search, then name in buildLibDir. Never throws. For ncclApi() and its tests.
NcclLoad loadNccl(const std::string& explicitPath, const std::string& buildLibDir,
                  const std::string& name = "libnccl.so.2");

// The process's NCCL, loaded on first use from MTXCOMM_NCCL_LIBRARY or the places above.
// Throws MTXCOMM_UNSUPPORTED with the reason when it cannot be loaded.
const NcclApi& ncclApi();
// The process's attempt, without throwing (for the device topology and mtxcomm_info): the
// loaded version, or the reason in .error.
const NcclLoad& ncclLoadResult();
// "libnccl.so.2 2.30.7 (/path/libnccl.so.2)" or "not loadable: why".
std::string ncclLibrarySummary();

}  // namespace gpu
}  // namespace mtxcomm

#endif  // MTXCOMM_GPU_NCCL_API_H_
