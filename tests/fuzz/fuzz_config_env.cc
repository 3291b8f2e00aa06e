// libFuzzer target: the environment's values. The first byte picks a registered variable
// (lib/comm/config.h), the rest is its value; Config::fromEnvironment either takes it or throws
// mtxcomm::Error(MTXCOMM_INVALID_USAGE) naming the variable, never a crash.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "lib/base/error.h"
#include "lib/comm/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto& vars = mtxcomm::configVars();
  const std::string& name = vars[data[0] % vars.size()].name;
  std::string value(reinterpret_cast<const char*>(data + 1), size - 1);
  value = value.substr(0, value.find('\0'));
  ::setenv(name.c_str(), value.c_str(), 1);
  try {
    mtxcomm::Config::fromEnvironment();
  } catch (const mtxcomm::Error& e) {
    if (e.code() != MTXCOMM_INVALID_USAGE ||
        std::string(e.what()).find(name) == std::string::npos) {
      ::abort();
    }
  }
  ::unsetenv(name.c_str());
  return 0;
}
