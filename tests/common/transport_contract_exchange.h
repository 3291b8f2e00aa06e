// The transport contract's cases of data exchange: addressing, ordering, size mismatch, views.
// Part of tests/common/transport_contract.h, which includes it: see there.
#ifndef MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_EXCHANGE_H_
#define MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_EXCHANGE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/transport_contract_base.h"
#include "lib/base/error.h"
#include "transports/transport.h"

namespace mtxcomm {
namespace contract {

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

}  // namespace contract
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_TRANSPORT_CONTRACT_EXCHANGE_H_
