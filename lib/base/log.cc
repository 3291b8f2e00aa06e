#include "lib/base/log.h"

#include <unistd.h>

#include <cstdio>
#include <mutex>

namespace mtxcomm {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::mutex g_mutex;
}  // namespace

std::optional<LogLevel> parseLogLevel(std::string_view s) {
  for (int l = 0; l <= static_cast<int>(LogLevel::kTrace); ++l) {
    if (s == logLevelName(static_cast<LogLevel>(l))) return static_cast<LogLevel>(l);
  }
  return std::nullopt;
}

const char* logLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kNone:
      return "NONE";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kTrace:
      return "TRACE";
  }
  return "?";
}

void setLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel logLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

void logMessage(LogLevel level, int rank, const std::string& message) {
  char host[64] = "?";
  gethostname(host, sizeof(host) - 1);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (rank >= 0) {
    std::fprintf(stderr, "[mtxcomm %s:%d rank %d] %s %s\n", host, static_cast<int>(getpid()), rank,
                 logLevelName(level), message.c_str());
  } else {
    std::fprintf(stderr, "[mtxcomm %s:%d] %s %s\n", host, static_cast<int>(getpid()),
                 logLevelName(level), message.c_str());
  }
  std::fflush(stderr);
}

void lockLogForFork() { g_mutex.lock(); }
void unlockLogAfterFork() { g_mutex.unlock(); }

}  // namespace mtxcomm
