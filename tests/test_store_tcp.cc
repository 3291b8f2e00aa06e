// Tests of the bootstrap stores (file:, tcp:) and of the TCP transport, with ranks as threads of
// one process, each with its own store client and transport.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "lib/comm/stores.h"
#include "mtxcomm/mtxcomm.hpp"
#include "transports/tcp/tcp_transport.h"
#include "transports/transport.h"

namespace mtxcomm {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout(10000);

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
  const std::string& path() const { return path_; }
  std::string fileSpec() const { return "file:" + path_ + "/store"; }

 private:
  std::string path_;
};

// A port that was free a moment ago: bind to port 0 and read back what the kernel chose.
int freePort() {
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

std::string tcpSpec() { return "tcp:127.0.0.1:" + std::to_string(freePort()); }

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

// Runs f(rank) on n threads; an exception escaping a rank is a test failure naming the rank.
template <class F>
void runRanks(int n, F f) {
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

// Expects fn to throw mtxcomm::Error with code and a message containing every part.
template <class Fn>
void expectError(Fn fn, mtxcomm_result_t code, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception, expected code " << code;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << e.what();
    }
  }
}

void waitOne(Transport& t, RequestPtr req, milliseconds timeout = kTimeout) {
  std::vector<RequestPtr> reqs;
  reqs.push_back(std::move(req));
  t.waitAll(reqs, Clock::now() + timeout);
}

// ---- stores ---------------------------------------------------------------------------------

TEST(FileStore, SetGetAcrossThreads) {
  TempDir dir;
  const std::string value("bin\0ary\nvalue", 13);
  std::string got;
  std::thread reader([&] {
    auto store = makeStore(dir.fileSpec(), 1, 2, kTimeout);
    got = store->get("some/key with space", kTimeout);
  });
  std::this_thread::sleep_for(milliseconds(50));
  auto store = makeStore(dir.fileSpec(), 0, 2, kTimeout);
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
  auto store = makeStore(spec, 0, 1, kTimeout);
  store->set("k", "v");
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() + "/a/b/c"));
  EXPECT_EQ(store->get("k", milliseconds(10)), "v");
  // A later job in the same directory does not see the keys of this one.
  expectError([&] { makeStore(spec, 0, 1, kTimeout)->get("k", milliseconds(50)); }, MTXCOMM_TIMEOUT,
              {"'k'"});
}

// A second job in a reused directory, whose rank 1 starts before its rank 0, must not read the
// keys of the first job: it waits for the new value.
TEST(FileStore, LaterJobNeverReadsStaleKeys) {
  TempDir dir;
  runRanks(2, [&](int rank) {
    auto store = makeStore(dir.fileSpec(), rank, 2, kTimeout);
    store->set("tcp/addr/" + std::to_string(rank), "old");
  });
  // A file that is not the store's survives rank 0's clean-up.
  const std::string other = dir.path() + "/store/notes.txt";
  FILE* f = std::fopen(other.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  runRanks(2, [&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(milliseconds(100));
    auto store = makeStore(dir.fileSpec(), rank, 2, kTimeout);
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
  expectError([&] { makeStore(dir.fileSpec(), 0, 3, milliseconds(3000)); }, MTXCOMM_INVALID_USAGE,
              {"two processes ask to join as rank 1", "same directory"});
  claimants.join();
}

TEST(FileStore, GetTimesOutNamingKeyAndStore) {
  TempDir dir;
  auto store = makeStore(dir.fileSpec(), 0, 1, kTimeout);
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
  runRanks(kRanks, [&](int rank) {
    // Rank 0 (the server) starts last: the clients must retry connecting.
    if (rank == 0) std::this_thread::sleep_for(milliseconds(150));
    auto store = makeStore(spec, rank, kRanks, kTimeout);
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
  auto store = makeStore(spec, 0, 1, kTimeout);
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
  auto store = makeStore(spec, 0, 1, kTimeout);
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
  expectError([&] { makeStore("tcp:127.0.0.1:" + port, 0, 2, milliseconds(200)); },
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
      makeStore(c.first, 0, 1, milliseconds(100));
      ADD_FAILURE() << "no error for '" << c.first << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_INVALID_USAGE) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("MTXCOMM_STORE=" + c.first + ": ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.second), std::string::npos) << e.what();
    }
  }
}

// ---- TCP transport --------------------------------------------------------------------------

struct RankEnd {
  std::unique_ptr<Store> store;
  std::unique_ptr<Transport> transport;
};

RankEnd join(const std::string& spec, int rank, int size) {
  RankEnd e;
  e.store = makeStore(spec, rank, size, kTimeout);
  e.transport = makeTcpTransport(*e.store, rank, size, kTimeout);
  EXPECT_STREQ(e.transport->name(), "tcp");
  EXPECT_EQ(e.transport->rank(), rank);
  EXPECT_EQ(e.transport->size(), size);
  return e;
}

uint8_t pattern(size_t i, int sender, int salt) {
  return static_cast<uint8_t>((i * 131 + (i >> 11) * 7 + sender * 29 + salt) & 0xff);
}

void fill(std::vector<uint8_t>& buf, int sender, int salt) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(i, sender, salt);
}

// Index of the first wrong byte, or -1.
long firstWrong(const std::vector<uint8_t>& buf, int sender, int salt) {
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != pattern(i, sender, salt)) return static_cast<long>(i);
  }
  return -1;
}

void ringExchange(const std::string& spec, int n) {
  const std::vector<size_t> sizes = {0, 1, 1 << 20, 64 << 20};
  Barrier barrier(n);
  runRanks(n, [&](int rank) {
    RankEnd e = join(spec, rank, n);
    Transport& t = *e.transport;
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    for (size_t s = 0; s < sizes.size(); ++s) {
      std::vector<uint8_t> out(sizes[s]), in(sizes[s], 0);
      fill(out, rank, static_cast<int>(s));
      std::vector<RequestPtr> reqs;
      reqs.push_back(t.irecv(left, 3, in.data(), in.size()));
      reqs.push_back(t.isend(right, 3, out.data(), out.size()));
      t.waitAll(reqs, Clock::now() + kTimeout);
      EXPECT_EQ(firstWrong(in, left, static_cast<int>(s)), -1)
          << "rank " << rank << " size " << sizes[s];
    }
    barrier.wait();  // every rank done before any store server or socket goes away
  });
}

TEST(TcpTransport, RingTwoRanks) { ringExchange(TempDir().fileSpec(), 2); }
TEST(TcpTransport, RingThreeRanksOverTcpStore) { ringExchange(tcpSpec(), 3); }
TEST(TcpTransport, RingFiveRanks) {
  TempDir dir;
  ringExchange(dir.fileSpec(), 5);
}

TEST(TcpTransport, NonOvertakingSameTag) {
  TempDir dir;
  constexpr int kMessages = 300;
  auto bytesOf = [](int k) { return static_cast<size_t>(8 + (k % 4) * 5000); };
  runRanks(2, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 2);
    Transport& t = *e.transport;
    std::vector<std::vector<uint8_t>> bufs(kMessages);
    std::vector<RequestPtr> reqs;
    if (rank == 0) {
      for (int k = 0; k < kMessages; ++k) {
        bufs[k].resize(bytesOf(k));
        fill(bufs[k], 0, k);
        reqs.push_back(t.isend(1, 9, bufs[k].data(), bufs[k].size()));
      }
      t.waitAll(reqs, Clock::now() + kTimeout);
    } else {
      // Half the receives posted before the messages come, half after (unexpected queue).
      for (int k = 0; k < kMessages; ++k) {
        bufs[k].assign(bytesOf(k), 0);
        if (k == kMessages / 2) std::this_thread::sleep_for(milliseconds(100));
        reqs.push_back(t.irecv(0, 9, bufs[k].data(), bufs[k].size()));
      }
      t.waitAll(reqs, Clock::now() + kTimeout);
      for (int k = 0; k < kMessages; ++k) EXPECT_EQ(firstWrong(bufs[k], 0, k), -1) << k;
    }
    // Keep the sockets until rank 1 has everything.
    uint8_t token = 1;
    if (rank == 0) waitOne(t, t.irecv(1, 0, &token, 1));
    if (rank == 1) waitOne(t, t.isend(0, 0, &token, 1));
  });
}

TEST(TcpTransport, TagsMatchedIndependently) {
  TempDir dir;
  runRanks(2, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 2);
    Transport& t = *e.transport;
    std::vector<uint8_t> a(1000), b(300000), c(5);
    if (rank == 0) {
      fill(a, 0, 1);
      fill(b, 0, 2);
      fill(c, 0, 3);
      std::vector<RequestPtr> reqs;
      reqs.push_back(t.isend(1, 1, a.data(), a.size()));
      reqs.push_back(t.isend(1, 2, b.data(), b.size()));
      reqs.push_back(t.isend(1, Transport::kMaxTag, c.data(), c.size()));
      t.waitAll(reqs, Clock::now() + kTimeout);
      uint8_t token;
      waitOne(t, t.irecv(1, 0, &token, 1));
    } else {
      // Reverse order: tag kMaxTag first, then 2, then 1.
      waitOne(t, t.irecv(0, Transport::kMaxTag, c.data(), c.size()));
      EXPECT_EQ(firstWrong(c, 0, 3), -1);
      waitOne(t, t.irecv(0, 2, b.data(), b.size()));
      EXPECT_EQ(firstWrong(b, 0, 2), -1);
      waitOne(t, t.irecv(0, 1, a.data(), a.size()));
      EXPECT_EQ(firstWrong(a, 0, 1), -1);
      uint8_t token = 1;
      waitOne(t, t.isend(0, 0, &token, 1));
    }
  });
}

TEST(TcpTransport, SimultaneousLargeSendsDoNotDeadlock) {
  TempDir dir;
  runRanks(2, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 2);
    Transport& t = *e.transport;
    const int peer = 1 - rank;
    std::vector<uint8_t> out(48 << 20), in(48 << 20, 0);
    fill(out, rank, 5);
    // Each waits for its send alone, before posting the receive: only reading into the
    // unexpected queue while sending lets both complete.
    waitOne(t, t.isend(peer, 4, out.data(), out.size()));
    waitOne(t, t.irecv(peer, 4, in.data(), in.size()));
    EXPECT_EQ(firstWrong(in, peer, 5), -1);
    // And both ways with the receives posted, in one waitAll.
    fill(out, rank, 6);
    std::vector<RequestPtr> reqs;
    reqs.push_back(t.isend(peer, 4, out.data(), out.size()));
    reqs.push_back(t.irecv(peer, 4, in.data(), in.size()));
    t.waitAll(reqs, Clock::now() + kTimeout);
    EXPECT_EQ(firstWrong(in, peer, 6), -1);
    uint8_t token = 1;
    waitOne(t, rank == 0 ? t.irecv(1, 0, &token, 1) : t.isend(0, 0, &token, 1));
  });
}

TEST(TcpTransport, SplitViewUsesItsOwnContext) {
  TempDir dir;
  runRanks(3, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 3);
    Transport& t = *e.transport;
    std::unique_ptr<Transport> view;
    if (rank != 1) {
      view = t.split({2, 0}, 7);  // view rank 0 = rank 2, view rank 1 = rank 0
      EXPECT_EQ(view->size(), 2);
      EXPECT_EQ(view->rank(), rank == 2 ? 0 : 1);
      EXPECT_STREQ(view->name(), "tcp");
      expectError([&] { t.split({0, 2}, 7); }, MTXCOMM_INVALID_USAGE, {"context id 7"});
    }
    std::vector<uint8_t> parent_msg(4096), view_msg(4096), got(4096);
    if (rank == 0) {
      // Same peer, same tag, same size on both transports: only the context tells them apart.
      fill(parent_msg, 0, 11);
      fill(view_msg, 0, 22);
      waitOne(t, t.isend(2, 5, parent_msg.data(), parent_msg.size()));
      waitOne(*view, view->isend(0, 5, view_msg.data(), view_msg.size()));
      uint8_t token = 1;
      waitOne(t, t.isend(1, 0, &token, 1));
      waitOne(t, t.irecv(2, 0, &token, 1));
    } else if (rank == 2) {
      std::this_thread::sleep_for(milliseconds(50));  // both messages arrive unexpected
      waitOne(*view, view->irecv(1, 5, got.data(), got.size()));
      EXPECT_EQ(firstWrong(got, 0, 22), -1);
      waitOne(t, t.irecv(0, 5, got.data(), got.size()));
      EXPECT_EQ(firstWrong(got, 0, 11), -1);
      uint8_t token = 1;
      waitOne(t, t.isend(0, 0, &token, 1));
    } else {
      uint8_t token = 0;
      waitOne(t, t.irecv(0, 0, &token, 1));
      EXPECT_EQ(token, 1);
    }
  });
}

TEST(TcpTransport, SplitViewsOnTwoThreads) {
  // Distinct views may be used concurrently (transport.h): parent on one thread, view on another.
  TempDir dir;
  runRanks(2, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 2);
    Transport& t = *e.transport;
    std::unique_ptr<Transport> view = t.split({0, 1}, 1);
    auto pingpong = [&](Transport& tr, int salt) {
      std::vector<uint8_t> buf(200000);
      for (int round = 0; round < 20; ++round) {
        if ((round % 2) == rank) {
          fill(buf, rank, salt + round);
          waitOne(tr, tr.isend(1 - rank, 1, buf.data(), buf.size()));
        } else {
          waitOne(tr, tr.irecv(1 - rank, 1, buf.data(), buf.size()));
          EXPECT_EQ(firstWrong(buf, 1 - rank, salt + round), -1);
        }
      }
    };
    std::thread other([&] { pingpong(*view, 100); });
    pingpong(t, 0);
    other.join();
    uint8_t token = 1;
    waitOne(t, rank == 0 ? t.irecv(1, 0, &token, 1) : t.isend(0, 0, &token, 1));
  });
}

TEST(TcpTransport, DestroyedPeerIsRemoteErrorQuickly) {
  TempDir dir;
  Barrier barrier(2);
  runRanks(2, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 2);
    barrier.wait();
    if (rank == 0) {
      std::this_thread::sleep_for(milliseconds(100));
      e.transport.reset();
      return;
    }
    Transport& t = *e.transport;
    std::vector<uint8_t> buf(100);
    auto start = Clock::now();
    expectError([&] { waitOne(t, t.irecv(0, 1, buf.data(), buf.size())); }, MTXCOMM_REMOTE_ERROR,
                {"peer rank 0", "closed the connection", "receive"});
    EXPECT_LT(Clock::now() - start, milliseconds(3000));
    // The transport is failed from now on, pointing back to the first error.
    expectError([&] { t.isend(0, 1, buf.data(), buf.size()); }, MTXCOMM_INVALID_USAGE,
                {"peer rank 0 closed the connection"});
  });
}

TEST(TcpTransport, AbortedPeerIsRemoteErrorQuicklyForSendsToo) {
  TempDir dir;
  Barrier barrier(3);
  runRanks(3, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 3);
    Transport& t = *e.transport;
    barrier.wait();
    if (rank == 2) {
      std::this_thread::sleep_for(milliseconds(100));
      t.abort("test");
      expectError([&] { t.irecv(0, 1, nullptr, 0); }, MTXCOMM_INVALID_USAGE, {"aborted"});
      barrier.wait();
      return;
    }
    // Rank 0 waits to receive from rank 2, rank 1 to send 64 MiB to it (more than the socket
    // buffers hold, and nobody reads it).
    std::vector<uint8_t> buf(rank == 0 ? 16 : (64 << 20));
    auto start = Clock::now();
    expectError(
        [&] {
          waitOne(t, rank == 0 ? t.irecv(2, 1, buf.data(), buf.size())
                               : t.isend(2, 1, buf.data(), buf.size()));
        },
        MTXCOMM_REMOTE_ERROR, {"peer rank 2", rank == 0 ? "receive from" : "send to"});
    EXPECT_LT(Clock::now() - start, milliseconds(3000));
    barrier.wait();
  });
}

TEST(TcpTransport, PeerFinishingNormallyIsNoErrorForOthers) {
  // Rank 2 leaves early; 0 and 1 keep talking; messages rank 2 sent before leaving still arrive.
  TempDir dir;
  Barrier barrier(3);
  runRanks(3, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 3);
    Transport& t = *e.transport;
    uint32_t value = 0;
    if (rank == 2) {
      value = 42;
      waitOne(t, t.isend(0, 1, &value, sizeof(value)));
      barrier.wait();
      return;  // transport destroyed
    }
    barrier.wait();
    std::this_thread::sleep_for(milliseconds(50));
    if (rank == 0) {
      waitOne(t, t.irecv(2, 1, &value, sizeof(value)));
      EXPECT_EQ(value, 42u);
      value = 7;
      waitOne(t, t.isend(1, 1, &value, sizeof(value)));
    } else {
      waitOne(t, t.irecv(0, 1, &value, sizeof(value)));
      EXPECT_EQ(value, 7u);
    }
  });
}

// abort(reason) on a view: every member of every view that holds the aborting rank fails with
// the reason, named in its own view's numbering, also when it waits on another peer, and also
// when it only starts waiting after the ABORT frame came.
TEST(TcpTransport, AbortReasonReachesPeersInTheirNumbering) {
  TempDir dir;
  Barrier barrier(3);
  runRanks(3, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 3);
    // The view {2, 0, 1}: mesh rank 2 is view rank 0.
    std::unique_ptr<Transport> view = e.transport->split({2, 0, 1}, 5);
    barrier.wait();
    if (rank == 2) {
      std::this_thread::sleep_for(milliseconds(100));
      view->abort("disk on fire");
      barrier.wait();
      return;
    }
    std::vector<uint8_t> buf(16);
    const int other = rank == 0 ? 1 : 0;
    if (rank == 1) std::this_thread::sleep_for(milliseconds(300));  // waits only later
    auto start = Clock::now();
    // Ranks 0 and 1 wait on each other (nobody sends): only the ABORT frame can end the wait.
    Transport& t = rank == 0 ? *e.transport : *view;
    const int peer = rank == 0 ? other : other + 1;
    expectError([&] { waitOne(t, t.irecv(peer, 1, buf.data(), buf.size())); }, MTXCOMM_REMOTE_ERROR,
                {rank == 0 ? "peer rank 2 aborted: disk on fire (in the communicator of context 5)"
                           : "peer rank 0 aborted: disk on fire",
                 "receive from peer rank " + std::to_string(peer)});
    EXPECT_LT(Clock::now() - start, milliseconds(3000));
    barrier.wait();
  });
}

// A forked process is rank 2; ranks 0 and 1 are threads here and wait on each other while rank
// 2 exits. A crash (no BYE) must end their wait quickly, naming rank 2; a normal end (transport
// destroyed, then exit) must not disturb them.
void forkedPeerExits(bool crash) {
  TempDir dir;
  const std::string spec = dir.fileSpec();
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      RankEnd e;
      e.store = makeStore(spec, 2, 3, kTimeout);
      e.transport = makeTcpTransport(*e.store, 2, 3, kTimeout);
      e.store.reset();
      std::this_thread::sleep_for(milliseconds(200));
      if (crash) ::raise(SIGKILL);
      e.transport.reset();  // sends BYE
      ::_exit(0);
    } catch (...) {
      ::_exit(3);
    }
  }
  int status = -1;
  std::thread reaper([&] { ::waitpid(child, &status, 0); });  // a zombie still looks alive
  Barrier barrier(2);
  runRanks(2, [&](int rank) {
    RankEnd e = join(spec, rank, 3);
    Transport& t = *e.transport;
    uint32_t value = 0;
    auto start = Clock::now();
    if (crash) {
      expectError(
          [&] { waitOne(t, t.irecv(1 - rank, 1, &value, sizeof(value)), milliseconds(8000)); },
          MTXCOMM_REMOTE_ERROR,
          {"peer rank 2 (on this node) has exited",
           "receive from peer rank " + std::to_string(1 - rank)});
      EXPECT_LT(Clock::now() - start, milliseconds(3000));
    } else {
      std::this_thread::sleep_for(milliseconds(rank == 0 ? 600 : 0));  // rank 2 has left by then
      if (rank == 0) {
        value = 7;
        waitOne(t, t.isend(1, 1, &value, sizeof(value)));
      } else {
        waitOne(t, t.irecv(0, 1, &value, sizeof(value)));
        EXPECT_EQ(value, 7u);
      }
    }
    barrier.wait();
  });
  reaper.join();
  if (crash) {
    EXPECT_TRUE(WIFSIGNALED(status)) << status;
  } else {
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
}

TEST(TcpTransport, KilledLocalPeerIsRemoteErrorForAllWaiters) { forkedPeerExits(true); }
TEST(TcpTransport, LocalPeerEndingNormallyIsNoError) { forkedPeerExits(false); }

TEST(TcpTransport, ReceiveNobodySendsTimesOut) {
  TempDir dir;
  Barrier barrier(2);
  runRanks(2, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 2);
    Transport& t = *e.transport;
    if (rank == 0) {
      std::vector<uint8_t> buf(12);
      auto start = Clock::now();
      expectError([&] { waitOne(t, t.irecv(1, 17, buf.data(), buf.size()), milliseconds(200)); },
                  MTXCOMM_TIMEOUT,
                  {"timed out after 0.2", "receive from peer rank 1", "tag 17", "12 bytes"});
      auto elapsed = Clock::now() - start;
      EXPECT_GE(elapsed, milliseconds(200));
      EXPECT_LT(elapsed, milliseconds(1500));
      expectError([&] { t.irecv(1, 17, buf.data(), buf.size()); }, MTXCOMM_INVALID_USAGE,
                  {"timed out"});
    }
    barrier.wait();
  });
}

TEST(TcpTransport, SizeMismatchIsInvalidUsage) {
  TempDir dir;
  Barrier barrier(2);
  runRanks(2, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 2);
    Transport& t = *e.transport;
    std::vector<uint8_t> buf(16);
    if (rank == 0) {
      waitOne(t, t.isend(1, 2, buf.data(), 8));
    } else {
      expectError([&] { waitOne(t, t.irecv(0, 2, buf.data(), 16)); }, MTXCOMM_INVALID_USAGE,
                  {"peer rank 0", "tag 2", "16 bytes", "8 bytes"});
    }
    barrier.wait();
  });
}

TEST(TcpTransport, SelfSendAndBadArgumentsAreInternalError) {
  TempDir dir;
  Barrier barrier(2);
  runRanks(2, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 2);
    Transport& t = *e.transport;
    uint8_t b = 0;
    expectError([&] { t.isend(rank, 0, &b, 1); }, MTXCOMM_INTERNAL_ERROR, {"itself"});
    expectError([&] { t.irecv(rank, 0, &b, 1); }, MTXCOMM_INTERNAL_ERROR, {"itself"});
    expectError([&] { t.isend(2, 0, &b, 1); }, MTXCOMM_INTERNAL_ERROR, {"out of range"});
    expectError([&] { t.isend(1 - rank, Transport::kMaxTag + 1, &b, 1); }, MTXCOMM_INTERNAL_ERROR,
                {"tag"});
    // Still usable: these were rejected before anything moved.
    waitOne(t, rank == 0 ? t.isend(1, 0, &b, 1) : t.irecv(0, 0, &b, 1));
    barrier.wait();
  });
}

TEST(TcpTransport, SingleRank) {
  TempDir dir;
  RankEnd e = join(dir.fileSpec(), 0, 1);
  std::vector<RequestPtr> none;
  e.transport->waitAll(none, Clock::now());
}

}  // namespace
}  // namespace mtxcomm
