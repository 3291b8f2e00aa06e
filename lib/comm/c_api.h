// Internal helpers around the C handle: tests and tools wrap Comm objects (e.g. in-process
// ranks) into mtxcomm_comm_t so they go through the real C API.
#ifndef MTXCOMM_LIB_C_API_H_
#define MTXCOMM_LIB_C_API_H_

#include <memory>
#include <string>

#include "lib/comm/comm.h"
#include "mtxcomm/mtxcomm.h"

struct mtxcomm_comm {
  std::unique_ptr<mtxcomm::Comm> impl;
};

namespace mtxcomm {
inline mtxcomm_comm_t wrapComm(std::unique_ptr<Comm> c) { return new mtxcomm_comm{std::move(c)}; }
inline Comm* unwrapComm(mtxcomm_comm_t c) { return c ? c->impl.get() : nullptr; }
}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_C_API_H_
