#include "transports/ucx/ucx_api.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "lib/base/error.h"

#ifndef MTXCOMM_UCX_LIBDIR
#define MTXCOMM_UCX_LIBDIR ""
#endif

namespace mtxcomm {
namespace {

constexpr const char* kUcpLibrary = "libucp.so.0";
// The directory UCX's libraries were found in at build time, the second place tried.
constexpr const char* kUcxBuildLibDir = MTXCOMM_UCX_LIBDIR;

// The result of the one attempt: the table, or why there is none.
struct Loaded {
  UcxApi api{};
  std::string error;  // "" = loaded
};

// dlerror()'s text (it names the file), or what failed when it has none.
std::string dlerrorText(const char* what) {
  const char* e = ::dlerror();
  return e ? e : strCat(what, ": unknown error");
}

// Opens libucp: by name, then in the build-time directory. The handle, or null and why in
// *error.
void* openUcp(std::string* error) {
  void* h = ::dlopen(kUcpLibrary, RTLD_NOW | RTLD_LOCAL);
  if (h) return h;
  *error = dlerrorText(kUcpLibrary);  // dlerror() names the file itself
  const std::string dir = kUcxBuildLibDir;
  if (dir.empty()) {
    *error += "; install UCX (Debian libucx0) or put its lib directory on LD_LIBRARY_PATH";
    return nullptr;
  }
  const std::string path = dir + "/" + kUcpLibrary;
  h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h) return h;
  *error += "; " + dlerrorText(path.c_str());
  *error += "; install UCX (Debian libucx0) or put its lib directory on LD_LIBRARY_PATH";
  return nullptr;
}

template <class F>
bool resolve(void* h, const char* name, F* out, std::string* error) {
  ::dlerror();  // clear
  void* sym = ::dlsym(h, name);
  if (!sym) {
    *error = strCat(dlerrorText(kUcpLibrary), " (a UCX older than the one mtxcomm was built with, ",
                    UCP_API_MAJOR, ".", UCP_API_MINOR, "?)");
    return false;
  }
  *out = reinterpret_cast<F>(sym);
  return true;
}

Loaded load() {
  Loaded l;
  void* h = openUcp(&l.error);
  if (!h) return l;
  UcxApi& a = l.api;
  // Every function, in UcxApi's order; the first one missing stops the loading.
  bool ok = true;
#define MTXCOMM_UCX_RESOLVE(fn) ok = ok && resolve(h, #fn, &a.fn, &l.error)
  MTXCOMM_UCX_RESOLVE(ucp_config_read);
  MTXCOMM_UCX_RESOLVE(ucp_config_modify);
  MTXCOMM_UCX_RESOLVE(ucp_config_release);
  MTXCOMM_UCX_RESOLVE(ucp_init_version);
  MTXCOMM_UCX_RESOLVE(ucp_cleanup);
  MTXCOMM_UCX_RESOLVE(ucp_worker_create);
  MTXCOMM_UCX_RESOLVE(ucp_worker_destroy);
  MTXCOMM_UCX_RESOLVE(ucp_worker_progress);
  MTXCOMM_UCX_RESOLVE(ucp_worker_arm);
  MTXCOMM_UCX_RESOLVE(ucp_worker_get_efd);
  MTXCOMM_UCX_RESOLVE(ucp_worker_get_address);
  MTXCOMM_UCX_RESOLVE(ucp_worker_release_address);
  MTXCOMM_UCX_RESOLVE(ucp_ep_create);
  MTXCOMM_UCX_RESOLVE(ucp_ep_close_nbx);
  MTXCOMM_UCX_RESOLVE(ucp_tag_send_nbx);
  MTXCOMM_UCX_RESOLVE(ucp_tag_recv_nbx);
  MTXCOMM_UCX_RESOLVE(ucp_tag_probe_nb);
  MTXCOMM_UCX_RESOLVE(ucp_tag_msg_recv_nbx);
  MTXCOMM_UCX_RESOLVE(ucp_tag_recv_request_test);
  MTXCOMM_UCX_RESOLVE(ucp_request_check_status);
  MTXCOMM_UCX_RESOLVE(ucp_request_free);
  MTXCOMM_UCX_RESOLVE(ucp_request_cancel);
  MTXCOMM_UCX_RESOLVE(ucs_status_string);
  MTXCOMM_UCX_RESOLVE(uct_query_components);
  MTXCOMM_UCX_RESOLVE(uct_component_query);
  MTXCOMM_UCX_RESOLVE(uct_release_component_list);
#undef MTXCOMM_UCX_RESOLVE
  return l;
}

}  // namespace

const UcxApi& ucxApi() {
  // The attempt never throws inside call_once (an exception leaving call_once is not portable
  // across C++ runtimes); its error is thrown here, the same on every call.
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  if (!loaded.error.empty()) {
    fail(MTXCOMM_UNSUPPORTED, "ucx transport: cannot load UCX: ", loaded.error);
  }
  return loaded.api;
}

}  // namespace mtxcomm
