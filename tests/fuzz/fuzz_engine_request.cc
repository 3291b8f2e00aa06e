// libFuzzer target: the engine's negotiation messages (bindings/common/request.h): a peer's
// list of ready requests, decoded as the coordinator does. Malformed input is a
// std::runtime_error, never a crash or an allocation of an announced size.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "bindings/common/request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mtxcomm::binding::Reader rd(reinterpret_cast<const char*>(data), size);
  try {
    while (rd.remaining() > 0) {
      mtxcomm::binding::Request r = mtxcomm::binding::readRequest(rd);
      // Round trip: what was read writes back and reads the same.
      mtxcomm::binding::Writer w;
      mtxcomm::binding::writeRequest(w, r);
      mtxcomm::binding::Reader again(w.bytes().data(), w.bytes().size());
      (void)mtxcomm::binding::readRequest(again);
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
