// Small helpers the GoogleTest programs share: substring checks, an expected mtxcomm::Error,
// ranks as threads with a thread barrier, and the temporary directory and free TCP port that
// the bootstrap stores (file:, tcp:) need.
#ifndef MTXCOMM_TESTS_COMMON_TEST_UTIL_H_
#define MTXCOMM_TESTS_COMMON_TEST_UTIL_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "lib/base/auth.h"
#include "lib/base/error.h"

namespace mtxcomm {
namespace testutil {

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Expects fn to throw mtxcomm::Error with code and a message containing every part.
template <class Fn>
void expectError(Fn fn, mtxcomm_result_t code, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception, expected code " << code;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& part : parts) {
      EXPECT_TRUE(contains(e.what(), part)) << "'" << part << "' not in: " << e.what();
    }
  }
}

// A reusable barrier of n threads. breakAll() releases every waiter, now and later: a rank
// whose case failed with an exception calls it, so that the others do not wait for it forever.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) return;
    int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_ || broken_; });
    }
  }
  void breakAll() {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
  bool broken_ = false;
};

// Runs f(rank) on n threads; an exception escaping a rank is a test failure naming the rank.
template <class F>
void runThreads(int n, F f) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// A fresh directory under /tmp, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/mtxcomm_store_test_XXXXXX";
    char* p = ::mkdtemp(tmpl);
    EXPECT_NE(p, nullptr);
    path_ = p ? p : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string fileSpec() const { return "file:" + path_ + "/store"; }

 private:
  std::string path_;
};

// A port that was free a moment ago: bind to port 0 and read back what the kernel chose.
inline int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

inline std::string tcpSpec() { return "tcp:127.0.0.1:" + std::to_string(freePort()); }

// This process's resident memory (VmRSS of /proc/self/status), KiB; -1 if unknown.
inline long rssKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// The job secret of the tests' in-process jobs (lib/base/auth.h).
inline const JobSecret& testSecret() {
  static const JobSecret s = JobSecret::fromText("mtxcomm-tests-job-secret", "the tests' secret");
  return s;
}

}  // namespace testutil
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_TEST_UTIL_H_
