// The bootstrap stores (file:, tcp:) and MTXCOMM_STORE specs, with ranks as threads of one
// process, each with its own store client.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "lib/base/clock.h"
#include "lib/base/liveness.h"
#include "lib/comm/stores.h"
#include "mtxcomm/mtxcomm.hpp"
#include "transports/tcp/tcp_transport.h"

namespace mtxcomm {
namespace {

using std::chrono::milliseconds;
using testutil::expectError;
using testutil::freePort;
using testutil::runThreads;
using testutil::tcpSpec;
using testutil::TempDir;
using testutil::testSecret;
constexpr milliseconds kTimeout(10000);

TEST(FileStore, SetGetAcrossThreads) {
  TempDir dir;
  const std::string value("bin\0ary\nvalue", 13);
  std::string got;
  std::thread reader([&] {
    auto store = makeStore(dir.fileSpec(), 1, 2, kTimeout, testSecret());
    got = store->get("some/key with space", kTimeout);
  });
  std::this_thread::sleep_for(milliseconds(50));
  auto store = makeStore(dir.fileSpec(), 0, 2, kTimeout, testSecret());
  store->set("some/key with space", value);
  reader.join();
  EXPECT_EQ(got, value);
  EXPECT_EQ(store->get("some/key with space", milliseconds(10)), value);
  store->set("empty", "");
  EXPECT_EQ(store->get("empty", milliseconds(10)), "");
}

TEST(FileStore, CreatesNestedDirectory) {
  TempDir dir;
  const std::string spec = "file:" + dir.path() + "/a/b/c/";
  auto store = makeStore(spec, 0, 1, kTimeout, testSecret());
  store->set("k", "v");
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() + "/a/b/c"));
  EXPECT_EQ(store->get("k", milliseconds(10)), "v");
  // A second job while this one runs is refused, naming the directory's lock holder.
  expectError([&] { makeStore(spec, 0, 1, kTimeout, testSecret()); }, MTXCOMM_INVALID_USAGE,
              {"another job is using this directory", "pid " + std::to_string(getpid())});
  // A later job in the same directory does not see the keys of this one.
  store.reset();
  expectError([&] { makeStore(spec, 0, 1, kTimeout, testSecret())->get("k", milliseconds(50)); },
              MTXCOMM_TIMEOUT, {"'k'"});
}

// A second job in a reused directory, whose rank 1 starts before its rank 0, must not read the
// keys of the first job: it waits for the new value.
TEST(FileStore, LaterJobNeverReadsStaleKeys) {
  TempDir dir;
  runThreads(2, [&](int rank) {
    auto store = makeStore(dir.fileSpec(), rank, 2, kTimeout, testSecret());
    store->set("tcp/addr/" + std::to_string(rank), "old");
  });
  // A file that is not the store's survives rank 0's clean-up.
  const std::string other = dir.path() + "/store/notes.txt";
  FILE* f = std::fopen(other.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  runThreads(2, [&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(milliseconds(100));
    auto store = makeStore(dir.fileSpec(), rank, 2, kTimeout, testSecret());
    if (rank == 0) store->set("tcp/addr/0", "new");
    EXPECT_EQ(store->get("tcp/addr/0", kTimeout), "new");
  });
  EXPECT_TRUE(std::filesystem::exists(other));
}

// Two processes asking to join as the same rank: two jobs share the directory.
TEST(FileStore, TwoClaimantsOfOneRankAreReported) {
  TempDir dir;
  const std::string path = dir.path() + "/store";
  std::filesystem::create_directories(path);
  std::thread claimants([&] {
    std::this_thread::sleep_for(milliseconds(50));  // after rank 0's clean-up
    for (const char* nonce : {"0123456789abcdef", "fedcba9876543210"}) {
      std::fclose(std::fopen((path + "/mtxcomm.hello.1." + nonce).c_str(), "w"));
    }
  });
  expectError([&] { makeStore(dir.fileSpec(), 0, 3, milliseconds(3000), testSecret()); },
              MTXCOMM_INVALID_USAGE, {"two processes ask to join as rank 1", "same directory"});
  claimants.join();
}

TEST(FileStore, GetTimesOutNamingKeyAndStore) {
  TempDir dir;
  auto store = makeStore(dir.fileSpec(), 0, 1, kTimeout, testSecret());
  auto start = Clock::now();
  expectError([&] { store->get("missing/key", milliseconds(150)); }, MTXCOMM_TIMEOUT,
              {"missing/key", dir.path(), "0.15 s"});
  auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(150));
  EXPECT_LT(elapsed, milliseconds(2000));
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Rank 0 of a file: job is a forked process that is killed during init, once before it
// publishes its transport's address (rank 1 then waits for the key 'tcp/job') and once after
// (rank 1 then finds its port closed and retries connecting): rank 1, with a bootstrap timeout
// of 20 s, fails within a fraction of a second with MTXCOMM_REMOTE_ERROR naming rank 0's pid
// (on this node: its process no longer exists), where it used to wait the whole timeout.
TEST(FileStore, RankZeroKilledDuringInitFailsTheOtherRanksFast) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "fork() of a multi-threaded process is not supported under ThreadSanitizer";
#else
  constexpr milliseconds kLong(20000);
  for (const bool published : {false, true}) {
    SCOPED_TRACE(published ? "after its address is published" : "before it publishes");
    TempDir dir;
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      alarm(20);  // a hang is a failure the parent sees
      try {
        auto store = makeStore(dir.fileSpec(), 0, 2, kLong, JobSecret());
        if (published) {
          makeTcpTransport(*store, 0, 2, kLong);  // publishes, then waits for rank 1
        } else {
          std::this_thread::sleep_for(milliseconds(300));  // rank 1 waits for 'tcp/job'
        }
      } catch (...) {
      }
      raise(SIGKILL);
    }
    auto store = makeStore(dir.fileSpec(), 1, 2, kLong, JobSecret());
    int status = 0;
    if (published) {
      // Gone for good (its listening socket closed) before rank 1 connects: a connection made
      // while it dies fails at once anyway, in the handshake.
      store->get("tcp/addr/0", kLong);
      ASSERT_EQ(kill(child, SIGKILL), 0);
      ASSERT_EQ(waitpid(child, &status, 0), child);
    }
    const auto start = Clock::now();
    std::string message;
    try {
      makeTcpTransport(*store, 1, 2, kLong);
      ADD_FAILURE() << "rank 1 bootstrapped without rank 0";
    } catch (const Error& e) {
      message = e.what();
      EXPECT_EQ(e.code(), MTXCOMM_REMOTE_ERROR) << message;
    }
    const double elapsed = secondsSince(start);
    EXPECT_LT(elapsed, 3.0) << message;
    EXPECT_TRUE(testutil::contains(message, "rank 0 (pid " + std::to_string(child) +
                                                ", on this node) is gone: its process "
                                                "exited during init"))
        << message;
    EXPECT_TRUE(testutil::contains(
        message, published ? "in its bootstrap" : "while this rank waited for key 'tcp/job'"))
        << message;
    if (!published) {
      ASSERT_EQ(waitpid(child, &status, 0), child);
    }
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  }
#endif
}

// Writes a heartbeat as rank 0 of a file: store does (lib/comm/file_store.cc): this user's
// private file, "<node>|<pid>\n<job>\n<counter>\n"; age: how long ago it was last written.
void writeHeartbeat(const std::string& dir, const std::string& node, long pid,
                    std::chrono::seconds age) {
  const std::string path = dir + "/mtxcomm.alive", tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << node << "|" << pid << "\n0123456789abcdef\n0000000000000001\n";
  }
  ASSERT_EQ(::chmod(tmp.c_str(), 0600), 0);
  if (age.count() > 0) {
    timespec times[2];
    clock_gettime(CLOCK_REALTIME, &times[0]);
    times[0].tv_sec -= age.count();
    times[1] = times[0];
    ASSERT_EQ(::utimensat(AT_FDCWD, tmp.c_str(), times, 0), 0);
  }
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

// A rank 0 on another node is judged by its heartbeat alone: one that stops changing for 5 s
// (as a killed rank 0 leaves it) fails rank 1 while it waits to be admitted. A heartbeat
// older than rank 1's request to join (an earlier job's rank 0, pid 1111, that died) is not
// this job's and is ignored: the error names pid 2222.
TEST(FileStore, RankZeroOnAnotherNodeIsGoneWhenItsHeartbeatStops) {
  TempDir dir;
  const std::string path = dir.path() + "/store";
  std::filesystem::create_directories(path);
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  const std::string elsewhere = "elsewhere|net:[1]|pid:[1]";
  writeHeartbeat(path, elsewhere, 1111, std::chrono::seconds(3600));
  const auto start = Clock::now();
  std::thread heartbeatStops([&] {
    std::this_thread::sleep_for(milliseconds(300));  // after rank 1's request to join
    writeHeartbeat(path, elsewhere, 2222, std::chrono::seconds(0));
  });
  expectError([&] { makeStore(dir.fileSpec(), 1, 2, milliseconds(20000), JobSecret()); },
              MTXCOMM_REMOTE_ERROR,
              {"rank 0 (pid 2222 on elsewhere) seems gone: its heartbeat " + path +
                   "/mtxcomm.alive has not changed for 5 s",
               "while this rank waited to be admitted to the job"});
  const double elapsed = secondsSince(start);
  EXPECT_GE(elapsed, 5.0);
  EXPECT_LT(elapsed, 9.0);
  heartbeatStops.join();
}

// A heartbeat left by an earlier job's rank 0 that died on this node (its pid gone) does not
// fail a rank that starts before the new rank 0: the job runs.
TEST(FileStore, AnEarlierJobsDeadRankZeroDoesNotFailALaterJob) {
  TempDir dir;
  const std::string path = dir.path() + "/store";
  std::filesystem::create_directories(path);
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  const std::string self = PeerLiveness::selfIdentity();
  writeHeartbeat(path, self.substr(0, self.rfind('|')), 999999999, std::chrono::seconds(60));
  runThreads(2, [&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(milliseconds(500));
    auto store = makeStore(dir.fileSpec(), rank, 2, kTimeout, JobSecret());
    if (rank == 0) store->set("k", "v");
    EXPECT_EQ(store->get("k", kTimeout), "v");
    store->set("done/" + std::to_string(rank), "");
    store->get("done/" + std::to_string(1 - rank), kTimeout);
  });
}

TEST(TcpStore, FourRanksExchangeKeys) {
  const std::string spec = tcpSpec();
  constexpr int kRanks = 4;
  runThreads(kRanks, [&](int rank) {
    // Rank 0 (the server) starts last: the clients must retry connecting.
    if (rank == 0) std::this_thread::sleep_for(milliseconds(150));
    auto store = makeStore(spec, rank, kRanks, kTimeout, testSecret());
    store->set("key/" + std::to_string(rank), "value of rank " + std::to_string(rank));
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(store->get("key/" + std::to_string(r), kTimeout),
                "value of rank " + std::to_string(r));
    }
    std::string big(100000, static_cast<char>('a' + rank));
    store->set("big/" + std::to_string(rank), big);
    EXPECT_EQ(store->get("big/" + std::to_string((rank + 1) % kRanks), kTimeout),
              std::string(100000, static_cast<char>('a' + (rank + 1) % kRanks)));
    // The server must outlive every client's last request.
    store->set("done/" + std::to_string(rank), "");
    if (rank == 0) {
      for (int r = 0; r < kRanks; ++r) store->get("done/" + std::to_string(r), kTimeout);
    }
  });
}

TEST(TcpStore, GetTimesOutThenStillWorks) {
  const std::string spec = tcpSpec();
  auto store = makeStore(spec, 0, 1, kTimeout, testSecret());
  auto start = Clock::now();
  expectError([&] { store->get("never/set", milliseconds(150)); }, MTXCOMM_TIMEOUT,
              {"never/set", spec});
  EXPECT_GE(Clock::now() - start, milliseconds(150));
  store->set("never/set", "late");
  EXPECT_EQ(store->get("never/set", kTimeout), "late");
  EXPECT_EQ(store->get("never/set", kTimeout), "late");
}

TEST(TcpStore, LocalhostWorks) {
  const std::string spec = "tcp:localhost:" + std::to_string(freePort());
  auto store = makeStore(spec, 0, 1, kTimeout, testSecret());
  store->set("a", "1");
  EXPECT_EQ(store->get("a", kTimeout), "1");
}

TEST(TcpStore, BindFailureNamesAddress) {
  // Hold a listening socket on the port, so rank 0 cannot bind it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  expectError([&] { makeStore("tcp:127.0.0.1:" + port, 0, 2, milliseconds(200), testSecret()); },
              MTXCOMM_SYSTEM_ERROR, {"127.0.0.1:" + port, "in use"});
  ::close(fd);
}

TEST(Store, BadSpecsAreInvalidUsage) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "expected file:PATH or tcp:HOST:PORT"},
      {"/tmp/x", "expected file:PATH or tcp:HOST:PORT"},
      {"tcp:localhost", "missing port"},
      {"tcp:localhost:", "missing port"},
      {"tcp::1234", "missing host"},
      {"tcp:localhost:12ab", "not a number"},
      {"tcp:localhost:70000", "not in [1, 65535]"},
      {"file:", "empty path"},
  };
  for (const auto& c : cases) {
    try {
      makeStore(c.first, 0, 1, milliseconds(100), testSecret());
      ADD_FAILURE() << "no error for '" << c.first << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_INVALID_USAGE) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("MTXCOMM_STORE=" + c.first + ": ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.second), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mtxcomm
