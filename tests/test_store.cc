// The bootstrap stores (file:, tcp:) and MTXCOMM_STORE specs, with ranks as threads of one
// process, each with its own store client.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "lib/base/clock.h"
#include "lib/comm/stores.h"
#include "mtxcomm/mtxcomm.hpp"

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
