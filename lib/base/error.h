// Internal error handling: library code throws mtxcomm::Error (code + message); the C API
// boundary (lib/comm/c_api.cc) turns it into a result code and the communicator's last error.
#ifndef MTXCOMM_LIB_ERROR_H_
#define MTXCOMM_LIB_ERROR_H_

#include <sstream>
#include <string>
#include <utility>

#include "mtxcomm/mtxcomm.hpp"

namespace mtxcomm {

// Concatenates its arguments with operator<<.
template <class... Args>
std::string strCat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <class... Args>
[[noreturn]] void fail(mtxcomm_result_t code, Args&&... args) {
  throw Error(code, strCat(std::forward<Args>(args)...));
}

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_ERROR_H_
