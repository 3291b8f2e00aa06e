#include "gpu/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <type_traits>

#include "lib/base/error.h"

#ifndef MTXCOMM_NCCL_LIBDIR
#define MTXCOMM_NCCL_LIBDIR ""
#endif

namespace mtxcomm {
namespace gpu {
namespace {

constexpr const char* kNcclLibrary = "libnccl.so.2";
constexpr const char* kInstallHint =
    "; install NCCL (`pip install nvidia-nccl-cu13`, or the system's libnccl2), put its lib "
    "directory on LD_LIBRARY_PATH, or set MTXCOMM_NCCL_LIBRARY to the file";

std::string dlerrorText(const std::string& what) {
  const char* e = ::dlerror();
  return e ? std::string(e) : what + ": unknown error";
}

void* openAt(const std::string& path, std::string* error) {
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) *error += (error->empty() ? "" : "; ") + dlerrorText(path);
  return h;
}

std::string versionText(int code) {
  // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9 (major*1000 + minor*100 +
  // patch before, which kMinNcclVersion refuses anyway).
  return strCat(code / 10000, ".", code / 100 % 100, ".", code % 100);
}

}  // namespace

NcclLoad loadNccl(const std::string& explicitPath, const std::string& buildLibDir,
                  const std::string& name) {
  NcclLoad l;
  void* h = nullptr;
  if (!explicitPath.empty()) {
    h = openAt(explicitPath, &l.error);
    if (!h) l.error = strCat("MTXCOMM_NCCL_LIBRARY=", explicitPath, ": ", l.error);
  } else {
    h = openAt(name, &l.error);
    if (!h && !buildLibDir.empty()) h = openAt(buildLibDir + "/" + name, &l.error);
    if (!h) l.error += kInstallHint;
  }
  if (!h) return l;
  l.error.clear();
  NcclApi& a = l.api;
  bool ok = true;
  auto resolve = [&](const char* name, auto* out) {
    if (!ok) return;
    ::dlerror();
    void* sym = ::dlsym(h, name);
    if (!sym) {
      l.error = strCat(dlerrorText(name), " (not NCCL, or an NCCL older than ",
                       versionText(kMinNcclVersion), ")");
      ok = false;
      return;
    }
    *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(sym);
  };
#define MTXCOMM_NCCL_RESOLVE(fn) resolve(#fn, &a.fn)
  MTXCOMM_NCCL_RESOLVE(ncclGetVersion);
  MTXCOMM_NCCL_RESOLVE(ncclGetUniqueId);
  MTXCOMM_NCCL_RESOLVE(ncclCommInitRank);
  MTXCOMM_NCCL_RESOLVE(ncclCommDestroy);
  MTXCOMM_NCCL_RESOLVE(ncclGetErrorString);
  MTXCOMM_NCCL_RESOLVE(ncclGetLastError);
  MTXCOMM_NCCL_RESOLVE(ncclAllReduce);
  MTXCOMM_NCCL_RESOLVE(ncclBroadcast);
  MTXCOMM_NCCL_RESOLVE(ncclReduce);
  MTXCOMM_NCCL_RESOLVE(ncclAllGather);
  MTXCOMM_NCCL_RESOLVE(ncclReduceScatter);
#undef MTXCOMM_NCCL_RESOLVE
  Dl_info info{};
  if (ok && ::dladdr(reinterpret_cast<void*>(a.ncclGetVersion), &info) && info.dli_fname) {
    l.path = info.dli_fname;
  }
  if (!ok) {  // not NCCL: nothing of it is kept
    l.error =
        strCat(explicitPath.empty() ? name : "MTXCOMM_NCCL_LIBRARY=" + explicitPath, ": ", l.error);
    l.api = NcclApi{};
    ::dlclose(h);
    return l;
  }
  if (a.ncclGetVersion(&l.version) != ncclSuccess || l.version < kMinNcclVersion) {
    l.error = strCat(l.path, ": NCCL ", versionText(l.version), " is older than ",
                     versionText(kMinNcclVersion), ", the oldest mtxcomm uses");
  }
  return l;
}

const NcclLoad& ncclLoadResult() {
  static std::once_flag once;
  static NcclLoad loaded;
  std::call_once(once, [] {
    const char* explicitPath = std::getenv("MTXCOMM_NCCL_LIBRARY");
    loaded = loadNccl(explicitPath ? explicitPath : "", MTXCOMM_NCCL_LIBDIR);
  });
  return loaded;
}

const NcclApi& ncclApi() {
  const NcclLoad& l = ncclLoadResult();
  if (!l.error.empty()) fail(MTXCOMM_UNSUPPORTED, "nccl: cannot load NCCL: ", l.error);
  return l.api;
}

std::string ncclLibrarySummary() {
  const NcclLoad& l = ncclLoadResult();
  if (!l.error.empty()) return strCat("not loadable: ", l.error);
  return strCat(kNcclLibrary, " ", versionText(l.version), " (", l.path, ")");
}

}  // namespace gpu
}  // namespace mtxcomm
