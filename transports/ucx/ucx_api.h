// The UCX functions the UCX transport calls (transports/ucx/ucx_transport.cc, ucx_worker.cc),
// loaded at run time.
//
// Why: libucs installs handlers for SIGSEGV, SIGBUS, SIGILL and SIGFPE (and more) from its
// library constructor, for the whole process, as soon as it is loaded. Linked into libmtxcomm it
// would be loaded with it: every program and Python interpreter that loads mtxcomm would get
// UCX's handlers even when no job ever uses UCX (most jobs on one node do not). So libmtxcomm
// does not link UCX; the first use of the UCX transport loads it, and only then are the handlers
// installed. After that UCX's own switch governs them (UCX_ERROR_SIGNALS, UCX_HANDLE_ERRORS).
//
// What: dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL), found by the loader's usual search
// (LD_LIBRARY_PATH, the cache, the default directories); when that fails, the same name in the
// directory UCX was found in at build time (MTXCOMM_UCX_LIBDIR: pkg-config's libdir of ucx). libucp
// brings in libuct and libucs (its dependencies), whose functions are found through the same
// handle. Every function pointer of UcxApi is resolved at once (dlsym); RTLD_LOCAL keeps UCX's
// symbols out of the global namespace. The library is never unloaded. UCX's headers are still
// used at compile time for its types, constants and macros (ucp_dt_make_contig, UCS_PTR_IS_ERR,
// ...); ucp_init, an inline function over ucp_init_version, is called as ucp_init_version with
// the API version of those headers, so a libucp older than them refuses as it would when linked.
//
// Errors: ucxApi() throws MTXCOMM_UNSUPPORTED naming the library and dlerror() when libucp
// cannot be loaded or lacks a function; it tries once per process (thread-safe) and every later
// call throws the same error.
#ifndef MTXCOMM_TRANSPORTS_UCX_UCX_API_H_
#define MTXCOMM_TRANSPORTS_UCX_UCX_API_H_

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

namespace mtxcomm {

// One pointer per UCX function used, named as the function itself (so that a grep for the UCX
// name finds the call) and typed from UCX's own declaration.
struct UcxApi {
  decltype(&::ucp_config_read) ucp_config_read;
  decltype(&::ucp_config_modify) ucp_config_modify;
  decltype(&::ucp_config_release) ucp_config_release;
  decltype(&::ucp_init_version) ucp_init_version;
  decltype(&::ucp_cleanup) ucp_cleanup;
  decltype(&::ucp_worker_create) ucp_worker_create;
  decltype(&::ucp_worker_destroy) ucp_worker_destroy;
  decltype(&::ucp_worker_progress) ucp_worker_progress;
  decltype(&::ucp_worker_arm) ucp_worker_arm;
  decltype(&::ucp_worker_get_efd) ucp_worker_get_efd;
  decltype(&::ucp_worker_get_address) ucp_worker_get_address;
  decltype(&::ucp_worker_release_address) ucp_worker_release_address;
  decltype(&::ucp_ep_create) ucp_ep_create;
  decltype(&::ucp_ep_close_nbx) ucp_ep_close_nbx;
  decltype(&::ucp_tag_send_nbx) ucp_tag_send_nbx;
  decltype(&::ucp_tag_recv_nbx) ucp_tag_recv_nbx;
  decltype(&::ucp_tag_probe_nb) ucp_tag_probe_nb;
  decltype(&::ucp_tag_msg_recv_nbx) ucp_tag_msg_recv_nbx;
  decltype(&::ucp_tag_recv_request_test) ucp_tag_recv_request_test;
  decltype(&::ucp_request_check_status) ucp_request_check_status;
  decltype(&::ucp_request_free) ucp_request_free;
  decltype(&::ucp_request_cancel) ucp_request_cancel;
  decltype(&::ucs_status_string) ucs_status_string;
  // libuct: the RDMA devices UCX sees (rdmaDevices in ucx_transport.cc).
  decltype(&::uct_query_components) uct_query_components;
  decltype(&::uct_component_query) uct_component_query;
  decltype(&::uct_release_component_list) uct_release_component_list;
};

// The loaded table (loaded on the first call). Throws MTXCOMM_UNSUPPORTED when UCX cannot be
// loaded (see above).
const UcxApi& ucxApi();

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_UCX_UCX_API_H_
