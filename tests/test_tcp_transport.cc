// The TCP transport beyond the contract (tests/test_transport_contract.cc runs that over tcp):
// its bootstrap over a tcp: store, a peer whose connection closes while this rank waits on it,
// and the liveness of node-local peers — a forked rank killed (no BYE) or ending normally.
// Ranks are threads of one process, each with its own store client and transport.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "lib/comm/stores.h"
#include "mtxcomm/mtxcomm.hpp"
#include "transports/tcp/tcp_transport.h"
#include "transports/transport.h"

namespace mtxcomm {
namespace {

using std::chrono::milliseconds;
using testutil::Barrier;
using testutil::expectError;
using testutil::runThreads;
using testutil::tcpSpec;
using testutil::TempDir;
using testutil::testSecret;
constexpr milliseconds kTimeout(10000);

struct RankEnd {
  std::unique_ptr<Store> store;
  std::unique_ptr<Transport> transport;
};

RankEnd join(const std::string& spec, int rank, int size) {
  RankEnd e;
  e.store = makeStore(spec, rank, size, kTimeout, testSecret());
  e.transport = makeTcpTransport(*e.store, rank, size, kTimeout);
  EXPECT_STREQ(e.transport->name(), "tcp");
  EXPECT_EQ(e.transport->rank(), rank);
  EXPECT_EQ(e.transport->size(), size);
  return e;
}

void waitOne(Transport& t, RequestPtr req, milliseconds timeout = kTimeout) {
  std::vector<RequestPtr> reqs;
  reqs.push_back(std::move(req));
  t.waitAll(reqs, Clock::now() + timeout);
}

// Three ranks meet through a tcp: store served by rank 0 (which starts last) and pass their
// rank around the ring. (The contract cases bootstrap through a file: store.)
TEST(TcpTransport, BootstrapsOverATcpStore) {
  const std::string spec = tcpSpec();
  Barrier barrier(3);
  runThreads(3, [&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(milliseconds(100));
    RankEnd e = join(spec, rank, 3);
    Transport& t = *e.transport;
    int32_t out = 1000 + rank, in = -1;
    std::vector<RequestPtr> reqs;
    reqs.push_back(t.irecv((rank + 2) % 3, 3, &in, sizeof(in)));
    reqs.push_back(t.isend((rank + 1) % 3, 3, &out, sizeof(out)));
    t.waitAll(reqs, Clock::now() + kTimeout);
    EXPECT_EQ(in, 1000 + (rank + 2) % 3);
    barrier.wait();  // every rank done before the store server or a socket goes away
  });
}

// The view is the point-to-point channel's ActivityWaiter: its progress thread sleeps in
// poll(2) on the sockets. A message arriving ends the sleep (a large one streams through the
// kernel's buffers, so each arrival of a part must), and so does wake() (a post, a failure);
// with neither it sleeps its whole time. Bounds far from the times involved: behaviour, not
// speed.
TEST(TcpTransport, AViewSleepsOnItsSocketsAndWakesOnAnArrivalOrAWake) {
  TempDir dir;
  Barrier barrier(2);
  runThreads(2, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 2);
    auto* waiter = dynamic_cast<ActivityWaiter*>(e.transport.get());
    ASSERT_NE(waiter, nullptr);
    Transport& t = *e.transport;
    std::vector<char> big(8 << 20);
    barrier.wait();
    if (rank == 0) {
      std::this_thread::sleep_for(milliseconds(200));
      for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
      waitOne(t, t.isend(1, 5, big.data(), big.size()));
    } else {
      std::vector<RequestPtr> reqs;
      reqs.push_back(t.irecv(0, 5, big.data(), big.size()));
      const auto start = Clock::now();
      int sleeps = 0;
      while (!t.testAll(reqs)) {
        ASSERT_LT(Clock::now() - start, milliseconds(20000));
        waiter->waitActivity(waiter->activitySeen(), milliseconds(5000));
        ++sleeps;
      }
      // Without the sockets' wake-ups this is 5 s per sleep.
      EXPECT_LT(Clock::now() - start, milliseconds(4000)) << sleeps << " sleeps";
      for (size_t i = 0; i < big.size(); i += 4099) ASSERT_EQ(big[i], static_cast<char>(i * 7));
    }
    barrier.wait();
    if (rank == 1) {
      // wake() from another thread ends a sleep; with nothing to say it sleeps its time.
      std::thread waker([&] {
        std::this_thread::sleep_for(milliseconds(100));
        waiter->wake();
      });
      auto start = Clock::now();
      waiter->waitActivity(waiter->activitySeen(), milliseconds(5000));
      EXPECT_LT(Clock::now() - start, milliseconds(3000));
      waker.join();
      start = Clock::now();
      waiter->waitActivity(waiter->activitySeen(), milliseconds(300));
      EXPECT_GE(Clock::now() - start, milliseconds(250));
    }
    barrier.wait();
  });
}

// A large message whose receive is posted while it streams in (a point-to-point payload, whose
// receive follows its header's match): the part that arrived before as an unexpected message
// and the rest, read straight into the receive's buffer, make up the message.
TEST(TcpTransport, AReceivePostedWhileItsMessageStreamsInGetsAllOfIt) {
  TempDir dir;
  Barrier barrier(2);
  runThreads(2, [&](int rank) {
    RankEnd e = join(dir.fileSpec(), rank, 2);
    Transport& t = *e.transport;
    std::vector<uint32_t> big((64 << 20) / 4);  // far more than the sockets' buffers hold
    barrier.wait();
    if (rank == 0) {
      for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint32_t>(i * 2654435761u);
      waitOne(t, t.isend(1, 7, big.data(), big.size() * 4));
    } else {
      // Progress without the receive: the mesh reads what the sockets hold as unexpected.
      uint32_t other = 0;
      std::vector<RequestPtr> idle;
      idle.push_back(t.irecv(0, 8, &other, sizeof other));
      for (int i = 0; i < 5; ++i) {
        std::this_thread::sleep_for(milliseconds(20));
        EXPECT_FALSE(t.testAll(idle));
      }
      waitOne(t, t.irecv(0, 7, big.data(), big.size() * 4));
      for (size_t i = 0; i < big.size(); i += 997) {
        ASSERT_EQ(big[i], static_cast<uint32_t>(i * 2654435761u)) << i;
      }
      ASSERT_EQ(big.back(), static_cast<uint32_t>((big.size() - 1) * 2654435761u));
      other = 1;
      waitOne(t, t.isend(0, 8, &other, sizeof other));
    }
    if (rank == 0) {
      uint32_t other = 0;
      waitOne(t, t.irecv(1, 8, &other, sizeof other));
      EXPECT_EQ(other, 1u);
    }
    barrier.wait();
  });
}

TEST(TcpTransport, DestroyedPeerIsRemoteErrorQuickly) {
  TempDir dir;
  Barrier barrier(2);
  runThreads(2, [&](int rank) {
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
      e.store = makeStore(spec, 2, 3, kTimeout, testSecret());
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
  runThreads(2, [&](int rank) {
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

}  // namespace
}  // namespace mtxcomm
