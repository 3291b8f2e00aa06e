// The trust cases of the bootstrap and the communicator, written as attacks where the finding
// was one: a stranger that dumps or rewrites the TCP store, impersonates a rank, stays silent,
// floods, or amplifies; a file planted by another user in a shared store directory; ranks that
// disagree on their size, rank, configuration or call; a handle used after destroy, or aborted
// from a watchdog thread. Each attack ends with the job's results correct, the stranger refused
// (and logged at WARN with its address), and init delayed by at most a few seconds.
// Ranks are threads of one process, each with its own store client, transport and communicator.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "lib/base/auth.h"
#include "lib/base/log.h"
#include "lib/base/socket_util.h"
#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "lib/comm/stores.h"
#include "mtxcomm/mtxcomm.h"
#include "mtxcomm/mtxcomm_engine.h"
#include "transports/inproc/inproc_transport.h"
#include "transports/shm/shm_group.h"
#include "transports/tcp/tcp_transport.h"

namespace mtxcomm {
namespace {

using std::chrono::milliseconds;
using testutil::Barrier;
using testutil::contains;
using testutil::expectError;
using testutil::freePort;
using testutil::runThreads;
using testutil::TempDir;
using testutil::testSecret;
constexpr milliseconds kTimeout(20000);

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A blocking connection to 127.0.0.1:port (-1 if refused).
int connectLoopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int last = 0;
  return connectWithRetry(addr, Clock::now() + milliseconds(5000), &last, "test");
}

// Everything the other end sends until it closes (or 8 s pass).
std::string readUntilClosed(int fd) {
  std::string got;
  char buf[4096];
  const auto deadline = Clock::now() + milliseconds(8000);
  while (Clock::now() < deadline) {
    timeval tv{0, 100000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return got;
    if (n > 0) got.append(buf, static_cast<size_t>(n));
  }
  ADD_FAILURE() << "the connection was not closed within 8 s";
  return got;
}

// A store request as the TcpStore protocol frames it (lib/comm/tcp_store_server.h).
std::string storeRequest(uint8_t op, const std::string& key, const std::string* value) {
  std::string req(1, static_cast<char>(op));
  uint64_t n = key.size();
  req.append(reinterpret_cast<const char*>(&n), 8);
  req += key;
  if (value) {
    n = value->size();
    req.append(reinterpret_cast<const char*>(&n), 8);
    req += *value;
  }
  return req;
}

// One rank of a TCP job: its store client, and a communicator over the TCP transport with
// MTXCOMM_SHM=off, so that every byte of the collectives crosses the sockets.
struct TcpRank {
  std::unique_ptr<Store> store;
  mtxcomm_comm_t comm = nullptr;
  ~TcpRank() {
    if (comm) mtxcomm_comm_destroy(comm);
  }
};

// Every rank allreduces [rank+1, 2*(rank+1), ...] over 1000 floats 20 times and checks the sum.
void expectCorrectAllreduces(mtxcomm_comm_t comm, int rank, int size) {
  std::vector<float> in(1000), out(1000);
  for (int it = 0; it < 20; ++it) {
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((rank + 1) * (i % 7 + it));
    ASSERT_EQ(mtxcomm_allreduce(in.data(), out.data(), in.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM,
                                comm, nullptr),
              MTXCOMM_SUCCESS)
        << mtxcomm_get_last_error(comm);
    const float ranks = static_cast<float>(size * (size + 1) / 2);
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(out[i], ranks * static_cast<float>(i % 7 + it)) << "element " << i;
    }
  }
}

class Trust : public ::testing::Test {
 protected:
  void SetUp() override { setLogLevel(LogLevel::kWarn); }
};

// ---- The TCP store --------------------------------------------------------------------------

// A stranger who reaches rank 0's store gets the handshake's challenge and nothing else: its
// GET of the job id and its SET of rank 0's address are never served, it is logged with its
// address, and the job runs correctly.
TEST_F(Trust, StoreStrangerReadsAndWritesNothing) {
  const int port = freePort();
  const std::string spec = "tcp:127.0.0.1:" + std::to_string(port);
  ::testing::internal::CaptureStderr();
  std::string strangerGot;
  Barrier storeUp(3);
  std::thread stranger([&] {
    storeUp.wait();
    int fd = connectLoopback(port);
    ASSERT_GE(fd, 0);
    const std::string fake = "127.0.0.1:1";
    std::string attack = storeRequest(2, "tcp/job", nullptr) +
                         storeRequest(1, "tcp/addr/0", &fake) +
                         storeRequest(2, "tcp/addr/1", nullptr);
    sendAll(fd, attack.data(), attack.size());
    strangerGot = readUntilClosed(fd);
    ::close(fd);
  });
  TcpRank ranks[2];
  runThreads(2, [&](int rank) {
    ranks[rank].store = makeStore(spec, rank, 2, kTimeout, testSecret());
    storeUp.wait();
    std::this_thread::sleep_for(milliseconds(300));  // the stranger's requests arrive first
    auto comm = std::make_unique<Comm>(makeTcpTransport(*ranks[rank].store, rank, 2, kTimeout),
                                       Config(), 0);
    comm->mutableConfig().shm = "off";
    comm->setup();
    ranks[rank].comm = wrapComm(std::move(comm));
    expectCorrectAllreduces(ranks[rank].comm, rank, 2);
  });
  stranger.join();
  const std::string log = ::testing::internal::GetCapturedStderr();
  // Only the challenge came back: no job id, no address, no status byte of a served request.
  EXPECT_EQ(strangerGot.size(), sizeof(AuthChallenge));
  EXPECT_TRUE(contains(log, "WARN")) << log;
  EXPECT_TRUE(contains(log, "dropped a connection from 127.0.0.1:")) << log;
  EXPECT_NE(ranks[0].store->get("tcp/addr/0", kTimeout), "127.0.0.1:1");
}

// A client with another secret is refused at the store: MTXCOMM_INVALID_USAGE naming the
// variable, within a few seconds, and the server keeps serving the job.
TEST_F(Trust, StoreRefusesAnotherSecret) {
  const std::string spec = testutil::tcpSpec();
  auto rank0 = makeStore(spec, 0, 2, kTimeout, testSecret());
  const JobSecret other = JobSecret::fromText("another job's secret, not ours", "test");
  auto start = Clock::now();
  expectError([&] { makeStore(spec, 1, 2, kTimeout, other); }, MTXCOMM_INVALID_USAGE,
              {"refused this rank's proof of the job secret", "MTXCOMM_JOB_SECRET"});
  EXPECT_LT(secondsSince(start), 3.0);
  auto rank1 = makeStore(spec, 1, 2, kTimeout, testSecret());
  rank0->set("k", "v");
  EXPECT_EQ(rank1->get("k", kTimeout), "v");
}

// A store that does not prove the secret (a stranger listening on the store's port) is never
// believed by a client.
TEST_F(Trust, ClientRefusesAServerWithoutTheSecret) {
  const std::string spec = testutil::tcpSpec();
  const JobSecret other = JobSecret::fromText("the stranger's secret, not ours", "test");
  auto fakeRank0 = makeStore(spec, 0, 2, kTimeout, other);  // a server with another secret
  expectError([&] { makeStore(spec, 1, 2, kTimeout, testSecret()); }, MTXCOMM_INVALID_USAGE,
              {"MTXCOMM_JOB_SECRET"});
}

// A process on the store's port that accepts connections and never speaks (not rank 0's
// server, which sends its challenge at once) holds a client for the handshake's own deadline of
// 5 s, not for its bootstrap timeout (20 s here): the client fails with MTXCOMM_TIMEOUT naming
// the address and the unanswered handshake.
TEST_F(Trust, SilentServerOnTheStorePortFailsTheClientWithinTheHandshakeDeadline) {
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 8), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string where = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  std::atomic<int> accepted{-1};
  std::thread silent([&] { accepted = ::accept(listener, nullptr, nullptr); });
  const auto start = Clock::now();
  expectError([&] { makeStore("tcp:" + where, 1, 2, kTimeout, testSecret()); }, MTXCOMM_TIMEOUT,
              {"store tcp:" + where, "the process listening on " + where,
               "accepted the connection but did not answer the handshake within 5 s"});
  const double elapsed = secondsSince(start);
  EXPECT_GE(elapsed, 4.5);
  EXPECT_LT(elapsed, 10.0);
  silent.join();
  EXPECT_GE(accepted.load(), 0);
  ::close(accepted.load());
  ::close(listener);
}

// No secret, no tcp: store: the error says how to set one.
TEST_F(Trust, TcpStoreNeedsASecret) {
  expectError([&] { makeStore(testutil::tcpSpec(), 0, 2, kTimeout, JobSecret()); },
              MTXCOMM_INVALID_USAGE, {"MTXCOMM_JOB_SECRET"});
}

// "host:port" as a TCP port number.
int portOf(const std::string& where) { return std::atoi(where.c_str() + where.rfind(':') + 1); }

// Silent connections to the store and to the ranks' transport ports, a flood of 300 of them,
// and a forged handshake claiming rank 1, delay init by at most a few seconds (every handshake
// has its own short deadline and runs beside the others); the real ranks are accepted, the
// strangers logged, and the job's results are correct.
TEST_F(Trust, SilentFloodingAndForgedConnectionsDoNotStallInit) {
  const int port = freePort();
  const std::string spec = "tcp:127.0.0.1:" + std::to_string(port);
  ::testing::internal::CaptureStderr();
  std::vector<int> strangers;
  TcpRank ranks[3];
  Barrier storeUp(4);
  std::thread stranger([&] {
    storeUp.wait();
    for (int i = 0; i < 300; ++i) {
      int fd = connectLoopback(port);
      if (fd >= 0) strangers.push_back(fd);
    }
  });
  std::vector<int> atTransport;
  auto start = Clock::now();
  runThreads(3, [&](int rank) {
    ranks[rank].store = makeStore(spec, rank, 3, kTimeout, testSecret());
    storeUp.wait();
    if (rank == 2) {
      // Where ranks 0 and 1 listen (a stranger would scan for it; here rank 2 reads it from the
      // store): silent connections and a forged response claiming rank 1 without the secret,
      // there before the real ranks 1 and 2 connect.
      for (int r = 0; r < 2; ++r) {
        const int p = portOf(ranks[2].store->get("tcp/addr/" + std::to_string(r), kTimeout));
        for (int i = 0; i < 3; ++i) atTransport.push_back(connectLoopback(p));
        int fd = connectLoopback(p);
        AuthChallenge c{};
        ASSERT_EQ(recvAll(fd, &c, sizeof(c), Clock::now() + milliseconds(5000)), IoResult::kOk);
        AuthResponse forged{};
        forged.magic = c.magic;
        forged.channel = c.channel;
        forged.claim[8] = 1;  // "from rank 1"
        sendAll(fd, &forged, sizeof(forged));
        atTransport.push_back(fd);
      }
    }
    if (rank == 1) std::this_thread::sleep_for(milliseconds(300));
    auto comm = std::make_unique<Comm>(makeTcpTransport(*ranks[rank].store, rank, 3, kTimeout),
                                       Config(), 0);
    comm->mutableConfig().shm = "off";
    comm->setup();
    ranks[rank].comm = wrapComm(std::move(comm));
  });
  const double initSeconds = secondsSince(start);
  stranger.join();
  EXPECT_LT(initSeconds, 6.0);
  runThreads(3, [&](int rank) { expectCorrectAllreduces(ranks[rank].comm, rank, 3); });
  for (int fd : strangers) ::close(fd);
  for (int fd : atTransport) ::close(fd);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "tcp bootstrap: dropped a connection from 127.0.0.1:")) << log;
}

// Memory amplification: a client of the job that SETs a 16 MiB value and sends 40 GETs of it
// without reading the answers costs rank 0's server at most a few MiB of buffered answers
// (requests are not read while 1 MiB is unsent), not 40 copies.
TEST_F(Trust, UnreadAnswersAreBounded) {
  const int port = freePort();
  const std::string spec = "tcp:127.0.0.1:" + std::to_string(port);
  auto rank0 = makeStore(spec, 0, 3, kTimeout, testSecret());
  int fd = connectLoopback(port);
  ASSERT_GE(fd, 0);
  struct {
    int32_t rank, size;
    uint64_t process, pad[2];
  } claim{2, 3, 12345, {0, 0}};  // rank 2's process
  uint8_t bytes[32];
  std::memcpy(bytes, &claim, sizeof(bytes));
  connectorHandshake(fd, testSecret(), kAuthStore, bytes, Clock::now() + kTimeout, "test client");
  const std::string value(16u << 20, 'x');
  std::string set = storeRequest(1, "big", &value);
  ASSERT_TRUE(sendAll(fd, set.data(), set.size()));
  uint8_t status = 9;
  ASSERT_EQ(recvAll(fd, &status, 1, Clock::now() + kTimeout), IoResult::kOk);
  ASSERT_EQ(status, 0);
  const long before = testutil::rssKiB();
  const std::string get = storeRequest(2, "big", nullptr);
  for (int i = 0; i < 40; ++i) {
    size_t sent = 0;
    sendSome(fd, get.data(), get.size(), &sent);
  }
  std::this_thread::sleep_for(milliseconds(1500));
  const long grown = testutil::rssKiB() - before;
  EXPECT_LT(grown, 200 * 1024) << "RSS grew by " << grown << " KiB";
  ::close(fd);
  auto rank1 = makeStore(spec, 1, 3, kTimeout, testSecret());
  EXPECT_EQ(rank1->get("big", kTimeout).size(), value.size());
}

// Two processes that claim one rank, and a rank with another size, fail every rank of the job
// at once with MTXCOMM_INVALID_USAGE naming the cause, not a timeout.
TEST_F(Trust, DuplicateRankAndSizeMismatchFailEveryRankFast) {
  for (int kind = 0; kind < 2; ++kind) {
    SCOPED_TRACE(kind == 0 ? "duplicate rank" : "size mismatch");
    const int port = freePort();
    const std::string spec = "tcp:127.0.0.1:" + std::to_string(port);
    auto start = Clock::now();
    runThreads(3, [&](int t) {
      try {
        if (t == 2 && kind == 0) {
          // Another process (its own process nonce) that holds the secret and claims rank 1.
          std::this_thread::sleep_for(milliseconds(200));
          int fd = connectLoopback(port);
          struct {
            int32_t rank, size;
            uint64_t process, pad[2];
          } claim{1, 3, 0x5eed, {0, 0}};
          uint8_t bytes[32];
          std::memcpy(bytes, &claim, sizeof(bytes));
          connectorHandshake(fd, testSecret(), kAuthStore, bytes, Clock::now() + kTimeout, "x");
          std::this_thread::sleep_for(milliseconds(3000));
          ::close(fd);
          return;
        }
        const int rank = t;
        const int size = (kind == 1 && t == 2) ? 4 : 3;
        auto store = makeStore(spec, rank, size, kTimeout, testSecret());
        auto transport = makeTcpTransport(*store, rank, size, kTimeout);
        ADD_FAILURE() << "rank " << rank << " joined a faulty job";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), MTXCOMM_INVALID_USAGE) << e.what();
        EXPECT_TRUE(
            contains(e.what(), kind == 0 ? "two processes claim MTXCOMM_RANK=1" : "MTXCOMM_SIZE=4"))
            << e.what();
      }
    });
    EXPECT_LT(secondsSince(start), 5.0);
  }
}

// ---- The file store ------------------------------------------------------------------------

// A store directory other users can write to (and not sticky) is refused by name.
TEST_F(Trust, FileStoreRefusesADirectoryOthersCanWrite) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/open";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  expectError([&] { makeStore("file:" + dir, 0, 1, kTimeout, JobSecret()); }, MTXCOMM_INVALID_USAGE,
              {dir, "writable by other users and not sticky"});
}

// In a sticky directory shared with other users (like /tmp), another user plants a join request
// as rank 1, a fake job folder and a fake answer to the real rank 1's request: none is
// believed, the planted request is logged, and the real ranks form the real job.
TEST_F(Trust, FileStoreIgnoresFilesPlantedByAnotherUser) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to create files owned by another user (uid 65534)";
  }
  TempDir tmp;
  const std::string dir = tmp.path() + "/shared";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 01777), 0);
  // Made under another name, given to the other user, then renamed into place: the store must
  // never see it while it is still this user's (rank 1 reads the dir meanwhile).
  auto plant = [&](const std::string& name, const std::string& text, bool folder) {
    const std::string path = dir + "/" + name;
    const std::string staging = tmp.path() + "/planting";
    if (folder) {
      ASSERT_EQ(::mkdir(staging.c_str(), 0755), 0);
    } else {
      std::ofstream(staging) << text;
      ::chmod(staging.c_str(), 0644);
    }
    ASSERT_EQ(::chown(staging.c_str(), 65534, 65534), 0);
    ASSERT_EQ(::rename(staging.c_str(), path.c_str()), 0);
  };
  const std::string fakeJob = "0123456789abcdef";
  plant("mtxcomm.job." + fakeJob, "", true);
  plant("mtxcomm.hello.1.fedcba9876543210", "", false);
  ::testing::internal::CaptureStderr();
  std::unique_ptr<Store> stores[2];
  std::string rank1Error;
  std::thread rank1([&] {
    try {
      stores[1] = makeStore("file:" + dir, 1, 2, kTimeout, JobSecret());
    } catch (const std::exception& e) {
      rank1Error = e.what();
    }
  });
  // The attacker answers the real rank 1's request as soon as it appears.
  std::string hello;
  for (int i = 0; i < 500 && hello.empty(); ++i) {
    for (auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string name = e.path().filename();
      if (name.rfind("mtxcomm.hello.1.", 0) == 0 && name != "mtxcomm.hello.1.fedcba9876543210") {
        hello = name;
      }
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  if (hello.empty()) {
    rank1.join();
    FAIL() << "rank 1 made no join request: " << rank1Error;
  }
  plant("mtxcomm.ack." + hello.substr(std::strlen("mtxcomm.hello.1.")), fakeJob, false);
  std::this_thread::sleep_for(milliseconds(200));
  std::string rank0Error;
  try {
    stores[0] = makeStore("file:" + dir, 0, 2, kTimeout, JobSecret());
  } catch (const std::exception& e) {
    rank0Error = e.what();
  }
  rank1.join();
  ASSERT_EQ(rank0Error, "");
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(rank1Error, "");
  ASSERT_TRUE(stores[1]);
  stores[0]->set("k", "the real rank 0");
  EXPECT_EQ(stores[1]->get("k", kTimeout), "the real rank 0");
  EXPECT_EQ(stores[0]->secret().hex(), stores[1]->secret().hex());
  EXPECT_TRUE(contains(log,
                       "ignored the join request 'mtxcomm.hello.1.fedcba9876543210' of uid "
                       "65534"))
      << log;
  EXPECT_TRUE(contains(log, "of uid 65534, mode 644 (not this user's private file")) << log;
}

// A file: store job whose ranks disagree on the size: rank 0's transport finds it and reports
// the fault through the store's fault file, so rank 1 (waiting for a rank 2 that never comes)
// fails at once with the cause, not after its timeout.
TEST_F(Trust, FileStoreJobFaultReachesTheWaitingRanks) {
  TempDir tmp;
  const std::string spec = "file:" + tmp.path() + "/job";
  const auto start = Clock::now();
  runThreads(2, [&](int rank) {
    const int size = rank == 0 ? 2 : 3;
    auto store = makeStore(spec, rank, size, kTimeout, JobSecret());
    expectError([&] { makeTcpTransport(*store, rank, size, kTimeout); }, MTXCOMM_INVALID_USAGE,
                {"rank 1 has MTXCOMM_SIZE=3"});
  });
  EXPECT_LT(secondsSince(start), 3.0);
}

// A rank with another secret is refused by the store; rank 0, which then waits for it in vain,
// says why when it gives up.
TEST_F(Trust, RankZeroNamesRefusedProofsWhenItTimesOut) {
  const std::string spec = testutil::tcpSpec();
  auto store = makeStore(spec, 0, 2, kTimeout, testSecret());
  const JobSecret other = JobSecret::fromText("another job's secret, not ours", "test");
  expectError([&] { makeStore(spec, 1, 2, kTimeout, other); }, MTXCOMM_INVALID_USAGE,
              {"MTXCOMM_JOB_SECRET"});
  expectError([&] { makeTcpTransport(*store, 0, 2, milliseconds(500)); }, MTXCOMM_TIMEOUT,
              {"waiting for peer rank(s) 1",
               "3 connection(s) to the store failed to prove the job "
               "secret"});
}

// A secret file that others can read, or a secret too short, is refused by name.
TEST_F(Trust, WeakSecretsAreRefused) {
  TempDir tmp;
  const std::string path = tmp.path() + "/secret";
  std::ofstream(path) << std::string(64, 'a');
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  expectError([&] { JobSecret::fromFile(path, "MTXCOMM_JOB_SECRET_FILE"); }, MTXCOMM_INVALID_USAGE,
              {"MTXCOMM_JOB_SECRET_FILE", path});
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_EQ(JobSecret::fromFile(path, "MTXCOMM_JOB_SECRET_FILE").hex().size(), 64u);
  expectError([&] { JobSecret::fromText("short", "MTXCOMM_JOB_SECRET"); }, MTXCOMM_INVALID_USAGE,
              {"MTXCOMM_JOB_SECRET"});
  expectError([&] { JobSecret::fromText(std::string(20, ' '), "MTXCOMM_JOB_SECRET"); },
              MTXCOMM_INVALID_USAGE, {"other than whitespace"});
  // A link to a private file is followed (mounted secrets are links); the file is checked.
  const std::string link = tmp.path() + "/link";
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  EXPECT_EQ(JobSecret::fromFile(link, "MTXCOMM_JOB_SECRET_FILE").hex(),
            JobSecret::fromFile(path, "MTXCOMM_JOB_SECRET_FILE").hex());
}

// ---- Agreement at init ----------------------------------------------------------------------

// Variables that must agree, set differently on some ranks, fail init on every rank naming
// each variable, its values and the ranks that hold them.
TEST_F(Trust, ConfigurationsThatDisagreeAreNamedOnEveryRank) {
  auto transports = makeInprocTransports(3);
  runThreads(3, [&](int rank) {
    Config cfg;
    if (rank == 2) cfg.segmentBytes = 65536;
    if (rank == 1) cfg.shm = "off";
    Comm comm(std::move(transports[rank]), cfg, 0);
    expectError([&] { comm.agreeConfig(); }, MTXCOMM_INVALID_USAGE,
                {"MTXCOMM_SEGMENT_BYTES differs: 1048576 on ranks 0,1, 65536 on rank 2",
                 "MTXCOMM_SHM differs: auto on ranks 0,2, off on rank 1"});
  });
  // And the same configuration passes.
  transports = makeInprocTransports(3);
  runThreads(3, [&](int rank) {
    Comm comm(std::move(transports[rank]), Config(), 0);
    comm.agreeConfig();
  });
}

// A rank of another mtxcomm build (another version, or a shared-memory segment laid out
// differently) is refused at init, before any segment is shared, naming the builds and ranks.
TEST_F(Trust, RanksOfAnotherBuildAreRefusedAtInit) {
  auto transports = makeInprocTransports(2);
  std::string verdict;
  runThreads(2, [&](int rank) {
    if (rank == 0) {
      Comm comm(std::move(transports[0]), Config(), 0);
      expectError([&] { comm.agreeConfig(); }, MTXCOMM_INVALID_USAGE,
                  {"mtxcomm build differs: ", ", shared-memory layout ",
                   "on rank 0, 9.9.9, shared-memory layout 0badcafe on rank 1",
                   "every rank must load the same mtxcomm library"});
      return;
    }
    // Rank 1 speaks the agreement's protocol as another build would: its record, then rank 0's
    // verdict.
    Transport& t = *transports[1];
    std::vector<char> record(8192, '\0'), answer(4096, '\0');
    const std::string mine = "mtxcomm build=9.9.9, shared-memory layout 0badcafe\n";
    std::memcpy(record.data(), mine.data(), mine.size());
    std::vector<RequestPtr> reqs;
    reqs.push_back(t.isend(0, Transport::kMaxTag, record.data(), record.size()));
    reqs.push_back(t.irecv(0, Transport::kMaxTag, answer.data(), answer.size()));
    t.waitAll(reqs, Clock::now() + kTimeout);
    verdict = answer.data();
  });
  EXPECT_EQ(verdict.rfind("mtxcomm build differs: ", 0), 0u) << verdict;
}

// ---- Calls that disagree over shared memory ----------------------------------------------------

// A code expected in the call, or kByNextCall: the call may succeed (a broadcast's root, and a
// reader with more than one peer, return before every peer has entered the call), and then the
// rank's next call (a barrier, or `next`) fails with MTXCOMM_INVALID_USAGE, before it moves a
// byte.
constexpr mtxcomm_result_t kByNextCall = static_cast<mtxcomm_result_t>(-1);

// Runs one call per rank over shm (n ranks, MTXCOMM_TIMEOUT 30 s) and expects codes[rank] on
// each rank within 3 s, the message naming parts; where a rank learns it at its next call, the
// next call's message names them. Under the given chunking; without one, a call of more bytes
// than the smallest slot (whose chunks then depend on the machine's L2) runs under each
// chunking a machine can pick.
void expectPromptError(int n,
                       const std::function<mtxcomm_result_t(mtxcomm_comm_t, int, float*)>& call,
                       const std::vector<mtxcomm_result_t>& codes,
                       const std::vector<std::string>& parts, size_t count = 256,
                       const std::function<mtxcomm_result_t(mtxcomm_comm_t, float*)>& next = {},
                       const std::optional<testing::ShmChunking>& chunking = {}) {
  if (!chunking && count * sizeof(float) > testing::shmChunkings().front().slotBytes) {
    for (const testing::ShmChunking& c : testing::shmChunkings()) {
      SCOPED_TRACE(c.name);
      expectPromptError(n, call, codes, parts, count, next, c);
    }
    return;
  }
  Config cfg;
  cfg.timeoutSeconds = 30;
  if (chunking) cfg = testing::withChunking(cfg, *chunking);
  testing::runRanks(
      n,
      [&](mtxcomm_comm_t comm, int rank) {
        ASSERT_TRUE(unwrapComm(comm)->hasShm());
        std::vector<float> buf(count, static_cast<float>(rank + 1));
        const auto start = Clock::now();
        mtxcomm_result_t rc = call(comm, rank, buf.data());
        if (codes[rank] == kByNextCall) {
          if (rc == MTXCOMM_SUCCESS) rc = next ? next(comm, buf.data()) : mtxcomm_barrier(comm);
          EXPECT_EQ(rc, MTXCOMM_INVALID_USAGE)
              << "rank " << rank << ": " << mtxcomm_get_last_error(comm);
        } else {
          EXPECT_EQ(rc, codes[rank]) << "rank " << rank << ": " << mtxcomm_get_last_error(comm);
        }
        EXPECT_LT(secondsSince(start), 3.0);
        if (rc == MTXCOMM_INVALID_USAGE) {
          const std::string msg = mtxcomm_get_last_error(comm);
          for (const auto& part : parts) EXPECT_TRUE(contains(msg, part)) << msg;
        }
      },
      cfg);
}

// The chunking the environment forces (tests/run_chunkings.sh) reaches every rank of a test
// that leaves it to the machine, and a test's own chunking wins over it.
TEST_F(Trust, ForcedChunkingReachesEveryRank) {
  setenv("MTXCOMM_SHM_SLOT_BYTES", "1M", 1);
  setenv("MTXCOMM_SHM_CHUNK_BYTES", "512K", 1);
  for (const bool own : {false, true}) {
    const Config cfg =
        own ? testing::withChunking(Config(), testing::shmChunkings().front()) : Config();
    testing::runRanks(
        3,
        [own](mtxcomm_comm_t c, int) {
          ShmGroup* g = unwrapComm(c)->notifier();
          ASSERT_NE(g, nullptr);
          EXPECT_EQ(g->slotBytes(), own ? size_t{256} << 10 : size_t{1} << 20);
          EXPECT_EQ(g->reductionChunkBytes(), own ? size_t{256} << 10 : size_t{512} << 10);
        },
        cfg);
  }
  unsetenv("MTXCOMM_SHM_SLOT_BYTES");
  unsetenv("MTXCOMM_SHM_CHUNK_BYTES");
}

// Both ranks write their own broadcast and wait for nobody. A broadcast of one chunk (at most
// the slot) returns at once on both, and each learns it at its next call; one of several
// chunks may find it in the call, when a root waits to reuse a set of slots and meets the
// other's call there (or at the next call, when it finds the peer not yet arrived). Under every
// chunking a machine can pick (1 MiB is one chunk in 1 MiB slots, several in smaller ones).
TEST_F(Trust, BroadcastWhereEachRankNamesItselfRootIsAnError) {
  for (const testing::ShmChunking& chunking : testing::shmChunkings()) {
    SCOPED_TRACE(chunking.name);
    for (const size_t count : {size_t{256}, size_t{1} << 18}) {
      std::vector<std::string> parts = {"root 0", "root 1"};
      if (count * sizeof(float) <= chunking.slotBytes) {
        parts.push_back("found when this rank entered call");
      }
      expectPromptError(
          2,
          [count](mtxcomm_comm_t c, int rank, float* b) {
            return mtxcomm_broadcast(b, b, count, MTXCOMM_FLOAT32, rank, c, nullptr);
          },
          {kByNextCall, kByNextCall}, parts, count, {}, chunking);
    }
  }
}

// Runs body(comm, rank) on n ranks over shm, as threads, each destroying its communicator
// itself when body returns (the harness destroys them one by one afterwards), and returns what
// each destroy returned; messages[rank] is mtxcomm_get_last_error then.
std::vector<mtxcomm_result_t> runAndDestroy(int n, const Config& cfg,
                                            const std::function<void(mtxcomm_comm_t, int)>& body,
                                            std::vector<std::string>* messages) {
  auto comms = testing::makeInprocComms(n, cfg);
  std::vector<mtxcomm_result_t> codes(n, MTXCOMM_SUCCESS);
  messages->assign(n, "");
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      unwrapComm(comms[r])->setup();
      body(comms[r], r);
      codes[r] = mtxcomm_comm_destroy(comms[r]);
      (*messages)[r] = mtxcomm_get_last_error(comms[r]);
    });
  }
  for (auto& t : threads) t.join();
  return codes;
}

// A disagreement no later call finds is not lost: destroy runs the checks still pending and
// returns MTXCOMM_INVALID_USAGE on every rank, with the message the next call would have given
// (every rank names itself root of a one-chunk broadcast, which returns at once on both: the
// line boxes, the small slots, one slot; under every chunking).
TEST_F(Trust, DestroyAfterADisagreeingBroadcastReturnsTheErrorOnEveryRank) {
  for (const testing::ShmChunking& chunking : testing::shmChunkings()) {
    SCOPED_TRACE(chunking.name);
    for (const size_t count : {size_t{16}, size_t{256}, chunking.slotBytes / sizeof(float)}) {
      SCOPED_TRACE("count " + std::to_string(count));
      Config cfg = testing::withChunking(Config(), chunking);
      cfg.timeoutSeconds = 30;
      std::vector<mtxcomm_result_t> calls(2, MTXCOMM_INTERNAL_ERROR);
      std::vector<std::string> messages;
      const auto start = Clock::now();
      const auto destroys = runAndDestroy(
          2, cfg,
          [&](mtxcomm_comm_t c, int rank) {
            std::vector<float> buf(count, static_cast<float>(rank + 1));
            calls[rank] =
                mtxcomm_broadcast(buf.data(), buf.data(), count, MTXCOMM_FLOAT32, rank, c, nullptr);
            // Each kept its own data: the call moved nothing between them.
            EXPECT_EQ(buf[count - 1], static_cast<float>(rank + 1));
          },
          &messages);
      EXPECT_LT(secondsSince(start), 3.0);
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(calls[r], MTXCOMM_SUCCESS) << "rank " << r;
        EXPECT_EQ(destroys[r], MTXCOMM_INVALID_USAGE) << "rank " << r << ": " << messages[r];
        for (const char* part : {"mtxcomm_comm_destroy", "the ranks disagree on the call", "root 0",
                                 "root 1", "found when this rank destroyed the communicator"}) {
          EXPECT_TRUE(contains(messages[r], part)) << "rank " << r << ": " << messages[r];
        }
      }
    }
  }
}

// Ranks that agree destroy with success, also when a peer enters the broadcast late (the
// destroy waits for it) and over three ranks; a rank whose peer destroys without ever making
// the call it waits to check fails its destroy naming that peer, at once.
TEST_F(Trust, DestroyWaitsForLatePeersAndNamesOneThatNeverCame) {
  Config cfg;
  cfg.timeoutSeconds = 30;
  for (const int n : {2, 3}) {
    std::vector<std::string> messages;
    const auto destroys = runAndDestroy(
        n, cfg,
        [n](mtxcomm_comm_t c, int rank) {
          if (rank == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
          std::vector<float> buf(64, static_cast<float>(rank));
          EXPECT_EQ(mtxcomm_broadcast(buf.data(), buf.data(), 64, MTXCOMM_FLOAT32, 0, c, nullptr),
                    MTXCOMM_SUCCESS);
          EXPECT_EQ(buf[63], 0.0f);
        },
        &messages);
    for (int r = 0; r < n; ++r) EXPECT_EQ(destroys[r], MTXCOMM_SUCCESS) << messages[r];
  }
  std::vector<std::string> messages;
  const auto start = Clock::now();
  const auto destroys = runAndDestroy(
      2, cfg,
      [](mtxcomm_comm_t c, int rank) {
        if (rank == 1) return;  // destroys without the broadcast
        std::vector<float> buf(64, 1.0f);
        EXPECT_EQ(mtxcomm_broadcast(buf.data(), buf.data(), 64, MTXCOMM_FLOAT32, 0, c, nullptr),
                  MTXCOMM_SUCCESS);
      },
      &messages);
  EXPECT_LT(secondsSince(start), 3.0);
  EXPECT_EQ(destroys[1], MTXCOMM_SUCCESS) << messages[1];
  EXPECT_EQ(destroys[0], MTXCOMM_REMOTE_ERROR) << messages[0];
  EXPECT_TRUE(contains(messages[0], "rank 1 destroyed its communicator after call #"))
      << messages[0];
  EXPECT_TRUE(contains(messages[0], "destroy's check of an earlier call")) << messages[0];
}

// Three ranks, two of which agree on a root the third does not name (roots 0,1,1 and 0,0,2),
// small (the ring of small slots) and large (the chunked slots): every rank fails, in the call
// or at its next one (the root of the two that agree, and its reader, have seen nothing wrong
// when the call returns).
TEST_F(Trust, BroadcastWhereTwoRanksAgreeOnARootTheThirdDoesNotNameFailsEveryRank) {
  for (const std::vector<int>& roots : {std::vector<int>{0, 1, 1}, std::vector<int>{0, 0, 2}}) {
    for (const size_t count : {size_t{256}, size_t{1} << 18}) {
      expectPromptError(
          3,
          [&roots, count](mtxcomm_comm_t c, int rank, float* b) {
            return mtxcomm_broadcast(b, b, count, MTXCOMM_FLOAT32, roots[rank], c, nullptr);
          },
          {kByNextCall, kByNextCall, kByNextCall}, {"root"}, count);
    }
  }
}

// A reader that waits on a root in another call fails in that call, as a rank in another
// collective that waits on the root does; the root learns it at its next call.
TEST_F(Trust, BroadcastWhereAReaderNamesAnotherRootFailsItAtOnce) {
  // Roots 0, 0, 1: rank 2 waits for rank 1's post, rank 1 is reading rank 0's.
  for (const size_t count : {size_t{256}, size_t{1} << 18}) {
    expectPromptError(
        3,
        [count](mtxcomm_comm_t c, int rank, float* b) {
          return mtxcomm_broadcast(b, b, count, MTXCOMM_FLOAT32, rank == 2 ? 1 : 0, c, nullptr);
        },
        {kByNextCall, kByNextCall, MTXCOMM_INVALID_USAGE}, {"root"}, count);
  }
}

TEST_F(Trust, BroadcastAgainstAllreduceIsAnError) {
  expectPromptError(
      2,
      [](mtxcomm_comm_t c, int rank, float* b) {
        return rank == 0 ? mtxcomm_broadcast(b, b, 256, MTXCOMM_FLOAT32, 0, c, nullptr)
                         : mtxcomm_allreduce(b, b, 256, MTXCOMM_FLOAT32, MTXCOMM_SUM, c, nullptr);
      },
      {kByNextCall, MTXCOMM_INVALID_USAGE}, {"broadcast", "allreduce"});
}

TEST_F(Trust, BarrierAgainstBroadcastIsAnError) {
  expectPromptError(2,
                    [](mtxcomm_comm_t c, int rank, float* b) {
                      return rank == 1
                                 ? mtxcomm_barrier(c)
                                 : mtxcomm_broadcast(b, b, 256, MTXCOMM_FLOAT32, 0, c, nullptr);
                    },
                    {kByNextCall, MTXCOMM_INVALID_USAGE}, {"barrier", "broadcast"});
}

// A small reduce goes through the line boxes (the non-roots write and return, the root reads
// them): ranks that name different roots, or a reduce against an allreduce, still fail on every
// rank, in the call or at the next one, naming what differs; the same with the slots' path.
TEST_F(Trust, ReduceWhereRanksNameDifferentRootsFailsEveryRank) {
  for (const std::vector<int>& roots :
       {std::vector<int>{0, 1}, std::vector<int>{0, 0, 1}, std::vector<int>{1, 0, 0}}) {
    for (const size_t count : {size_t{16}, size_t{1} << 18}) {
      const int n = static_cast<int>(roots.size());
      expectPromptError(
          n,
          [&roots, count](mtxcomm_comm_t c, int rank, float* b) {
            return mtxcomm_reduce(b, b, count, MTXCOMM_FLOAT32, MTXCOMM_SUM, roots[rank], c,
                                  nullptr);
          },
          std::vector<mtxcomm_result_t>(roots.size(), kByNextCall), {"root"}, count);
    }
  }
}

// Ranks that each name another rank root write their small reduce and wait for nobody: each
// learns it at its next call once the peers have entered theirs (50 ms later here), even when
// that is another small reduce (a rank that only writes small reduces must not run on for
// kMaxDeferred calls before it looks); the same for a count that only the root sees differ.
TEST_F(Trust, SmallReduceWhereNobodyIsRootFailsAtTheNextReduce) {
  auto nextReduce = [](mtxcomm_comm_t c, float* b) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return mtxcomm_reduce(b, b, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, 0, c, nullptr);
  };
  for (const std::vector<int>& roots : {std::vector<int>{1, 0}, std::vector<int>{1, 2, 0}}) {
    expectPromptError(
        static_cast<int>(roots.size()),
        [&roots](mtxcomm_comm_t c, int rank, float* b) {
          return mtxcomm_reduce(b, b, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, roots[rank], c, nullptr);
        },
        std::vector<mtxcomm_result_t>(roots.size(), kByNextCall), {"root"}, 8, nextReduce);
  }
  expectPromptError(
      3,
      [](mtxcomm_comm_t c, int rank, float* b) {
        return mtxcomm_reduce(b, b, rank == 2 ? 5 : 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, 0, c, nullptr);
      },
      {MTXCOMM_INVALID_USAGE, kByNextCall, kByNextCall}, {"count"}, 8, nextReduce);
}

TEST_F(Trust, ReduceAgainstAllreduceIsAnError) {
  for (const size_t count : {size_t{16}, size_t{1} << 18}) {
    expectPromptError(
        2,
        [count](mtxcomm_comm_t c, int rank, float* b) {
          return rank == 0
                     ? mtxcomm_reduce(b, b, count, MTXCOMM_FLOAT32, MTXCOMM_SUM, 0, c, nullptr)
                     : mtxcomm_allreduce(b, b, count, MTXCOMM_FLOAT32, MTXCOMM_SUM, c, nullptr);
        },
        {kByNextCall, kByNextCall}, {"reduce", "allreduce"}, count);
  }
}

// A root that runs on through broadcasts only learns of a disagreeing reader within
// ShmGroup::kMaxDeferred broadcasts (when its deferred checks are full), never later, and the
// reader fails at once.
TEST_F(Trust, ARootThatOnlyBroadcastsLearnsOfADisagreementWithinItsDeferredChecks) {
  Config cfg;
  cfg.timeoutSeconds = 30;
  // The reader names fewer elements (the same path, tagged lines) or more (another path, the
  // small slots) than the root's 64.
  for (const size_t readerCount : {size_t{32}, size_t{2048}}) {
    testing::runRanks(
        2,
        [&](mtxcomm_comm_t comm, int rank) {
          std::vector<float> buf(std::max<size_t>(readerCount, 64), static_cast<float>(rank + 1));
          const auto start = Clock::now();
          const std::string readers = "count " + std::to_string(readerCount);
          if (rank == 1) {
            EXPECT_EQ(mtxcomm_broadcast(buf.data(), buf.data(), readerCount, MTXCOMM_FLOAT32, 0,
                                        comm, nullptr),
                      MTXCOMM_INVALID_USAGE);
            EXPECT_TRUE(contains(mtxcomm_get_last_error(comm), "count 64"))
                << mtxcomm_get_last_error(comm);
          } else {
            mtxcomm_result_t rc = MTXCOMM_SUCCESS;
            size_t calls = 0;
            while (rc == MTXCOMM_SUCCESS && calls < 4 * ShmGroup::kMaxDeferred) {
              rc = mtxcomm_broadcast(buf.data(), buf.data(), 64, MTXCOMM_FLOAT32, 0, comm, nullptr);
              ++calls;
            }
            EXPECT_EQ(rc, MTXCOMM_INVALID_USAGE) << mtxcomm_get_last_error(comm);
            EXPECT_LE(calls, ShmGroup::kMaxDeferred + 1);
            EXPECT_TRUE(contains(mtxcomm_get_last_error(comm), readers))
                << mtxcomm_get_last_error(comm);
          }
          EXPECT_LT(secondsSince(start), 3.0);
        },
        cfg);
  }
}

// Two ranks that each name itself the root (both return at once), then broadcast from
// alternating roots: each rank is a reader of its only peer every other call (nothing deferred
// then), and still learns of the disagreement within kMaxDeferred calls of it.
TEST_F(Trust, AlternatingRootsLearnOfADisagreementWithinTheDeferredBound) {
  Config cfg;
  cfg.timeoutSeconds = 30;
  testing::runRanks(
      2,
      [&](mtxcomm_comm_t comm, int rank) {
        std::vector<int8_t> buf(100, static_cast<int8_t>(rank + 1));
        ASSERT_EQ(mtxcomm_broadcast(buf.data(), buf.data(), 100, MTXCOMM_INT8, rank, comm, nullptr),
                  MTXCOMM_SUCCESS);
        mtxcomm_result_t rc = MTXCOMM_SUCCESS;
        size_t calls = 0;
        while (rc == MTXCOMM_SUCCESS && calls < 4 * ShmGroup::kMaxDeferred) {
          const int root = static_cast<int>((calls + 1) % 2);
          rc = mtxcomm_broadcast(buf.data(), buf.data(), 100, MTXCOMM_INT8, root, comm, nullptr);
          ++calls;
        }
        EXPECT_EQ(rc, MTXCOMM_INVALID_USAGE) << mtxcomm_get_last_error(comm);
        EXPECT_LE(calls, ShmGroup::kMaxDeferred) << "rank " << rank;
        EXPECT_TRUE(contains(mtxcomm_get_last_error(comm), "root 1") &&
                    contains(mtxcomm_get_last_error(comm), "root 0"))
            << mtxcomm_get_last_error(comm);
      },
      cfg);
}

// The root rejects its own call (a bad argument): the other rank learns it at once.
TEST_F(Trust, ACallRejectedOnTheRootOnlyIsAnErrorOnEveryRank) {
  expectPromptError(
      2,
      [](mtxcomm_comm_t c, int rank, float* b) {
        return mtxcomm_broadcast(rank == 0 ? nullptr : b, b, 256, MTXCOMM_FLOAT32, 0, c, nullptr);
      },
      {MTXCOMM_INVALID_ARGUMENT, MTXCOMM_INVALID_USAGE}, {"peer rank 0 rejected this call"});
}

// A peer that destroys its communicator early (and stays alive) fails the ranks that wait on it
// at once, naming it.
TEST_F(Trust, PeerThatDestroysItsCommunicatorEarlyFailsItsPeersAtOnce) {
  Config cfg;
  cfg.timeoutSeconds = 30;
  auto comms = testing::makeInprocComms(2, cfg);
  runThreads(2, [&](int rank) {
    unwrapComm(comms[rank])->setup();
    std::vector<float> b(64, 1.0f);
    ASSERT_EQ(mtxcomm_allreduce(b.data(), b.data(), 64, MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[rank],
                                nullptr),
              MTXCOMM_SUCCESS);
    if (rank == 1) {
      mtxcomm_comm_destroy(comms[1]);
      comms[1] = nullptr;
      std::this_thread::sleep_for(milliseconds(2000));  // alive, but gone from the communicator
      return;
    }
    const auto start = Clock::now();
    EXPECT_EQ(
        mtxcomm_allreduce(b.data(), b.data(), 64, MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[0], nullptr),
        MTXCOMM_REMOTE_ERROR);
    EXPECT_LT(secondsSince(start), 1.0);
    EXPECT_TRUE(contains(mtxcomm_get_last_error(comms[0]),
                         "peer rank 1 destroyed its communicator after call #"))
        << mtxcomm_get_last_error(comms[0]);
  });
  mtxcomm_comm_destroy(comms[0]);
}

// ---- Handles and threads --------------------------------------------------------------------

TEST_F(Trust, DestroyedAndGarbageHandlesAreInvalidArguments) {
  auto comms = testing::makeInprocComms(1);
  mtxcomm_comm_t comm = comms[0];
  float x = 1;
  ASSERT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
            MTXCOMM_SUCCESS);
  ASSERT_EQ(mtxcomm_comm_destroy(comm), MTXCOMM_SUCCESS);
  EXPECT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
            MTXCOMM_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(mtxcomm_get_last_error(nullptr), "not a live communicator"))
      << mtxcomm_get_last_error(nullptr);
  EXPECT_EQ(mtxcomm_comm_destroy(comm), MTXCOMM_INVALID_ARGUMENT);  // twice
  EXPECT_EQ(mtxcomm_comm_abort(comm), MTXCOMM_INVALID_ARGUMENT);
  int rank = -1;
  EXPECT_EQ(mtxcomm_comm_rank(comm, &rank), MTXCOMM_INVALID_ARGUMENT);
  uint64_t garbage[8] = {0xdeadbeef, 1, 2, 3, 4, 5, 6, 7};
  auto bogus = reinterpret_cast<mtxcomm_comm_t>(garbage);
  EXPECT_EQ(mtxcomm_barrier(bogus), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_comm_destroy(bogus), MTXCOMM_INVALID_ARGUMENT);
}

// Runs call() on this thread while a watchdog thread aborts (or destroys) comm after 300 ms:
// expects call to end within 1.5 s with a message naming what happened (the handle is gone:
// this thread's record). Returns call's result.
template <class Call>
mtxcomm_result_t callEndedByRetire(bool useAbort, mtxcomm_comm_t comm, Call&& call) {
  std::thread watchdog([&] {
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_EQ(useAbort ? mtxcomm_comm_abort(comm) : mtxcomm_comm_destroy(comm), MTXCOMM_SUCCESS);
  });
  const auto start = Clock::now();
  const mtxcomm_result_t rc = call();
  const double took = secondsSince(start);
  watchdog.join();
  EXPECT_LT(took, 1.5);
  EXPECT_TRUE(contains(mtxcomm_get_last_error(comm),
                       useAbort ? "aborted (mtxcomm_comm_abort, another thread)"
                                : "destroyed (mtxcomm_comm_destroy, another thread)"))
      << mtxcomm_get_last_error(comm);
  return rc;
}

// A watchdog thread aborts (or destroys) a communicator whose collective is blocked on a peer
// that never calls: the collective returns promptly with an error naming what happened, over
// shm and over the point-to-point path.
void abortFromAnotherThread(bool useAbort, const std::string& shm) {
  SCOPED_TRACE((useAbort ? "abort, shm " : "destroy, shm ") + shm);
  Config cfg;
  cfg.timeoutSeconds = 30;
  cfg.shm = shm;
  auto comms = testing::makeInprocComms(2, cfg);
  runThreads(2, [&](int rank) { unwrapComm(comms[rank])->setup(); });
  std::vector<float> b(1 << 16, 1.0f);
  // One call on each rank first: this thread's next call on comms[0] then holds the handle the
  // fast way (handle_registry.h, HandleLease: a hazard slot, no reference), which
  // retireHandle() must wait for too.
  std::thread peer([&] {
    float y = 1;
    EXPECT_EQ(mtxcomm_allreduce(&y, &y, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[1], nullptr),
              MTXCOMM_SUCCESS);
  });
  float x = 1;
  EXPECT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[0], nullptr),
            MTXCOMM_SUCCESS);
  peer.join();
  EXPECT_EQ(x, 2.0f);
  EXPECT_NE(callEndedByRetire(useAbort, comms[0],
                              [&] {
                                return mtxcomm_allreduce(b.data(), b.data(), b.size(),
                                                         MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[0],
                                                         nullptr);
                              }),
            MTXCOMM_SUCCESS);
  // The peer, joining the collective late, fails with a remote error (rank 0 was cancelled;
  // it is not a disagreement on the call).
  EXPECT_EQ(mtxcomm_allreduce(b.data(), b.data(), b.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[1],
                              nullptr),
            MTXCOMM_REMOTE_ERROR)
      << mtxcomm_get_last_error(comms[1]);
  mtxcomm_comm_destroy(comms[1]);
}

// Threads calling on a handle while another destroys it: every call either runs on the live
// communicator or is rejected as not live; none touches a freed one (ASan and TSan builds run
// this). Each thread's calls after its first hold the handle without a lock
// (lib/comm/handle_registry.h, HandleLease).
TEST_F(Trust, CallsRacingADestroyEitherRunOrAreRejected) {
  constexpr int kThreads = 3;
  for (int round = 0; round < 30; ++round) {
    auto comms = testing::makeInprocComms(1);
    mtxcomm_comm_t comm = comms[0];
    std::atomic<int> started{0};
    std::vector<int> ran(kThreads, 0), rejected(kThreads, 0);
    std::vector<std::thread> callers;
    for (int t = 0; t < kThreads; ++t) {
      callers.emplace_back([&, t] {
        bool counted = false;
        for (;;) {
          int size = -1;
          const mtxcomm_result_t rc = mtxcomm_comm_size(comm, &size);
          if (rc == MTXCOMM_SUCCESS) {
            EXPECT_EQ(size, 1);
            ++ran[t];
          } else {
            EXPECT_EQ(rc, MTXCOMM_INVALID_ARGUMENT);
            EXPECT_TRUE(contains(mtxcomm_get_last_error(nullptr), "not a live communicator"))
                << mtxcomm_get_last_error(nullptr);
            ++rejected[t];
            break;
          }
          if (!counted && ran[t] >= 2) {
            started.fetch_add(1);
            counted = true;
          }
        }
      });
    }
    while (started.load() < kThreads) std::this_thread::yield();
    ASSERT_EQ(mtxcomm_comm_destroy(comm), MTXCOMM_SUCCESS);
    for (auto& c : callers) c.join();
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_GE(ran[t], 2) << "thread " << t;
      EXPECT_EQ(rejected[t], 1) << "thread " << t;
    }
  }
}

// A thread asleep in mtxcomm_comm_wait_notify (a 60 s timeout) while another destroys or
// aborts the communicator: the wait ends at once with the reason, not at its timeout.
TEST_F(Trust, DestroyFromAnotherThreadEndsAWaitNotify) {
  for (bool useAbort : {false, true}) {
    SCOPED_TRACE(useAbort ? "abort" : "destroy");
    Config cfg;
    cfg.timeoutSeconds = 30;
    auto comms = testing::makeInprocComms(2, cfg);
    runThreads(2, [&](int rank) { unwrapComm(comms[rank])->setup(); });
    mtxcomm_notify_state_t seen{}, now{};
    ASSERT_EQ(mtxcomm_comm_notify_state(comms[0], &seen), MTXCOMM_SUCCESS);
    EXPECT_EQ(
        callEndedByRetire(useAbort, comms[0],
                          [&] { return mtxcomm_comm_wait_notify(comms[0], &seen, 60.0, &now); }),
        MTXCOMM_INVALID_USAGE);
    mtxcomm_comm_destroy(comms[1]);
  }
}

// fork() while another thread is inside a call: in the child, the parent's communicators are
// refused (MTXCOMM_INVALID_USAGE naming fork) and destroy forgets them at once (it hung on the
// dead thread's hold, and freeing them marked the parent's rank gone); the parent's ranks go on.
TEST_F(Trust, AForkedChildCannotUseOrBreakItsParentsCommunicators) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "fork() of a multi-threaded process is not supported under ThreadSanitizer";
#else
  Config cfg;
  cfg.timeoutSeconds = 30;
  auto comms = testing::makeInprocComms(2, cfg);
  runThreads(2, [&](int rank) { unwrapComm(comms[rank])->setup(); });
  std::vector<float> a(1024, 1.0f), b(1024, 2.0f);
  std::atomic<bool> inCall{false};
  mtxcomm_result_t rcA = MTXCOMM_INTERNAL_ERROR;
  std::thread caller([&] {
    int r = -1;
    EXPECT_EQ(mtxcomm_comm_rank(comms[0], &r), MTXCOMM_SUCCESS);  // the next call: a fast lease
    inCall = true;
    rcA = mtxcomm_allreduce(a.data(), a.data(), a.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[0],
                            nullptr);  // waits for rank 1, which calls after the fork
  });
  while (!inCall) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(100));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(10);  // a hang is a failure the parent sees
    float x = 1;
    int code = 0;
    const mtxcomm_result_t used =
        mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[1], nullptr);
    if (used != MTXCOMM_INVALID_USAGE) code |= 1;
    if (!contains(mtxcomm_get_last_error(comms[1]), "forked")) code |= 2;
    if (mtxcomm_comm_destroy(comms[0]) != MTXCOMM_SUCCESS) code |= 4;  // another thread's call
    if (mtxcomm_comm_destroy(comms[1]) != MTXCOMM_SUCCESS) code |= 8;
    if (mtxcomm_comm_destroy(comms[1]) != MTXCOMM_INVALID_ARGUMENT) code |= 16;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status)
                                 << " (SIGALRM: it hung)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits: 1 call not refused, 2 message, 4/8 destroy, 16 twice";
  // The parent's communicator still works: rank 1 joins the call in flight.
  EXPECT_EQ(mtxcomm_allreduce(b.data(), b.data(), b.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[1],
                              nullptr),
            MTXCOMM_SUCCESS)
      << mtxcomm_get_last_error(comms[1]);
  caller.join();
  EXPECT_EQ(rcA, MTXCOMM_SUCCESS) << mtxcomm_get_last_error(comms[0]);
  EXPECT_EQ(a[7], 3.0f);
  EXPECT_EQ(b[7], 3.0f);
  mtxcomm_comm_destroy(comms[0]);
  mtxcomm_comm_destroy(comms[1]);
#endif
}

TEST_F(Trust, AbortFromAnotherThreadEndsABlockedCollective) {
  abortFromAnotherThread(true, "auto");
  abortFromAnotherThread(true, "off");
  abortFromAnotherThread(false, "auto");
  abortFromAnotherThread(false, "off");
}

}  // namespace
}  // namespace mtxcomm
