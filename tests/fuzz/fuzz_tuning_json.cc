// libFuzzer target: the tuning file (MTXCOMM_TUNING_FILE, lib/comm/cost_model.h) from arbitrary
// text. A bad file is mtxcomm::Error(MTXCOMM_INVALID_USAGE) naming it, never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "lib/base/error.h"
#include "lib/comm/cost_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    mtxcomm::CostParams p = mtxcomm::parseTuningText(text, "fuzz.json");
    // What parsed round-trips through the file format.
    if (mtxcomm::parseTuningText(mtxcomm::tuningFileJson(p), "again.json") != p) std::abort();
  } catch (const mtxcomm::Error& e) {
    if (e.code() != MTXCOMM_INVALID_USAGE) std::abort();
  }
  return 0;
}
