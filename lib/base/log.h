// Logging to stderr: "[mtxcomm <host>:<pid> rank R] LEVEL message". The level comes from
// MTXCOMM_LOG_LEVEL (set at init); messages below it cost one atomic load.
#ifndef MTXCOMM_LIB_LOG_H_
#define MTXCOMM_LIB_LOG_H_

#include <atomic>
#include <optional>
#include <string>
#include <string_view>

#include "lib/base/error.h"

namespace mtxcomm {

enum class LogLevel { kNone = 0, kError = 1, kWarn = 2, kInfo = 3, kDebug = 4, kTrace = 5 };

std::optional<LogLevel> parseLogLevel(std::string_view s);
const char* logLevelName(LogLevel level);
void setLogLevel(LogLevel level);
LogLevel logLevel();
inline bool logEnabled(LogLevel level) { return level <= logLevel() && level != LogLevel::kNone; }
// rank < 0: not yet known.
void logMessage(LogLevel level, int rank, const std::string& message);
// fork(): the C API's pthread_atfork handlers hold the log's lock across fork() (taken last: no
// lock is taken while it is held), so that a child never inherits it held by a thread it does
// not have.
void lockLogForFork();
void unlockLogAfterFork();

}  // namespace mtxcomm

#define MTXCOMM_LOG(level, rank, ...)                                                            \
  do {                                                                                           \
    if (::mtxcomm::logEnabled(::mtxcomm::LogLevel::level))                                       \
      ::mtxcomm::logMessage(::mtxcomm::LogLevel::level, (rank), ::mtxcomm::strCat(__VA_ARGS__)); \
  } while (0)

#endif  // MTXCOMM_LIB_LOG_H_
