// The UCP context and worker of this process (openUcxWorker, transports/ucx/ucx_transport.h),
// shared by every view of the UCX transport.
#ifndef MTXCOMM_TRANSPORTS_UCX_UCX_WORKER_H_
#define MTXCOMM_TRANSPORTS_UCX_UCX_WORKER_H_

#include <string>

#include "transports/ucx/ucx_api.h"

namespace mtxcomm {

class UcxWorker {
 public:
  ~UcxWorker() {
    if (worker) api->ucp_worker_destroy(worker);
    if (context) api->ucp_cleanup(context);
  }
  const UcxApi* api = nullptr;  // UCX's functions, loaded by openUcxWorker
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string address;
  std::string protocol;  // how eager and rendezvous are chosen, for the log
  int efd = -1;          // the worker's event fd (UCP_FEATURE_WAKEUP), or -1: sleep instead
};

// The text of a UCX status. Only called once UCX is loaded (every status comes from it).
std::string ucxStatusText(ucs_status_t s);

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_UCX_UCX_WORKER_H_
