// The contract of transports/transport.h as test cases written once against Transport&, run by
// tests/test_transport_contract.cc over every transport that can be made in one process (ranks
// as threads: inproc, tcp, ucx) and by tests/mp/mp_transport_contract.cc over the MPI transport
// (ranks as processes under mpirun).
//
// A case runs on every rank of a transport of Env::size ranks (at least Case::minRanks), with
// a barrier that does not go through the transport under test (threads: a condition variable;
// processes: MPI_Barrier on MPI_COMM_WORLD). Data is closed-form (pattern()), so every rank
// checks what it received byte by byte.
//
// Where the contract leaves a transport a choice (eager or rendezvous sends, whether abort()
// reaches the peers, the code of a rejected argument), or where a transport deviates from it
// today, Traits says what the transport does, and the cases assert exactly that. The traits of
// every transport are in one place (common/transport_contract_base.h, inprocTraits() ...
// mpiTraits()); the deviations from the contract's text are marked DEVIATION there.
//
// Three headers: transport_contract_base.h (Traits, Env, Case, the data),
// transport_contract_exchange.h (the cases that move data) and this one (the cases of errors,
// the table of every case and how a rank runs one); the programs include this one.
#ifndef MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_H_
#define MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "common/transport_contract_base.h"
#include "common/transport_contract_exchange.h"
#include "lib/base/error.h"
#include "transports/transport.h"

namespace mtxcomm {
namespace contract {

// ---- errors ---------------------------------------------------------------------------------

// A receive nobody sends ends at its deadline with MTXCOMM_TIMEOUT naming the peer, the tag and
// the size; with three ranks, a wait on two peers names the first one still awaited.
inline void receiveNobodySendsTimesOut(Env& e) {
  Transport& t = e.t();
  if (e.rank == 0) {
    std::vector<uint8_t> buf(12);
    std::vector<std::string> parts = {"timed out", "receive",  "peer rank 1",
                                      "tag 17",    "12 bytes", e.traits.waitText};
    if (e.traits.timeoutSaysHowLong) parts.push_back("timed out after 0.2");
    if (e.traits.waitSaysReceiveFrom) parts.push_back("receive from peer rank 1");
    auto start = Clock::now();
    expectError([&] { waitOne(t, t.irecv(1, 17, buf.data(), buf.size()), milliseconds(200)); },
                MTXCOMM_TIMEOUT, parts);
    auto elapsed = Clock::now() - start;
    EXPECT_GE(elapsed, milliseconds(200));
    EXPECT_LT(elapsed, milliseconds(1500));
    if (e.traits.failsAfterError) {
      expectError([&] { t.irecv(1, 17, buf.data(), buf.size()); }, e.traits.failedCode,
                  {"timed out"});
    }
  } else if (e.rank == 1 && e.size >= 3) {
    int a = 0, b = 0;
    std::vector<RequestPtr> reqs;
    reqs.push_back(t.irecv(2, 7, &a, sizeof(a)));
    reqs.push_back(t.irecv(0, 7, &b, sizeof(b)));
    const auto start = Clock::now();
    expectError([&] { t.waitAll(reqs, Clock::now() + milliseconds(300)); }, MTXCOMM_TIMEOUT,
                {"from peer rank 2", e.traits.waitText});
    EXPECT_GE(Clock::now() - start, milliseconds(300));
    if (e.traits.failsAfterError) {
      // The transport is failed now: a later wait says so and quotes the first error.
      expectError([&] { t.waitAll(reqs, Clock::now() + milliseconds(100)); }, e.traits.failedCode,
                  {"peer rank 2"});
    }
  }
}

// Rank n-1 aborts. Rank 0 waits to receive from it, rank 1 to send it 64 MiB (more than socket
// buffers hold, and nobody reads it); further ranks wait on rank 0 (which never sends) where
// the abort ends every wait, else on the aborting rank. The waits end with MTXCOMM_REMOTE_ERROR
// naming the aborting rank and its reason, long before their deadline — or, where abort() tells
// nobody (mpi), with MTXCOMM_TIMEOUT at the deadline.
inline void abortReachesPeers(Env& e) {
  Transport& t = e.t();
  const int aborter = e.size - 1;
  const std::string reason = "rank " + str(aborter) + " ran out of patience";
  const Traits& tr = e.traits;
  e.barrier();
  if (e.rank == aborter) {
    std::this_thread::sleep_for(milliseconds(100));
    t.abort(reason);
    if (tr.failsAfterAbort) {
      expectError([&] { t.irecv(0, 1, nullptr, 0); }, tr.failedCode, {"aborted"});
    }
    e.barrier();
    return;
  }
  const bool send = e.rank == 1;
  const int peer = e.rank <= 1 || !tr.abortEndsEveryWait ? aborter : 0;
  const std::string wait = (send ? "send to peer rank " : "receive from peer rank ") + str(peer);
  std::vector<uint8_t> buf(send ? (64 << 20) : 16);
  auto start = Clock::now();
  auto waitIt = [&] {
    waitOne(t, send ? t.isend(peer, 1, buf.data(), buf.size()) : t.irecv(peer, 1, buf.data(), 16),
            tr.abortReachesPeers ? milliseconds(20000) : milliseconds(1000));
  };
  if (tr.abortReachesPeers) {
    // A sender may learn only that the connection closed (tcp: see its Traits).
    const bool reasonReaches = !send || tr.abortReasonReachesBlockedSenders;
    std::vector<std::string> parts = {"peer rank " + str(aborter)};
    if (reasonReaches) {
      parts.push_back("peer rank " + str(aborter) + " aborted");
      parts.push_back(reason);
      if (tr.abortReasonInline) {
        parts.push_back("peer rank " + str(aborter) + " aborted: " + reason);
      }
    }
    if (tr.abortNamesWait) parts.push_back(reasonReaches ? wait : "send to");
    expectError(waitIt, MTXCOMM_REMOTE_ERROR, parts);
    EXPECT_LT(Clock::now() - start, milliseconds(3000));
  } else {
    expectError(waitIt, MTXCOMM_TIMEOUT, {"timed out", wait});
  }
  e.barrier();
}

// Rank n-1 aborts a view that holds every rank, numbered {n-1, 0, 1, ...} (it is view rank 0).
// Where the abort ends every wait, ranks wait on each other (nobody sends): rank 0 on the root
// transport, the others on the view, rank 1 only starting after the abort came; each error
// names the aborting rank in the numbering of its own transport. Elsewhere the ranks wait on
// the aborting rank in the view.
inline void abortOnAViewReachesPeersInTheirNumbering(Env& e) {
  Transport& t = e.t();
  const int n = e.size, aborter = n - 1;
  const std::string reason = "disk on fire";
  const Traits& tr = e.traits;
  std::vector<int> members = {aborter};
  for (int r = 0; r < aborter; ++r) members.push_back(r);
  std::unique_ptr<Transport> view = t.split(members, 5);
  EXPECT_EQ(view->rank(), e.rank == aborter ? 0 : e.rank + 1);
  e.barrier();
  if (e.rank == aborter) {
    std::this_thread::sleep_for(milliseconds(100));
    view->abort(reason);
    e.barrier();
    return;
  }
  if (e.rank == 1) std::this_thread::sleep_for(milliseconds(300));  // waits only later
  Transport* on = view.get();
  int peer = 0;
  mtxcomm_result_t code = tr.abortReachesPeers ? MTXCOMM_REMOTE_ERROR : MTXCOMM_TIMEOUT;
  std::vector<std::string> parts;
  if (tr.abortEndsEveryWait) {
    if (e.rank == 0) {
      on = &t;
      peer = 1;
      std::string msg = "peer rank " + str(aborter) + " aborted: " + reason;
      if (tr.abortNamesOtherContext) msg += " (in the communicator of context 5)";
      parts.push_back(msg);
    } else {
      peer = 1;  // rank 0
      const std::string root =
          tr.viewNamesRootRank ? " (rank " + str(aborter) + " of the initial communicator)" : "";
      parts.push_back("peer rank 0" + root + " aborted: " + reason);
    }
  } else if (tr.abortReachesPeers) {
    parts = {"peer rank 0 aborted", reason};
  } else {
    parts = {"timed out"};
  }
  if (tr.abortNamesWait || !tr.abortReachesPeers) {
    parts.push_back("receive from peer rank " + str(peer));
  }
  std::vector<uint8_t> buf(16);
  auto start = Clock::now();
  expectError(
      [&] {
        waitOne(*on, on->irecv(peer, 1, buf.data(), buf.size()),
                tr.abortReachesPeers ? milliseconds(20000) : milliseconds(1000));
      },
      code, parts);
  if (tr.abortReachesPeers) {
    EXPECT_LT(Clock::now() - start, milliseconds(3000));
  }
  e.barrier();
}

// Rank n-1 sends rank 0 a value and leaves in good order (its transport destroyed); ranks 0 and
// 1 keep talking, undisturbed. Where small sends complete alone, the value is received only
// after the sender has left: it still arrives.
inline void peerFinishingNormallyIsNoError(Env& e) {
  const int leaver = e.size - 1;
  const bool eager = e.traits.smallSendsCompleteAlone;
  uint32_t value = 0;
  if (e.rank == leaver) {
    value = 42;
    waitOne(e.t(), e.t().isend(0, 1, &value, sizeof(value)));
    e.leave();
    e.barrier();
    return;
  }
  Transport& t = e.t();
  if (e.rank == 0 && !eager) {
    waitOne(t, t.irecv(leaver, 1, &value, sizeof(value)));
    EXPECT_EQ(value, 42u);
  }
  e.barrier();  // the leaver's transport is gone
  std::this_thread::sleep_for(milliseconds(50));
  if (e.rank == 0) {
    if (eager) {
      waitOne(t, t.irecv(leaver, 1, &value, sizeof(value)));
      EXPECT_EQ(value, 42u);
    }
    value = 7;
    waitOne(t, t.isend(1, 1, &value, sizeof(value)));
  } else if (e.rank == 1) {
    waitOne(t, t.irecv(0, 1, &value, sizeof(value)));
    EXPECT_EQ(value, 7u);
  }
}

// A send to or receive from this rank itself, a peer out of range and (where checked) a tag out
// of range are rejected at once; the transport stays usable.
inline void selfSendAndBadArguments(Env& e) {
  Transport& t = e.t();
  const Traits& tr = e.traits;
  const int me = e.rank, other = me == 0 ? 1 : 0;
  uint8_t b = 0;
  expectError([&] { t.isend(me, 0, &b, 1); }, tr.badArgumentCode, {tr.selfText});
  expectError([&] { t.irecv(me, 0, &b, 1); }, tr.badArgumentCode, {tr.selfText});
  expectError([&] { t.isend(e.size, 0, &b, 1); }, tr.badArgumentCode,
              {tr.badPeerText, str(e.size)});
  expectError([&] { t.irecv(-1, 0, &b, 1); }, tr.badArgumentCode, {tr.badPeerText, "-1"});
  if (tr.checksTag) {
    expectError([&] { t.isend(other, Transport::kMaxTag + 1, &b, 1); }, tr.badArgumentCode,
                {"tag " + str(Transport::kMaxTag + 1)});
    expectError([&] { t.irecv(other, -1, &b, 1); }, tr.badArgumentCode, {"tag -1"});
  }
  // Still usable: these were rejected before anything moved.
  if (me == 0) {
    b = 77;
    waitOne(t, t.isend(1, 0, &b, 1));
  } else if (me == 1) {
    waitOne(t, t.irecv(0, 0, &b, 1));
    EXPECT_EQ(b, 77);
  }
}

// A wait on nothing, or on null entries only, returns even past its deadline.
inline void emptyWaitReturns(Env& e) {
  std::vector<RequestPtr> none;
  e.t().waitAll(none, Clock::now() - milliseconds(1));
  std::vector<RequestPtr> nulls(3);
  e.t().waitAll(nulls, Clock::now() - milliseconds(1));
}

// ---- the cases and how a rank runs one -------------------------------------------------------

inline const std::vector<Case>& allCases() {
  static const std::vector<Case> cases = {
      {"RingExchange", 2, ringExchange, {2, 3, 5}},
      {"EveryPairExchanges", 2, everyPairExchanges, {3, 5}},
      {"ZeroByteMessagesAreDeliveredInOrder", 2, zeroByteMessages, {2}},
      {"NonOvertakingSameTag", 2, nonOvertakingSameTag, {2}},
      {"TagsMatchedIndependently", 2, tagsMatchedIndependently, {2}},
      {"SimultaneousLargeSendsDoNotDeadlock", 2, simultaneousLargeSends, {2}},
      {"SizeMismatchLongerReceive", 2, sizeMismatchLongerReceive, {2}},
      {"SizeMismatchShorterReceive", 2, sizeMismatchShorterReceive, {2}},
      {"SplitViewUsesItsOwnContext", 3, splitViewUsesItsOwnContext, {3}},
      {"SplitViewsKeepTheirMessagesApart", 4, splitViewsKeepTheirMessagesApart, {4}},
      {"ViewsOnTwoThreads", 2, viewsOnTwoThreads, {2}},
      {"ReceiveNobodySendsTimesOut", 2, receiveNobodySendsTimesOut, {2, 3}},
      {"AbortReachesPeers", 3, abortReachesPeers, {3}},
      {"AbortOnAViewReachesPeersInTheirNumbering",
       3,
       abortOnAViewReachesPeersInTheirNumbering,
       {3}},
      {"PeerFinishingNormallyIsNoError", 3, peerFinishingNormallyIsNoError, {3}},
      {"SelfSendAndBadArgumentsAreRejected", 2, selfSendAndBadArguments, {2}},
      {"EmptyWaitReturns", 1, emptyWaitReturns, {1, 2}},
  };
  return cases;
}

// Runs case c on this rank: checks the transport's name, rank and size, runs the case (an
// exception is a failure naming the rank; broken, if set, releases the other ranks' barriers),
// then waits for every rank before the transport goes away.
inline void runRank(Env& e, const Case& c, const std::function<void()>& broken) {
  SCOPED_TRACE("rank " + str(e.rank) + " of " + str(e.size) + " (" + e.traits.name + ")");
  EXPECT_EQ(e.t().name(), e.traits.name);
  EXPECT_EQ(e.t().rank(), e.rank);
  EXPECT_EQ(e.t().size(), e.size);
  try {
    c.run(e);
  } catch (const std::exception& ex) {
    ADD_FAILURE() << c.name << " threw on rank " << e.rank << ": " << ex.what();
    if (broken) broken();
  }
  e.barrier();  // every rank done before any transport goes away
  e.leave();
}

}  // namespace contract
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_H_
