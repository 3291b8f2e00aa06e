// Trust: attacks on the TCP store and the file store, and the job secret's checks.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "common/trust_fixture.h"
#include "gtest/gtest.h"
#include "lib/base/auth.h"
#include "lib/base/socket_util.h"
#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "lib/comm/stores.h"
#include "mtxcomm/mtxcomm.h"
#include "transports/tcp/tcp_transport.h"

namespace mtxcomm {
namespace {

using namespace trusttest;  // NOLINT: the Trust fixture, kTimeout, secondsSince
using testutil::Barrier;
using testutil::freePort;
using testutil::TempDir;
using testutil::testSecret;

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

}  // namespace
}  // namespace mtxcomm
