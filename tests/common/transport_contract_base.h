// The transport contract's ground: each transport's Traits, a rank of a case, the test data.
// Part of tests/common/transport_contract.h, which includes it: see there.
#ifndef MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_BASE_H_
#define MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_BASE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
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

}  // namespace contract
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_BASE_H_
