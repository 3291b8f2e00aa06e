// Opening UCX in this process: the UCP context and worker, and the choice between eager and
// rendezvous (transports/ucx/ucx_transport.h, openUcxWorker).
#include "transports/ucx/ucx_worker.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "lib/base/error.h"
#include "transports/ucx/ucx_api.h"
#include "transports/ucx/ucx_transport.h"

namespace mtxcomm {

namespace {

// The RDMA devices UCX sees on this node ("ib/mlx5_0", ...): the memory domains of its ib and
// ugni components. None: the other nodes are reached over TCP (UCX's tcp component).
std::vector<std::string> rdmaDevices(const UcxApi& ucx) {
  std::vector<std::string> out;
  uct_component_h* comps = nullptr;
  unsigned n = 0;
  if (ucx.uct_query_components(&comps, &n) != UCS_OK) return out;
  for (unsigned i = 0; i < n; ++i) {
    uct_component_attr_t a{};
    a.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (ucx.uct_component_query(comps[i], &a) != UCS_OK || a.md_resource_count == 0) continue;
    const std::string name = a.name;
    if (name != "ib" && name != "ugni") continue;
    std::vector<uct_md_resource_desc_t> mds(a.md_resource_count);
    a.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    a.md_resources = mds.data();
    if (ucx.uct_component_query(comps[i], &a) != UCS_OK) continue;
    for (const auto& md : mds) out.push_back(name + "/" + md.md_name);
  }
  ucx.uct_release_component_list(comps);
  return out;
}

}  // namespace

std::string ucxStatusText(ucs_status_t s) { return ucxApi().ucs_status_string(s); }

std::shared_ptr<UcxWorker> openUcxWorker(size_t eagerLimit, bool acrossNodes, std::string* whyNot) {
  auto w = std::make_shared<UcxWorker>();
  try {
    w->api = &ucxApi();  // the first use in this process loads UCX
  } catch (const Error& e) {
    *whyNot = e.what();
    return nullptr;
  }
  const UcxApi& ucx = *w->api;
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucx.ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) {
    *whyNot = "ucp_config_read: " + ucxStatusText(s);
    return nullptr;
  }
  const char* userThresh = std::getenv("UCX_RNDV_THRESH");
  const std::vector<std::string> rdma =
      userThresh || !acrossNodes ? std::vector<std::string>{} : rdmaDevices(ucx);
  if (userThresh) {
    w->protocol = strCat("rendezvous threshold UCX_RNDV_THRESH=", userThresh);
  } else if (!acrossNodes) {
    w->protocol = "all ranks on one node: UCX's own rendezvous threshold";
  } else if (!rdma.empty()) {
    w->protocol = strCat("RDMA device ", rdma[0], rdma.size() > 1 ? " (and more)" : "",
                         ": UCX's own rendezvous threshold");
  } else if (eagerLimit == 0) {
    w->protocol = "no RDMA device: UCX's own rendezvous threshold (MTXCOMM_UCX_EAGER_LIMIT=0)";
  } else {
    s = ucx.ucp_config_modify(config, "RNDV_THRESH", std::to_string(eagerLimit).c_str());
    w->protocol = s == UCS_OK ? strCat("no RDMA device (TCP between nodes): messages up to ",
                                       eagerLimit, " bytes go eagerly (MTXCOMM_UCX_EAGER_LIMIT)")
                              : strCat(
                                    "no RDMA device, but setting UCX's rendezvous threshold "
                                    "failed (",
                                    ucxStatusText(s), "): UCX's own threshold");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  // ucp_init, an inline function of ucp.h, with the API version of the headers built against.
  s = ucx.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &w->context);
  ucx.ucp_config_release(config);
  if (s != UCS_OK) {
    w->context = nullptr;
    *whyNot = "ucp_init: " + ucxStatusText(s);
    return nullptr;
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // views of several threads, under one mutex
  s = ucx.ucp_worker_create(w->context, &wp, &w->worker);
  if (s != UCS_OK) {
    w->worker = nullptr;
    *whyNot = "ucp_worker_create: " + ucxStatusText(s);
    return nullptr;
  }
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  s = ucx.ucp_worker_get_address(w->worker, &addr, &len);
  if (s != UCS_OK) {
    *whyNot = "ucp_worker_get_address: " + ucxStatusText(s);
    return nullptr;
  }
  w->address.assign(reinterpret_cast<const char*>(addr), len);
  ucx.ucp_worker_release_address(w->worker, addr);
  if (ucx.ucp_worker_get_efd(w->worker, &w->efd) != UCS_OK) w->efd = -1;
  return w;
}

std::string ucxWorkerAddress(const UcxWorker& worker) { return worker.address; }
std::string ucxProtocolChoice(const UcxWorker& worker) { return worker.protocol; }

}  // namespace mtxcomm
