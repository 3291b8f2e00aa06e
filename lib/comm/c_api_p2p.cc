// The C API's point-to-point entry points (mtxcomm_isend, mtxcomm_irecv, mtxcomm_test,
// mtxcomm_wait, mtxcomm_request_source, mtxcomm_request_free, mtxcomm_send, mtxcomm_recv): checks,
// the registry of live requests, and the hand-over to the communicator's point-to-point channel
// (lib/comm/p2p.h).
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include "lib/base/dtype.h"
#include "lib/base/error.h"
#include "lib/comm/c_api.h"
#include "lib/comm/c_api_guard.h"
#include "lib/comm/handle_registry.h"
#include "lib/comm/p2p.h"
#include "mtxcomm/mtxcomm.h"

using mtxcomm::Comm;
using mtxcomm::Error;
using mtxcomm::capi::guarded;
using mtxcomm::capi::threadError;

// ---- Point-to-point ---------------------------------------------------------------------------

// A request handle: the operation (shared with the communicator's progress thread), the
// communicator whose last-error record gets its failure, and the timeout a wait defaults to.
struct mtxcomm_request_s {
  std::shared_ptr<mtxcomm::P2pOp> op;
  mtxcomm_comm_t comm;
  double timeoutSeconds;
};

namespace {

// The live request handles: a freed or never-made handle is refused, never dereferenced.
std::mutex g_requestsMu;
std::unordered_set<const mtxcomm_request_s*>& liveRequests() {
  static auto* live = new std::unordered_set<const mtxcomm_request_s*>();
  return *live;
}

// A copy of a live request's fields; throws MTXCOMM_INVALID_ARGUMENT for another handle.
mtxcomm_request_s lookupRequest(mtxcomm_request_t req, const char* entry) {
  if (!req) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, entry, ": req is NULL");
  std::lock_guard<std::mutex> lock(g_requestsMu);
  if (!liveRequests().count(req)) {
    mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, entry,
                  ": req is not a live request (freed already, or not made by mtxcomm_isend or "
                  "mtxcomm_irecv)");
  }
  return *req;
}

// Records a request's failure where mtxcomm_get_last_error finds it: its communicator's record
// while that is live, else this thread's.
void recordRequestError(mtxcomm_comm_t comm, const std::string& message) {
  if (!mtxcomm::recordLastError(comm, message)) threadError() = message;
}

// mtxcomm_isend and mtxcomm_irecv: checks every argument before anything is queued.
mtxcomm_result_t postP2p(bool isSend, const void* buf, size_t count, mtxcomm_datatype_t datatype,
                         int peer, int tag, mtxcomm_comm_t comm, mtxcomm_request_t* req) {
  const char* entry = isSend ? "mtxcomm_isend" : "mtxcomm_irecv";
  if (req) *req = nullptr;
  return guarded(comm, [&](Comm& c) {
    const int me = c.rank(), n = c.size();
    auto bad = [&](auto&&... what) {
      mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "rank ", me, ": ", entry, ": ", what...);
    };
    if (!req) bad("req (the output pointer) is NULL");
    const size_t es = mtxcomm::datatypeSize(datatype);
    if (es == 0) bad("datatype ", static_cast<int>(datatype), " is not a valid mtxcomm_datatype_t");
    if ((peer < 0 || peer >= n) && (isSend || peer != MTXCOMM_ANY_SOURCE)) {
      bad("peer ", peer, " is not a rank of this communicator (size ", n, ")",
          isSend ? "" : " nor MTXCOMM_ANY_SOURCE");
    }
    if (tag < 0 || tag > MTXCOMM_P2P_MAX_TAG) {
      bad("tag ", tag, " is out of range [0, ", MTXCOMM_P2P_MAX_TAG, "] (MTXCOMM_P2P_MAX_TAG)");
    }
    if (count > 0 && !buf) bad("buf is NULL with count ", count);
    if (count > SIZE_MAX / es) bad("count ", count, " x ", es, " bytes overflows size_t");
    mtxcomm::P2p* p2p = c.p2p();
    if (!p2p) {
      mtxcomm::fail(MTXCOMM_INVALID_USAGE, "rank ", me, ": ", entry,
                    ": this communicator has no point-to-point channel (it was not set up)");
    }
    std::shared_ptr<mtxcomm::P2pOp> op;
    try {
      op = p2p->post(isSend, peer, tag, const_cast<void*>(buf), count * es);
    } catch (const Error& e) {
      throw Error(e.code(), mtxcomm::strCat("rank ", me, ": ", entry, " (peer ", peer, ", tag ",
                                            tag, "): ", e.what()));
    }
    auto* handle = new mtxcomm_request_s{std::move(op), comm, c.config().timeoutSeconds};
    {
      std::lock_guard<std::mutex> lock(g_requestsMu);
      liveRequests().insert(handle);
    }
    *req = handle;
  });
}

// The outcome of a completed request: its code, its message recorded on failure.
mtxcomm_result_t finished(const mtxcomm_request_s& r) {
  const mtxcomm::P2pOp& op = *r.op;
  if (op.code != MTXCOMM_SUCCESS) recordRequestError(r.comm, op.message);
  return op.code;
}

}  // namespace

extern "C" {

mtxcomm_result_t mtxcomm_isend(const void* buf, size_t count, mtxcomm_datatype_t datatype, int peer,
                               int tag, mtxcomm_comm_t comm, mtxcomm_request_t* req) {
  return postP2p(true, buf, count, datatype, peer, tag, comm, req);
}

mtxcomm_result_t mtxcomm_irecv(void* buf, size_t count, mtxcomm_datatype_t datatype, int peer,
                               int tag, mtxcomm_comm_t comm, mtxcomm_request_t* req) {
  return postP2p(false, buf, count, datatype, peer, tag, comm, req);
}

mtxcomm_result_t mtxcomm_test(mtxcomm_request_t req, int* done) {
  std::string message;
  const mtxcomm_result_t code = mtxcomm::capi::capture(
      [&] {
        if (!done) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "mtxcomm_test: done is NULL");
        *done = 0;
        const mtxcomm_request_s r = lookupRequest(req, "mtxcomm_test");
        // A caller that polls makes progress too (one round, unless another thread is in one).
        if (!r.op->done.load(std::memory_order_acquire)) mtxcomm::progressOnCaller(*r.op->hub);
        if (!r.op->done.load(std::memory_order_acquire)) return;
        *done = 1;
        if (finished(r) != MTXCOMM_SUCCESS) throw Error(r.op->code, r.op->message);
      },
      &message);
  if (code != MTXCOMM_SUCCESS && !(done && *done)) threadError() = message;
  return code;
}

mtxcomm_result_t mtxcomm_wait(mtxcomm_request_t req, double timeout_seconds) {
  std::string message;
  const mtxcomm_result_t code = mtxcomm::capi::capture(
      [&] {
        if (std::isnan(timeout_seconds)) {
          mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "mtxcomm_wait: timeout_seconds is NaN");
        }
        const mtxcomm_request_s r = lookupRequest(req, "mtxcomm_wait");
        const double timeout = timeout_seconds > 0 ? timeout_seconds : r.timeoutSeconds;
        mtxcomm::waitP2pOp(*r.op, timeout, nullptr);
        if (finished(r) != MTXCOMM_SUCCESS) throw Error(r.op->code, r.op->message);
      },
      &message);
  if (code == MTXCOMM_INVALID_ARGUMENT) threadError() = message;
  return code;
}

mtxcomm_result_t mtxcomm_request_source(mtxcomm_request_t req, int* source) {
  std::string message;
  const mtxcomm_result_t code = mtxcomm::capi::capture(
      [&] {
        if (!source)
          mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "mtxcomm_request_source: source is NULL");
        const mtxcomm_request_s r = lookupRequest(req, "mtxcomm_request_source");
        if (!r.op->done.load(std::memory_order_acquire)) {
          mtxcomm::fail(MTXCOMM_INVALID_USAGE,
                        "mtxcomm_request_source: the request is still in "
                        "flight (",
                        mtxcomm::describeP2pOp(*r.op), "): wait for it first");
        }
        *source = r.op->isSend ? r.op->peer : r.op->source;
      },
      &message);
  if (code != MTXCOMM_SUCCESS) threadError() = message;
  return code;
}

mtxcomm_result_t mtxcomm_request_free(mtxcomm_request_t req) {
  if (!req) return MTXCOMM_SUCCESS;
  std::unique_lock<std::mutex> lock(g_requestsMu);
  if (!liveRequests().count(req)) {
    threadError() =
        "mtxcomm_request_free: req is not a live request (freed already, or not made by "
        "mtxcomm_isend or mtxcomm_irecv)";
    return MTXCOMM_INVALID_ARGUMENT;
  }
  if (!req->op->done.load(std::memory_order_acquire)) {
    threadError() = "mtxcomm_request_free: the request is still in flight (" +
                    mtxcomm::describeP2pOp(*req->op) +
                    "): wait for it or test it until done first; it was not freed";
    return MTXCOMM_INVALID_USAGE;
  }
  liveRequests().erase(req);
  lock.unlock();
  delete req;
  return MTXCOMM_SUCCESS;
}

}  // extern "C"

namespace {
// mtxcomm_send and mtxcomm_recv: post, wait (the communicator's timeout), free.
mtxcomm_result_t blockingP2p(bool isSend, const void* buf, size_t count,
                             mtxcomm_datatype_t datatype, int peer, int tag, mtxcomm_comm_t comm) {
  mtxcomm_request_t req = nullptr;
  mtxcomm_result_t rc = postP2p(isSend, buf, count, datatype, peer, tag, comm, &req);
  if (rc != MTXCOMM_SUCCESS) return rc;
  rc = mtxcomm_wait(req, 0.0);
  mtxcomm_request_free(req);  // completed: the wait returned
  return rc;
}
}  // namespace

extern "C" {

mtxcomm_result_t mtxcomm_send(const void* buf, size_t count, mtxcomm_datatype_t datatype, int peer,
                              int tag, mtxcomm_comm_t comm) {
  return blockingP2p(true, buf, count, datatype, peer, tag, comm);
}

mtxcomm_result_t mtxcomm_recv(void* buf, size_t count, mtxcomm_datatype_t datatype, int peer,
                              int tag, mtxcomm_comm_t comm) {
  return blockingP2p(false, buf, count, datatype, peer, tag, comm);
}

}  // extern "C"
