// The C API's entry-point guards, shared by its files (c_api.cc: communicators and collectives;
// c_api_p2p.cc: point-to-point): run the call, turn an exception into a result code and record
// its message where mtxcomm_get_last_error finds it. Nothing here throws.
#ifndef MTXCOMM_LIB_COMM_C_API_GUARD_H_
#define MTXCOMM_LIB_COMM_C_API_GUARD_H_

#include <exception>
#include <new>
#include <string>

#include "lib/base/error.h"
#include "lib/comm/c_api.h"
#include "lib/comm/handle_registry.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm::capi {

// This thread's record of the last error of a call without a live communicator:
// mtxcomm_get_last_error(NULL).
std::string& threadError();

// Runs fn; turns an exception into its result code and message.
template <class Fn>
mtxcomm_result_t capture(Fn&& fn, std::string* message) {
  try {
    fn();
    return MTXCOMM_SUCCESS;
  } catch (const mtxcomm::Error& e) {
    *message = e.what();
    return e.code();
  } catch (const std::bad_alloc&) {
    *message = "out of memory";
    return MTXCOMM_SYSTEM_ERROR;
  } catch (const std::exception& e) {
    *message = std::string("internal error: ") + e.what();
    return MTXCOMM_INTERNAL_ERROR;
  } catch (...) {
    *message = "internal error: unknown exception";
    return MTXCOMM_INTERNAL_ERROR;
  }
}

// Entry points without a communicator (init, configuration): errors go to this thread's
// record, mtxcomm_get_last_error(NULL).
template <class Fn>
mtxcomm_result_t guardedNoComm(Fn&& fn) {
  std::string message;
  const mtxcomm_result_t code = capture(fn, &message);
  if (code != MTXCOMM_SUCCESS) threadError() = message;
  return code;
}

// Runs fn(comm's Comm) under a lease of a live handle; on failure records the message where
// mtxcomm_get_last_error(comm) finds it (this thread's record when comm is not live, or is a
// forked child's parent's).
template <class Fn>
mtxcomm_result_t guarded(mtxcomm_comm_t comm, Fn&& fn) {
  std::string message;
  bool leased = false;
  const mtxcomm_result_t code = capture(
      [&] {
        mtxcomm::HandleLease lease(comm);
        leased = true;
        fn(lease.comm());
      },
      &message);
  if (code == MTXCOMM_SUCCESS) return code;
  // Live when the call started; it may have been destroyed since, so look again.
  if (leased && mtxcomm::recordLastError(comm, message)) return code;
  threadError() = message;
  return code;
}

}  // namespace mtxcomm::capi

#endif  // MTXCOMM_LIB_COMM_C_API_GUARD_H_
