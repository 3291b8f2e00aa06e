// libFuzzer target: the TcpStore's request framing (lib/comm/store_wire.h) over arbitrary bytes,
// as rank 0's server parses a client's stream: every request it accepts lies inside the input
// and has the lengths it announced; nothing is allocated from a length.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "lib/comm/store_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t pos = 0;
  for (;;) {
    mtxcomm::StoreRequest req;
    const mtxcomm::StoreParse r = mtxcomm::parseStoreRequest(in.substr(pos), &req);
    if (r != mtxcomm::StoreParse::kRequest) break;
    if (req.used == 0 || req.used > size - pos || req.key.size() != req.keyBytes ||
        req.key.size() > mtxcomm::kStoreMaxKeyBytes ||
        req.value.size() > mtxcomm::kStoreMaxValueBytes) {
      std::abort();
    }
    pos += req.used;
  }
  return 0;
}
