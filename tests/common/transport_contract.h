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
// every transport are in one place below (inprocTraits() ... mpiTraits()); the deviations from
// the contract's text are marked DEVIATION there.
#ifndef MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_H_
#define MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "lib/base/error.h"
#include "transports/transport.h"

namespace mtxcomm {
namespace contract {

using std::chrono::milliseconds;
using testutil::contains;
using testutil::expectError;
constexpr milliseconds kTimeout(10000);

// What a transport does where the contract allows a choice, or where it deviates.
struct Traits {
  std::string name;  // Transport::name()
  // The code of a size mismatch between a matched send and receive. The contract says
  // MTXCOMM_INTERNAL_ERROR.
  mtxcomm_result_t sizeMismatchCode = MTXCOMM_INTERNAL_ERROR;
  // A send to or receive from this rank itself, or a peer out of [0, size()): rejected at once
  // with this code, the message containing these words.
  mtxcomm_result_t badArgumentCode = MTXCOMM_INTERNAL_ERROR;
  std::string selfText, badPeerText;
  bool checksTag = false;  // a tag outside [0, kMaxTag] is rejected too ("tag <value>")
  // A send of a few bytes completes before its receive is posted (eager), and so does one of
  // tens of MiB (read into an unexpected queue at the receiver). Rendezvous otherwise.
  bool smallSendsCompleteAlone = false;
  bool largeSendsCompleteAlone = false;
  // After waitAll threw, later calls throw failedCode quoting the first error; after abort(),
  // this rank's own later calls do too.
  bool failsAfterError = false;
  bool failsAfterAbort = false;
  mtxcomm_result_t failedCode = MTXCOMM_INVALID_USAGE;
  // Text every error of a wait carries (the transport naming itself), "" for none; whether it
  // names the wait "receive from peer rank Q" (ucx: "receive B bytes from peer rank Q").
  std::string waitText;
  bool waitSaysReceiveFrom = true;
  // A timeout says after how long ("timed out after 0.2").
  bool timeoutSaysHowLong = false;
  // abort(reason): reaches the peers at all (the contract: best effort); ends also their waits
  // on other peers, in every view that has the aborting rank (else only waits on the aborting
  // rank, in the view it aborted); reads "peer rank P aborted: <reason>"; names the wait it
  // ended ("receive from peer rank Q" / "send to"); names the context of another view.
  bool abortReachesPeers = false;
  bool abortEndsEveryWait = false;
  bool abortReasonInline = false;
  bool abortNamesWait = false;
  bool abortNamesOtherContext = false;
  // The reason reaches also a peer blocked sending to the aborting rank.
  bool abortReasonReachesBlockedSenders = true;
  // In a view made by split(), a peer is also named by its rank in the transport the views
  // were split from: "peer rank 0 (rank 2 of the initial communicator)".
  bool viewNamesRootRank = false;
  // split() with a context id already live on this rank is refused with this code
  // (MTXCOMM_SUCCESS: not checked; the contract makes distinct ids the caller's duty).
  mtxcomm_result_t reusedContextCode = MTXCOMM_SUCCESS;
  // Distinct views may be used from two threads at once (the contract: always; MPI needs
  // MPI_THREAD_MULTIPLE for it).
  bool threadSafeViews = true;
};

// transports/inproc: rendezvous (a send completes when its receive has copied it), matching at
// post time, no failed state.
inline Traits inprocTraits() {
  Traits t;
  t.name = "inproc";
  t.sizeMismatchCode = MTXCOMM_INVALID_USAGE;  // DEVIATION: the contract says INTERNAL_ERROR
  t.selfText = "invalid peer rank";
  t.badPeerText = "invalid peer rank";
  t.abortReachesPeers = true;
  t.abortNamesWait = true;
  return t;
}

// transports/tcp: every message goes out at once and is read into an unexpected queue.
inline Traits tcpTraits() {
  Traits t;
  t.name = "tcp";
  t.sizeMismatchCode = MTXCOMM_INVALID_USAGE;  // DEVIATION: the contract says INTERNAL_ERROR
  t.selfText = "itself";
  t.badPeerText = "out of range";
  t.checksTag = true;
  t.smallSendsCompleteAlone = true;
  t.largeSendsCompleteAlone = true;
  t.failsAfterError = true;
  t.failsAfterAbort = true;
  t.timeoutSaysHowLong = true;
  t.abortReachesPeers = true;
  t.abortEndsEveryWait = true;
  t.abortReasonInline = true;
  t.abortNamesWait = true;
  t.abortNamesOtherContext = true;
  // A peer sending to the aborting rank may hit the shut-down socket (EPIPE) before it has read
  // the ABORT frame: it then reports "peer rank P closed the connection (Broken pipe) before a
  // send to it completed", without the reason (still MTXCOMM_REMOTE_ERROR naming the rank).
  t.abortReasonReachesBlockedSenders = false;
  t.reusedContextCode = MTXCOMM_INVALID_USAGE;
  return t;
}

// transports/ucx: UCX's eager protocol for small messages, rendezvous for large ones.
inline Traits ucxTraits() {
  Traits t;
  t.name = "ucx";
  t.sizeMismatchCode = MTXCOMM_INTERNAL_ERROR;
  t.badArgumentCode = MTXCOMM_INVALID_ARGUMENT;  // the others: INTERNAL_ERROR
  t.selfText = "bad peer";
  t.badPeerText = "bad peer";
  t.checksTag = true;
  t.smallSendsCompleteAlone = true;
  t.failsAfterError = true;
  t.failsAfterAbort = true;
  t.waitText = "over ucx";
  t.waitSaysReceiveFrom = false;
  t.abortReachesPeers = true;
  t.abortEndsEveryWait = true;
  t.abortReasonInline = true;
  t.viewNamesRootRank = true;
  t.reusedContextCode = MTXCOMM_INTERNAL_ERROR;  // tcp: INVALID_USAGE
  return t;
}

// transports/mpi: Open MPI's eager protocol for small messages, rendezvous for large ones.
inline Traits mpiTraits(bool threadMultiple) {
  Traits t;
  t.name = "mpi";
  t.sizeMismatchCode = MTXCOMM_INVALID_USAGE;  // DEVIATION: the contract says INTERNAL_ERROR
  t.selfText = "invalid peer rank";
  t.badPeerText = "invalid peer rank";
  t.smallSendsCompleteAlone = true;
  t.failsAfterError = true;
  t.failedCode = MTXCOMM_REMOTE_ERROR;  // tcp, ucx: INVALID_USAGE
  t.failsAfterAbort = true;
  // abort() sends every peer of the aborted communicator an ABORT on a reserved tag; it ends any
  // wait on that communicator, not those on other communicators (views) the rank belongs to.
  t.abortReachesPeers = true;
  t.abortReasonInline = true;
  t.abortNamesWait = true;
  t.threadSafeViews = threadMultiple;
  return t;
}

// One rank of a case.
struct Env {
  int rank = 0, size = 0;
  std::unique_ptr<Transport> transport;
  std::function<void()> barrier;  // every rank of the case, outside the transport
  Traits traits;
  Transport& t() { return *transport; }
  // This rank leaves in good order: its transport is destroyed while the others go on.
  void leave() { transport.reset(); }
};

struct Case {
  const char* name;
  int minRanks;
  void (*run)(Env&);
  std::vector<int> inProcessRanks;  // the sizes test_transport_contract.cc runs it at
};

// ---- data -----------------------------------------------------------------------------------

inline uint8_t pattern(size_t i, int sender, int salt) {
  return static_cast<uint8_t>((i * 131 + (i >> 11) * 7 + sender * 29 + salt) & 0xff);
}

inline void fill(std::vector<uint8_t>& buf, int sender, int salt) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(i, sender, salt);
}

// Index of the first wrong byte, or -1.
inline long firstWrong(const std::vector<uint8_t>& buf, int sender, int salt) {
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != pattern(i, sender, salt)) return static_cast<long>(i);
  }
  return -1;
}

inline void waitOne(Transport& t, RequestPtr req, milliseconds timeout = kTimeout) {
  std::vector<RequestPtr> reqs;
  reqs.push_back(std::move(req));
  t.waitAll(reqs, Clock::now() + timeout);
}

inline std::string str(long v) { return std::to_string(v); }

// The end of a data exchange: a one-byte token to every rank this rank sent to, once its sends
// have completed, and a wait for the token of every rank it received from. A receiver thus keeps
// calling waitAll until its senders' sends are complete — which a rendezvous send may need: over
// ucx, a send above the eager size can complete only when the receiver's worker progresses again
// after its receive has completed (the receiver's acknowledgement), so a receiver that stopped
// calling the transport would leave its sender waiting until the deadline.
constexpr int kDoneTag = 100;
inline void sendsDone(Transport& t, const std::vector<int>& sentTo,
                      const std::vector<int>& receivedFrom) {
  std::vector<uint8_t> in(receivedFrom.size(), 0);
  uint8_t token = 1;
  std::vector<RequestPtr> reqs;
  for (size_t i = 0; i < receivedFrom.size(); ++i) {
    reqs.push_back(t.irecv(receivedFrom[i], kDoneTag, &in[i], 1));
  }
  for (int p : sentTo) reqs.push_back(t.isend(p, kDoneTag, &token, 1));
  t.waitAll(reqs, Clock::now() + kTimeout);
  for (uint8_t v : in) EXPECT_EQ(v, 1);
}

// ---- addressing, matching, ordering ---------------------------------------------------------

// Every rank sends to its right neighbour and receives from its left one: 0 B, 1 B, 1 MiB and
// 64 MiB messages.
inline void ringExchange(Env& e) {
  const std::vector<size_t> sizes = {0, 1, 1 << 20, 64 << 20};
  Transport& t = e.t();
  const int n = e.size, right = (e.rank + 1) % n, left = (e.rank + n - 1) % n;
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<uint8_t> out(sizes[s]), in(sizes[s], 0);
    fill(out, e.rank, static_cast<int>(s));
    std::vector<RequestPtr> reqs;
    reqs.push_back(t.irecv(left, 3, in.data(), in.size()));
    reqs.push_back(t.isend(right, 3, out.data(), out.size()));
    t.waitAll(reqs, Clock::now() + kTimeout);
    EXPECT_EQ(firstWrong(in, left, static_cast<int>(s)), -1)
        << "rank " << e.rank << " size " << sizes[s];
  }
  sendsDone(t, {right}, {left});
}

// Every rank sends every other rank a message of its own size and content, all posted at once:
// each receive gets the message of the peer it names.
inline size_t pairBytes(int src, int dst) { return 1 + 3 * src + 7 * dst; }

inline void everyPairExchanges(Env& e) {
  Transport& t = e.t();
  const int n = e.size;
  std::vector<std::vector<uint8_t>> out(n), in(n);
  std::vector<RequestPtr> reqs;
  for (int p = 0; p < n; ++p) {
    if (p == e.rank) continue;
    in[p].assign(pairBytes(p, e.rank), 0);
    reqs.push_back(t.irecv(p, 11, in[p].data(), in[p].size()));
  }
  for (int p = 0; p < n; ++p) {
    if (p == e.rank) continue;
    out[p].resize(pairBytes(e.rank, p));
    fill(out[p], e.rank, 100 + p);
    reqs.push_back(t.isend(p, 11, out[p].data(), out[p].size()));
  }
  t.waitAll(reqs, Clock::now() + kTimeout);
  for (int p = 0; p < n; ++p) {
    if (p == e.rank) continue;
    EXPECT_EQ(firstWrong(in[p], p, 100 + e.rank), -1) << "from rank " << p;
  }
  std::vector<int> others;
  for (int p = 0; p < n; ++p) {
    if (p != e.rank) others.push_back(p);
  }
  sendsDone(t, others, others);
}

// Zero-byte messages (null buffers) are delivered and keep their place in the order: receives
// of 0, 4, 0, 0 and 4 bytes on one tag match sends of the same sizes (a lost zero-byte message
// would pair a 0-byte receive with a 4-byte message: a size mismatch). Receives posted first,
// then sends posted first.
inline void zeroByteMessages(Env& e) {
  Transport& t = e.t();
  const size_t sizes[] = {0, 4, 0, 0, 4};
  for (int round = 0; round < 2; ++round) {
    const bool receivesFirst = round == 0;
    uint32_t vals[5] = {0, 0, 0, 0, 0};
    std::vector<RequestPtr> reqs;
    auto post = [&] {
      for (int k = 0; k < 5; ++k) {
        void* buf = sizes[k] ? &vals[k] : nullptr;
        if (e.rank == 0) {
          vals[k] = static_cast<uint32_t>(1000 * round + k);
          reqs.push_back(t.isend(1, 6, buf, sizes[k]));
        } else {
          reqs.push_back(t.irecv(0, 6, buf, sizes[k]));
        }
      }
    };
    const bool postsFirst = (e.rank == 1) == receivesFirst;
    if (e.rank <= 1 && postsFirst) post();
    e.barrier();
    if (e.rank <= 1 && !postsFirst) post();
    if (e.rank <= 1) t.waitAll(reqs, Clock::now() + kTimeout);
    if (e.rank == 1) {
      EXPECT_EQ(vals[1], static_cast<uint32_t>(1000 * round + 1)) << "round " << round;
      EXPECT_EQ(vals[4], static_cast<uint32_t>(1000 * round + 4)) << "round " << round;
    }
  }
}

// 300 messages of four sizes from one sender on one tag arrive in the order they were sent:
// half the receives posted before the messages come, half after.
inline void nonOvertakingSameTag(Env& e) {
  if (e.rank > 1) return;
  Transport& t = e.t();
  constexpr int kMessages = 300;
  auto bytesOf = [](int k) { return static_cast<size_t>(8 + (k % 4) * 5000); };
  std::vector<std::vector<uint8_t>> bufs(kMessages);
  std::vector<RequestPtr> reqs;
  if (e.rank == 0) {
    for (int k = 0; k < kMessages; ++k) {
      bufs[k].resize(bytesOf(k));
      fill(bufs[k], 0, k);
      reqs.push_back(t.isend(1, 9, bufs[k].data(), bufs[k].size()));
    }
    t.waitAll(reqs, Clock::now() + kTimeout);
  } else {
    for (int k = 0; k < kMessages; ++k) {
      bufs[k].assign(bytesOf(k), 0);
      if (k == kMessages / 2) std::this_thread::sleep_for(milliseconds(100));
      reqs.push_back(t.irecv(0, 9, bufs[k].data(), bufs[k].size()));
    }
    t.waitAll(reqs, Clock::now() + kTimeout);
    for (int k = 0; k < kMessages; ++k) EXPECT_EQ(firstWrong(bufs[k], 0, k), -1) << k;
  }
  if (e.rank == 0) sendsDone(t, {1}, {});
  if (e.rank == 1) sendsDone(t, {}, {0});
}

// Messages on different tags are matched independently: sent on tags 1, 2 and kMaxTag, received
// in the reverse order, one at a time.
inline void tagsMatchedIndependently(Env& e) {
  if (e.rank > 1) return;
  Transport& t = e.t();
  std::vector<uint8_t> a(1000), b(300000), c(5);
  if (e.rank == 0) {
    fill(a, 0, 1);
    fill(b, 0, 2);
    fill(c, 0, 3);
    std::vector<RequestPtr> reqs;
    reqs.push_back(t.isend(1, 1, a.data(), a.size()));
    reqs.push_back(t.isend(1, 2, b.data(), b.size()));
    reqs.push_back(t.isend(1, Transport::kMaxTag, c.data(), c.size()));
    t.waitAll(reqs, Clock::now() + kTimeout);
  } else {
    waitOne(t, t.irecv(0, Transport::kMaxTag, c.data(), c.size()));
    EXPECT_EQ(firstWrong(c, 0, 3), -1);
    waitOne(t, t.irecv(0, 2, b.data(), b.size()));
    EXPECT_EQ(firstWrong(b, 0, 2), -1);
    waitOne(t, t.irecv(0, 1, a.data(), a.size()));
    EXPECT_EQ(firstWrong(a, 0, 1), -1);
  }
  if (e.rank == 0) sendsDone(t, {1}, {});
  if (e.rank == 1) sendsDone(t, {}, {0});
}

// Two ranks send each other 48 MiB at once and neither deadlocks: both posted in one waitAll
// (send first on rank 0, receive first on rank 1). Where large sends complete alone, also each
// waiting for its send alone before posting the receive: only reading into the unexpected queue
// while sending lets both complete.
inline void simultaneousLargeSends(Env& e) {
  if (e.rank > 1) return;
  Transport& t = e.t();
  const int peer = 1 - e.rank;
  std::vector<uint8_t> out(48 << 20), in(48 << 20, 0);
  if (e.traits.largeSendsCompleteAlone) {
    fill(out, e.rank, 5);
    waitOne(t, t.isend(peer, 4, out.data(), out.size()));
    waitOne(t, t.irecv(peer, 4, in.data(), in.size()));
    EXPECT_EQ(firstWrong(in, peer, 5), -1);
  }
  fill(out, e.rank, 6);
  std::vector<RequestPtr> reqs;
  if (e.rank == 0) reqs.push_back(t.isend(peer, 4, out.data(), out.size()));
  reqs.push_back(t.irecv(peer, 4, in.data(), in.size()));
  if (e.rank == 1) reqs.push_back(t.isend(peer, 4, out.data(), out.size()));
  t.waitAll(reqs, Clock::now() + kTimeout);
  EXPECT_EQ(firstWrong(in, peer, 6), -1);
  sendsDone(t, {peer}, {peer});
}

// ---- size mismatch --------------------------------------------------------------------------

// Rank 0 sends 8 bytes, rank 1 receives recvBytes: the receive fails naming the peer, the tag
// and both sizes. The send may complete (an eager transport) or fail the same way (inproc,
// which matches both sides at once).
inline void sizeMismatch(Env& e, int tag, size_t recvBytes) {
  Transport& t = e.t();
  const size_t sendBytes = 8;
  std::vector<uint8_t> buf(16, 1);
  if (e.rank == 0) {
    try {
      waitOne(t, t.isend(1, tag, buf.data(), sendBytes), milliseconds(2000));
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), e.traits.sizeMismatchCode) << err.what();
      EXPECT_TRUE(contains(err.what(), "size mismatch")) << err.what();
    }
  } else if (e.rank == 1) {
    std::vector<std::string> parts = {"size mismatch", "peer rank 0", "tag " + str(tag),
                                      str(recvBytes) + " bytes"};
    // A longer receive learns the message's size; a shorter one may only learn "more".
    if (recvBytes > sendBytes) parts.push_back(str(sendBytes) + " bytes");
    expectError([&] { waitOne(t, t.irecv(0, tag, buf.data(), recvBytes)); },
                e.traits.sizeMismatchCode, parts);
  }
}
inline void sizeMismatchLongerReceive(Env& e) { sizeMismatch(e, 2, 16); }
inline void sizeMismatchShorterReceive(Env& e) { sizeMismatch(e, 5, 4); }

// ---- split views ----------------------------------------------------------------------------

// Ranks 0 and 2 make the view {2, 0} (view rank 0 = rank 2); rank 1 stays out. The same peer,
// tag and size on the parent and on the view: only the context tells the messages apart, both
// waiting unmatched at the receiver. The parent still reaches the rank outside the view.
inline void splitViewUsesItsOwnContext(Env& e) {
  Transport& t = e.t();
  std::unique_ptr<Transport> view;
  if (e.rank == 0 || e.rank == 2) {
    view = t.split({2, 0}, 7);
    EXPECT_EQ(view->size(), 2);
    EXPECT_EQ(view->rank(), e.rank == 2 ? 0 : 1);
    EXPECT_EQ(view->name(), e.traits.name);
    if (e.traits.reusedContextCode != MTXCOMM_SUCCESS) {
      expectError([&] { t.split({0, 2}, 7); }, e.traits.reusedContextCode, {"context id 7"});
    }
  }
  std::vector<uint8_t> parentMsg(4096), viewMsg(4096), got(4096);
  if (e.rank == 0) {
    fill(parentMsg, 0, 11);
    fill(viewMsg, 0, 22);
    // Both posted before either is waited for: a rendezvous transport completes the parent's
    // send only once rank 2 has taken the view's message.
    RequestPtr toParent = t.isend(2, 5, parentMsg.data(), parentMsg.size());
    RequestPtr toView = view->isend(0, 5, viewMsg.data(), viewMsg.size());
    waitOne(t, std::move(toParent));
    waitOne(*view, std::move(toView));
    sendsDone(t, {1, 2}, {});  // rank 1 learns the parent still reaches it
  } else if (e.rank == 2) {
    std::this_thread::sleep_for(milliseconds(50));  // both messages arrive unmatched
    waitOne(*view, view->irecv(1, 5, got.data(), got.size()));
    EXPECT_EQ(firstWrong(got, 0, 22), -1);
    waitOne(t, t.irecv(0, 5, got.data(), got.size()));
    EXPECT_EQ(firstWrong(got, 0, 11), -1);
    sendsDone(t, {}, {0});
  } else if (e.rank == 1) {
    sendsDone(t, {}, {0});
  }
}

// Ranks 0-3: even and odd ranks each make two views of the same members in reverse order
// ({2, 0} and {3, 1}), with distinct context ids, and exchange on the same tag in both; the
// second view's message is sent first, so it is the older one when the first view's receive is
// posted. Each receive gets its own view's message.
inline void splitViewsKeepTheirMessagesApart(Env& e) {
  if (e.rank > 3) return;
  Transport& world = e.t();
  const int r = e.rank;
  const std::vector<int> members = r % 2 == 0 ? std::vector<int>{2, 0} : std::vector<int>{3, 1};
  auto sub = world.split(members, 1234 + r % 2);
  EXPECT_EQ(sub->size(), 2);
  EXPECT_EQ(sub->rank(), r < 2 ? 1 : 0);
  auto sub2 = world.split(members, 99 + r % 2);
  const int peer = 1 - sub->rank();
  int a = 100 + r, b = 200 + r, gotA = -1, gotB = -1;
  std::vector<RequestPtr> reqs2;
  reqs2.push_back(sub2->isend(peer, 1, &b, sizeof(b)));
  std::vector<RequestPtr> reqs;
  reqs.push_back(sub->isend(peer, 1, &a, sizeof(a)));
  reqs.push_back(sub->irecv(peer, 1, &gotA, sizeof(gotA)));
  sub->waitAll(reqs, Clock::now() + kTimeout);
  reqs2.push_back(sub2->irecv(peer, 1, &gotB, sizeof(gotB)));
  sub2->waitAll(reqs2, Clock::now() + kTimeout);
  const int partner = members[peer];
  EXPECT_EQ(gotA, 100 + partner);
  EXPECT_EQ(gotB, 200 + partner);
  if (e.traits.reusedContextCode != MTXCOMM_SUCCESS) {
    expectError([&] { world.split(members, 1234 + r % 2); }, e.traits.reusedContextCode,
                {"context id " + str(1234 + r % 2)});
  }
}

// Distinct views may be used concurrently: ranks 0 and 1 ping-pong 200 kB messages on the
// parent on one thread and on a view of both on another.
inline void viewsOnTwoThreads(Env& e) {
  if (e.rank > 1) return;
  Transport& t = e.t();
  std::unique_ptr<Transport> view = t.split({0, 1}, 1);
  const int rank = e.rank;
  auto pingpong = [rank](Transport& tr, int salt) {
    std::vector<uint8_t> buf(200000);
    for (int round = 0; round < 20; ++round) {
      if ((round % 2) == rank) {
        fill(buf, rank, salt + round);
        waitOne(tr, tr.isend(1 - rank, 1, buf.data(), buf.size()));
      } else {
        waitOne(tr, tr.irecv(1 - rank, 1, buf.data(), buf.size()));
        EXPECT_EQ(firstWrong(buf, 1 - rank, salt + round), -1) << "salt " << salt;
      }
    }
    sendsDone(tr, {1 - rank}, {1 - rank});
  };
  std::string otherError;
  std::thread other([&] {
    try {
      pingpong(*view, 100);
    } catch (const std::exception& ex) {
      otherError = ex.what();
    }
  });
  pingpong(t, 0);
  other.join();
  EXPECT_EQ(otherError, "");
}

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
