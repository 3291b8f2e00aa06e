// Internal error handling: library code throws mtxcomm::Error (code + message); the C API
// boundary (lib/comm/c_api.cc) turns it into a result code and the communicator's last error.
#ifndef MTXCOMM_LIB_ERROR_H_
#define MTXCOMM_LIB_ERROR_H_

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mtxcomm/mtxcomm.hpp"

namespace mtxcomm {

// Concatenates its arguments with operator<<.
template <class... Args>
std::string strCat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// "rank 3", "ranks 0-2,5" for sorted ranks, for messages.
inline std::string rankRanges(const std::vector<int>& ranks) {
  std::ostringstream s;
  s << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s << (i ? "," : "") << ranks[i];
    if (j > i) s << (j == i + 1 ? "," : "-") << ranks[j];
    i = j + 1;
  }
  return s.str();
}

template <class... Args>
[[noreturn]] void fail(mtxcomm_result_t code, Args&&... args) {
  throw Error(code, strCat(std::forward<Args>(args)...));
}

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_ERROR_H_
