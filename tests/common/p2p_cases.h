// The point-to-point cases every world runs (mtxcomm_isend and friends): ranks as threads over
// the in-process and TCP transports (tests/test_p2p.cc) and processes under mpirun and the
// store bootstrap (tests/mp/mp_p2p.cc). Every rank of a communicator calls a case; each checks
// itself against closed-form data and reports through a P2pCheck. Public C API only.
#ifndef MTXCOMM_TESTS_COMMON_P2P_CASES_H_
#define MTXCOMM_TESTS_COMMON_P2P_CASES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace p2pcases {

// Failures of one rank, as text.
class P2pCheck {
 public:
  explicit P2pCheck(int rank) : rank_(rank) {}
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    std::lock_guard<std::mutex> lock(mu_);
    failures_.push_back("rank " + std::to_string(rank_) + ": " + what);
  }
  // rc == want, else a failure quoting the last error.
  void expectRc(mtxcomm_result_t rc, mtxcomm_result_t want, mtxcomm_comm_t comm,
                const std::string& what) {
    expect(rc == want, what + ": result " + std::to_string(rc) + ", expected " +
                           std::to_string(want) + " (" + mtxcomm_get_last_error(comm) + ")");
  }
  const std::vector<std::string>& failures() const { return failures_; }

 private:
  int rank_;
  std::mutex mu_;
  std::vector<std::string> failures_;
};

struct Ctx {
  mtxcomm_comm_t comm;
  int rank, size;
};

inline Ctx ctxOf(mtxcomm_comm_t comm) {
  Ctx c{comm, 0, 1};
  mtxcomm_comm_rank(comm, &c.rank);
  mtxcomm_comm_size(comm, &c.size);
  return c;
}

inline bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Byte j of the message from src to dst (salt: the case's).
inline unsigned char pattern(int src, int dst, size_t j, int salt) {
  return static_cast<unsigned char>(src * 31 + dst * 7 + static_cast<int>(j % 251) * 13 + salt);
}

inline std::vector<unsigned char> message(int src, int dst, size_t bytes, int salt) {
  std::vector<unsigned char> m(bytes);
  for (size_t j = 0; j < bytes; ++j) m[j] = pattern(src, dst, j, salt);
  return m;
}

// Waits for every request (NULL entries skipped) and frees it.
inline void waitAll(const Ctx& c, std::vector<mtxcomm_request_t>& reqs, P2pCheck& ck,
                    const std::string& what) {
  for (auto& r : reqs) {
    if (!r) continue;
    ck.expectRc(mtxcomm_wait(r, 0), MTXCOMM_SUCCESS, c.comm, what + ": wait");
    ck.expectRc(mtxcomm_request_free(r), MTXCOMM_SUCCESS, c.comm, what + ": free");
    r = nullptr;
  }
}

// Every rank sends every rank (itself included) one message per element size (1, 2, 4, 8 bytes)
// and count (inline and not), all posted before any wait.
inline void closedForm(const Ctx& c, P2pCheck& ck) {
  const mtxcomm_datatype_t types[] = {MTXCOMM_INT8, MTXCOMM_FLOAT16, MTXCOMM_FLOAT32,
                                      MTXCOMM_FLOAT64};
  for (mtxcomm_datatype_t dt : types) {
    const size_t es = mtxcomm_datatype_size(dt);
    for (size_t count : {size_t{1}, size_t{7}, size_t{100}, size_t{5000}}) {
      const int salt = static_cast<int>(es * 3 + count);
      std::vector<std::vector<unsigned char>> out(c.size), in(c.size);
      std::vector<mtxcomm_request_t> reqs;
      for (int p = 0; p < c.size; ++p) {
        in[p].assign(count * es, 0);
        out[p] = message(c.rank, p, count * es, salt);
        mtxcomm_request_t r = nullptr;
        ck.expectRc(mtxcomm_irecv(in[p].data(), count, dt, p, 3, c.comm, &r), MTXCOMM_SUCCESS,
                    c.comm, "irecv");
        reqs.push_back(r);
      }
      for (int k = 0; k < c.size; ++k) {
        const int p = (c.rank + k) % c.size;  // staggered: not everyone to rank 0 first
        mtxcomm_request_t r = nullptr;
        ck.expectRc(mtxcomm_isend(out[p].data(), count, dt, p, 3, c.comm, &r), MTXCOMM_SUCCESS,
                    c.comm, "isend");
        reqs.push_back(r);
      }
      const std::string what =
          "closed form, " + std::to_string(count) + " x " + std::to_string(es) + " bytes";
      waitAll(c, reqs, ck, what);
      for (int p = 0; p < c.size; ++p) {
        ck.expect(in[p] == message(p, c.rank, count * es, salt),
                  what + " from rank " + std::to_string(p) + " wrong");
      }
    }
  }
}

// Rank 0 sends rank 1 twelve messages on tags 5, 6, 7 in turn (8 and 4096 bytes alternating,
// element 0 = the message's number); rank 1 posts every tag-7 receive first, then tag 5, then
// tag 6: per tag the messages arrive in the order sent.
inline void ordering(const Ctx& c, P2pCheck& ck) {
  if (c.size < 2 || c.rank > 1) return;
  constexpr int kMessages = 12;
  auto bytesOf = [](int k) { return k % 2 ? size_t{4096} : size_t{8}; };
  std::vector<std::vector<int32_t>> bufs(kMessages);
  std::vector<mtxcomm_request_t> reqs;
  if (c.rank == 0) {
    for (int k = 0; k < kMessages; ++k) {
      bufs[k].assign(bytesOf(k) / 4, k);
      mtxcomm_request_t r = nullptr;
      ck.expectRc(
          mtxcomm_isend(bufs[k].data(), bufs[k].size(), MTXCOMM_INT32, 1, 5 + k % 3, c.comm, &r),
          MTXCOMM_SUCCESS, c.comm, "ordering isend");
      reqs.push_back(r);
    }
  } else {
    for (int tag : {7, 5, 6}) {
      for (int k = tag - 5; k < kMessages; k += 3) {
        bufs[k].assign(bytesOf(k) / 4, -1);
        mtxcomm_request_t r = nullptr;
        ck.expectRc(
            mtxcomm_irecv(bufs[k].data(), bufs[k].size(), MTXCOMM_INT32, 0, tag, c.comm, &r),
            MTXCOMM_SUCCESS, c.comm, "ordering irecv");
        reqs.push_back(r);
      }
    }
  }
  waitAll(c, reqs, ck, "ordering");
  if (c.rank == 1) {
    for (int k = 0; k < kMessages; ++k) {
      ck.expect(
          bufs[k].front() == k && bufs[k].back() == k,
          "ordering: message " + std::to_string(k) + " holds " + std::to_string(bufs[k].front()));
    }
  }
}

// Pairs (0,1), (2,3), ...: irecv from the partner, isend to it, wait both, on both ranks.
inline void exchange(const Ctx& c, P2pCheck& ck, size_t bytes) {
  const int partner = c.rank ^ 1;
  if (partner >= c.size) return;
  std::vector<unsigned char> out = message(c.rank, partner, bytes, 1), in(bytes, 0);
  std::vector<mtxcomm_request_t> reqs(2);
  ck.expectRc(mtxcomm_irecv(in.data(), bytes, MTXCOMM_UINT8, partner, 0, c.comm, &reqs[0]),
              MTXCOMM_SUCCESS, c.comm, "exchange irecv");
  ck.expectRc(mtxcomm_isend(out.data(), bytes, MTXCOMM_UINT8, partner, 0, c.comm, &reqs[1]),
              MTXCOMM_SUCCESS, c.comm, "exchange isend");
  waitAll(c, reqs, ck, "exchange of " + std::to_string(bytes) + " bytes");
  ck.expect(in == message(partner, c.rank, bytes, 1),
            "exchange of " + std::to_string(bytes) + " bytes: wrong data");
}

// isend to the next rank, irecv from the previous one (send posted first), several sizes.
inline void ring(const Ctx& c, P2pCheck& ck) {
  const int next = (c.rank + 1) % c.size, prev = (c.rank + c.size - 1) % c.size;
  for (size_t bytes : {size_t{4}, size_t{1000}, size_t{1} << 20}) {
    std::vector<unsigned char> out = message(c.rank, next, bytes, 2), in(bytes, 0);
    std::vector<mtxcomm_request_t> reqs(2);
    ck.expectRc(mtxcomm_isend(out.data(), bytes, MTXCOMM_UINT8, next, 1, c.comm, &reqs[0]),
                MTXCOMM_SUCCESS, c.comm, "ring isend");
    ck.expectRc(mtxcomm_irecv(in.data(), bytes, MTXCOMM_UINT8, prev, 1, c.comm, &reqs[1]),
                MTXCOMM_SUCCESS, c.comm, "ring irecv");
    waitAll(c, reqs, ck, "ring");
    ck.expect(in == message(prev, c.rank, bytes, 2),
              "ring of " + std::to_string(bytes) + " bytes: wrong data from the previous");
  }
}

// Zero-byte messages (NULL buffers) between pairs, around a message of 8 bytes on the same tag.
inline void zeroBytes(const Ctx& c, P2pCheck& ck) {
  const int partner = c.rank ^ 1;
  if (partner >= c.size) return;
  int64_t out = 42 + c.rank, in = 0;
  std::vector<mtxcomm_request_t> reqs(6);
  ck.expectRc(mtxcomm_irecv(nullptr, 0, MTXCOMM_FLOAT32, partner, 2, c.comm, &reqs[0]),
              MTXCOMM_SUCCESS, c.comm, "zero-byte irecv");
  ck.expectRc(mtxcomm_irecv(&in, 1, MTXCOMM_INT64, partner, 2, c.comm, &reqs[1]), MTXCOMM_SUCCESS,
              c.comm, "irecv");
  ck.expectRc(mtxcomm_irecv(nullptr, 0, MTXCOMM_INT8, partner, 2, c.comm, &reqs[2]),
              MTXCOMM_SUCCESS, c.comm, "zero-byte irecv");
  ck.expectRc(mtxcomm_isend(nullptr, 0, MTXCOMM_INT8, partner, 2, c.comm, &reqs[3]),
              MTXCOMM_SUCCESS, c.comm, "zero-byte isend");
  ck.expectRc(mtxcomm_isend(&out, 1, MTXCOMM_INT64, partner, 2, c.comm, &reqs[4]), MTXCOMM_SUCCESS,
              c.comm, "isend");
  ck.expectRc(mtxcomm_isend(nullptr, 0, MTXCOMM_INT8, partner, 2, c.comm, &reqs[5]),
              MTXCOMM_SUCCESS, c.comm, "zero-byte isend");
  waitAll(c, reqs, ck, "zero bytes");
  ck.expect(in == 42 + partner, "zero bytes: the 8-byte message between them is wrong");
}

// Rank 0 sends rank 1 on tag 9: 100 bytes, 100000 bytes, 16 bytes; rank 1 receives 64, 1000
// and 16 bytes: the first two fail naming both sizes, the peer and the tag, and write nothing
// (guard bytes around each buffer), the third succeeds (the mismatched messages were consumed).
inline void sizeMismatch(const Ctx& c, P2pCheck& ck) {
  if (c.size < 2 || c.rank > 1) return;
  const size_t sent[] = {100, 100000, 16}, posted[] = {64, 1000, 16};
  if (c.rank == 0) {
    std::vector<mtxcomm_request_t> reqs(3);
    std::vector<std::vector<unsigned char>> out(3);
    for (int k = 0; k < 3; ++k) {
      out[k] = message(0, 1, sent[k], 4);
      ck.expectRc(mtxcomm_isend(out[k].data(), sent[k], MTXCOMM_UINT8, 1, 9, c.comm, &reqs[k]),
                  MTXCOMM_SUCCESS, c.comm, "mismatch isend");
    }
    waitAll(c, reqs, ck, "mismatch: the sends complete normally");
    return;
  }
  constexpr size_t kGuard = 64;
  for (int k = 0; k < 3; ++k) {
    std::vector<unsigned char> buf(posted[k] + 2 * kGuard, 0xAB);
    mtxcomm_request_t r = nullptr;
    ck.expectRc(mtxcomm_irecv(buf.data() + kGuard, posted[k], MTXCOMM_UINT8, 0, 9, c.comm, &r),
                MTXCOMM_SUCCESS, c.comm, "mismatch irecv");
    const mtxcomm_result_t rc = mtxcomm_wait(r, 0);
    const std::string msg = mtxcomm_get_last_error(c.comm);
    mtxcomm_request_free(r);
    if (k < 2) {
      ck.expect(rc == MTXCOMM_INVALID_USAGE, "mismatch: result " + std::to_string(rc));
      ck.expect(has(msg, std::to_string(posted[k]) + " bytes") &&
                    has(msg, std::to_string(sent[k]) + " bytes") && has(msg, "peer rank 0") &&
                    has(msg, "tag 9"),
                "mismatch: the message does not name both sizes, the peer and the tag: " + msg);
      ck.expect(std::all_of(buf.begin(), buf.end(), [](unsigned char b) { return b == 0xAB; }),
                "mismatch: the receive buffer or its guard bytes were written");
    } else {
      ck.expectRc(rc, MTXCOMM_SUCCESS, c.comm, "the message after the mismatches");
      ck.expect(std::equal(buf.begin() + kGuard, buf.end() - kGuard, message(0, 1, 16, 4).begin()),
                "the message after the mismatches is wrong");
    }
  }
}

// Invalid arguments: refused before anything is posted, naming what was wrong; request misuse.
inline void badArguments(const Ctx& c, P2pCheck& ck) {
  int x = 0;
  struct Bad {
    const void* buf;
    size_t count;
    mtxcomm_datatype_t dt;
    int peer, tag;
    bool nullReq;
    const char* names;
  };
  const Bad bad[] = {
      {&x, 1, MTXCOMM_INT32, -2, 0, false, "peer -2"},
      {&x, 1, MTXCOMM_INT32, c.size, 0, false, "is not a rank of this communicator"},
      {&x, 1, MTXCOMM_INT32, 0, -1, false, "tag -1"},
      {&x, 1, MTXCOMM_INT32, 0, MTXCOMM_P2P_MAX_TAG + 1, false, "tag 32768"},
      {nullptr, 1, MTXCOMM_INT32, 0, 0, false, "buf is NULL"},
      {&x, 1, static_cast<mtxcomm_datatype_t>(99), 0, 0, false, "datatype 99"},
      {&x, SIZE_MAX / 2, MTXCOMM_INT32, 0, 0, false, "overflows"},
      {&x, 1, MTXCOMM_INT32, 0, 0, true, "req"},
  };
  for (const Bad& b : bad) {
    for (int send = 0; send < 2; ++send) {
      mtxcomm_request_t r = reinterpret_cast<mtxcomm_request_t>(&x);
      mtxcomm_request_t* out = b.nullReq ? nullptr : &r;
      const mtxcomm_result_t rc =
          send ? mtxcomm_isend(b.buf, b.count, b.dt, b.peer, b.tag, c.comm, out)
               : mtxcomm_irecv(const_cast<void*>(b.buf), b.count, b.dt, b.peer, b.tag, c.comm, out);
      const std::string msg = mtxcomm_get_last_error(c.comm);
      ck.expect(rc == MTXCOMM_INVALID_ARGUMENT && has(msg, b.names) &&
                    has(msg, send ? "mtxcomm_isend" : "mtxcomm_irecv"),
                std::string("bad argument (") + b.names + "): result " + std::to_string(rc) +
                    ", message: " + msg);
      ck.expect(b.nullReq || r == nullptr, "bad argument: *req is not NULL");
    }
  }
  ck.expect(mtxcomm_isend(&x, 1, MTXCOMM_INT32, 0, 0, nullptr, nullptr) == MTXCOMM_INVALID_ARGUMENT,
            "NULL comm");
  int done = 7;
  ck.expect(mtxcomm_test(nullptr, &done) == MTXCOMM_INVALID_ARGUMENT, "test(NULL)");
  ck.expect(mtxcomm_wait(nullptr, 0) == MTXCOMM_INVALID_ARGUMENT, "wait(NULL)");
  ck.expect(mtxcomm_request_free(nullptr) == MTXCOMM_SUCCESS, "free(NULL)");
  // A request in flight is not freed; once complete it is, once.
  int in = 0, out = 5;
  mtxcomm_request_t r = nullptr;
  ck.expectRc(mtxcomm_irecv(&in, 1, MTXCOMM_INT32, c.rank, 11, c.comm, &r), MTXCOMM_SUCCESS, c.comm,
              "self irecv");
  done = 7;
  ck.expect(mtxcomm_test(r, &done) == MTXCOMM_SUCCESS && done == 0, "test of a pending request");
  ck.expect(mtxcomm_request_free(r) == MTXCOMM_INVALID_USAGE, "free of a request in flight");
  int src = 0;
  ck.expect(mtxcomm_request_source(r, &src) == MTXCOMM_INVALID_USAGE,
            "request_source of a request in flight");
  ck.expectRc(mtxcomm_send(&out, 1, MTXCOMM_INT32, c.rank, 11, c.comm), MTXCOMM_SUCCESS, c.comm,
              "self send");
  ck.expectRc(mtxcomm_wait(r, 0), MTXCOMM_SUCCESS, c.comm, "wait of the self receive");
  ck.expect(mtxcomm_test(r, &done) == MTXCOMM_SUCCESS && done == 1, "test of a completed request");
  ck.expect(in == 5, "self message");
  ck.expect(mtxcomm_request_free(r) == MTXCOMM_SUCCESS, "free of a completed request");
  ck.expect(mtxcomm_request_free(r) == MTXCOMM_INVALID_ARGUMENT, "second free");
}

// Messages to this rank itself: a blocking send before its receive (copied aside), and a
// receive posted before its send.
inline void selfMessages(const Ctx& c, P2pCheck& ck) {
  std::vector<unsigned char> out = message(c.rank, c.rank, 3000, 5), in(3000, 0);
  ck.expectRc(mtxcomm_send(out.data(), 3000, MTXCOMM_UINT8, c.rank, 4, c.comm), MTXCOMM_SUCCESS,
              c.comm, "self send");
  ck.expectRc(mtxcomm_recv(in.data(), 3000, MTXCOMM_UINT8, c.rank, 4, c.comm), MTXCOMM_SUCCESS,
              c.comm, "self recv");
  ck.expect(in == out, "self: wrong data (send first)");
  std::vector<mtxcomm_request_t> reqs(2);
  in.assign(3000, 0);
  ck.expectRc(mtxcomm_irecv(in.data(), 1500, MTXCOMM_UINT16, c.rank, 4, c.comm, &reqs[0]),
              MTXCOMM_SUCCESS, c.comm, "self irecv");
  ck.expectRc(mtxcomm_isend(out.data(), 3000, MTXCOMM_UINT8, c.rank, 4, c.comm, &reqs[1]),
              MTXCOMM_SUCCESS, c.comm, "self isend");
  waitAll(c, reqs, ck, "self");
  ck.expect(in == out, "self: wrong data (receive first)");
}

// Point-to-point on this thread while another thread runs allreduces on the same
// communicator: both right.
inline void concurrentWithCollectives(const Ctx& c, P2pCheck& ck) {
  std::thread collectives([&] {
    std::vector<float> buf(4096);
    for (int it = 0; it < 30; ++it) {
      std::fill(buf.begin(), buf.end(), static_cast<float>(c.rank + it));
      ck.expectRc(mtxcomm_allreduce(buf.data(), buf.data(), buf.size(), MTXCOMM_FLOAT32,
                                    MTXCOMM_SUM, c.comm, nullptr),
                  MTXCOMM_SUCCESS, c.comm, "allreduce beside point-to-point");
      const float want = static_cast<float>(c.size * (c.size - 1) / 2 + c.size * it);
      ck.expect(buf[0] == want && buf.back() == want, "allreduce beside point-to-point: wrong");
    }
  });
  for (int it = 0; it < 10; ++it) {
    ring(c, ck);
  }
  collectives.join();
}

// Receives from any source (MTXCOMM_ANY_SOURCE): a fan-in to rank 0 from every rank (itself
// included) at an inline and a payload size, each message checked against the sender that
// mtxcomm_request_source names; MPI's order between named and any-source receives of one
// sender; a header receive left idle by an any-source receive taking the next message of its
// peer; a size mismatch naming the sender.
inline void anySource(const Ctx& c, P2pCheck& ck) {
  auto sourceOf = [&](mtxcomm_request_t r) {
    int src = -7;
    ck.expectRc(mtxcomm_request_source(r, &src), MTXCOMM_SUCCESS, c.comm, "request_source");
    return src;
  };
  for (size_t bytes : {size_t{16}, size_t{5000}}) {
    const int salt = static_cast<int>(bytes % 97);
    const std::vector<unsigned char> out = message(c.rank, 0, bytes, salt);
    mtxcomm_request_t sreq = nullptr;
    if (c.rank != 0) {
      ck.expectRc(mtxcomm_isend(out.data(), bytes, MTXCOMM_UINT8, 0, 21, c.comm, &sreq),
                  MTXCOMM_SUCCESS, c.comm, "any-source fan-in isend");
      std::vector<mtxcomm_request_t> one{sreq};
      waitAll(c, one, ck, "any-source fan-in send");
      ck.expectRc(mtxcomm_barrier(c.comm), MTXCOMM_SUCCESS, c.comm, "barrier");  // round apart
      continue;
    }
    std::vector<std::vector<unsigned char>> in(c.size, std::vector<unsigned char>(bytes, 0));
    std::vector<mtxcomm_request_t> reqs(c.size);
    for (int k = 0; k < c.size; ++k) {
      ck.expectRc(mtxcomm_irecv(in[k].data(), bytes, MTXCOMM_UINT8, MTXCOMM_ANY_SOURCE, 21, c.comm,
                                &reqs[k]),
                  MTXCOMM_SUCCESS, c.comm, "any-source irecv");
    }
    ck.expectRc(mtxcomm_isend(out.data(), bytes, MTXCOMM_UINT8, 0, 21, c.comm, &sreq),
                MTXCOMM_SUCCESS, c.comm, "any-source self isend");
    std::vector<int> seen(c.size, 0);
    for (int k = 0; k < c.size; ++k) {
      ck.expectRc(mtxcomm_wait(reqs[k], 0), MTXCOMM_SUCCESS, c.comm, "any-source wait");
      const int src = sourceOf(reqs[k]);
      mtxcomm_request_free(reqs[k]);
      if (src < 0 || src >= c.size) {
        ck.expect(false, "any-source: source " + std::to_string(src) + " is not a rank");
        continue;
      }
      ++seen[src];
      ck.expect(in[k] == message(src, 0, bytes, salt),
                "any-source: the data is not the message of rank " + std::to_string(src));
    }
    ck.expect(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }),
              "any-source: every rank's message taken exactly once");
    std::vector<mtxcomm_request_t> one{sreq};
    waitAll(c, one, ck, "any-source self send");
    ck.expectRc(mtxcomm_barrier(c.comm), MTXCOMM_SUCCESS, c.comm, "barrier");
  }
  if (c.size < 2) return;
  // Order: a message goes to the oldest receive that matches it, named or any-source.
  if (c.rank == 1) {
    for (int v : {1, 2, 3, 4}) {
      ck.expectRc(mtxcomm_send(&v, 1, MTXCOMM_INT32, 0, 22, c.comm), MTXCOMM_SUCCESS, c.comm,
                  "order send");
    }
  } else if (c.rank == 0) {
    int got[4] = {0, 0, 0, 0};
    std::vector<mtxcomm_request_t> reqs(4);
    mtxcomm_irecv(&got[0], 1, MTXCOMM_INT32, 1, 22, c.comm, &reqs[0]);
    mtxcomm_irecv(&got[1], 1, MTXCOMM_INT32, MTXCOMM_ANY_SOURCE, 22, c.comm, &reqs[1]);
    mtxcomm_irecv(&got[2], 1, MTXCOMM_INT32, MTXCOMM_ANY_SOURCE, 22, c.comm, &reqs[2]);
    mtxcomm_irecv(&got[3], 1, MTXCOMM_INT32, 1, 22, c.comm, &reqs[3]);
    for (auto r : reqs) ck.expectRc(mtxcomm_wait(r, 0), MTXCOMM_SUCCESS, c.comm, "order wait");
    ck.expect(sourceOf(reqs[1]) == 1 && sourceOf(reqs[2]) == 1, "order: sources");
    for (auto r : reqs) mtxcomm_request_free(r);
    ck.expect(got[0] == 1 && got[1] == 2 && got[2] == 3 && got[3] == 4,
              "order: named and any-source receives took the messages out of posting order");
  }
  ck.expectRc(mtxcomm_barrier(c.comm), MTXCOMM_SUCCESS, c.comm, "barrier");
  // An idle header receive: the any-source receive takes the last rank's message; the header
  // receive it left on every other peer then takes that peer's next message of the tag.
  const int last = c.size - 1;
  int v = 100 + c.rank, got = 0;
  if (c.rank == 0) {
    ck.expectRc(mtxcomm_recv(&got, 1, MTXCOMM_INT32, MTXCOMM_ANY_SOURCE, 23, c.comm),
                MTXCOMM_SUCCESS, c.comm, "idle: any-source recv");
    ck.expect(got == 100 + last, "idle: the any-source receive took " + std::to_string(got));
  } else if (c.rank == last) {
    ck.expectRc(mtxcomm_send(&v, 1, MTXCOMM_INT32, 0, 23, c.comm), MTXCOMM_SUCCESS, c.comm,
                "idle: send");
  }
  ck.expectRc(mtxcomm_barrier(c.comm), MTXCOMM_SUCCESS, c.comm, "barrier");
  if (c.rank != 0) {
    ck.expectRc(mtxcomm_send(&v, 1, MTXCOMM_INT32, 0, 23, c.comm), MTXCOMM_SUCCESS, c.comm,
                "idle: second send");
  } else {
    for (int p = c.size - 1; p >= 1; --p) {
      ck.expectRc(mtxcomm_recv(&got, 1, MTXCOMM_INT32, p, 23, c.comm), MTXCOMM_SUCCESS, c.comm,
                  "idle: named recv");
      ck.expect(got == 100 + p, "idle: the named receive from " + std::to_string(p) + " took " +
                                    std::to_string(got));
    }
  }
  // A size mismatch names the sender; a send's source is its peer; argument checks.
  if (c.rank == 1) {
    double d = 1.5;
    ck.expectRc(mtxcomm_send(&d, 1, MTXCOMM_FLOAT64, 0, 24, c.comm), MTXCOMM_SUCCESS, c.comm,
                "mismatch send");
  } else if (c.rank == 0) {
    float f = 0;
    mtxcomm_request_t r = nullptr;
    mtxcomm_irecv(&f, 1, MTXCOMM_FLOAT32, MTXCOMM_ANY_SOURCE, 24, c.comm, &r);
    ck.expect(mtxcomm_wait(r, 0) == MTXCOMM_INVALID_USAGE, "any-source mismatch: result");
    const std::string msg = mtxcomm_get_last_error(c.comm);
    ck.expect(has(msg, "peer rank 1") && has(msg, "4 bytes") && has(msg, "8 bytes"),
              "any-source mismatch: the message does not name the sender and sizes: " + msg);
    ck.expect(sourceOf(r) == 1 && f == 0, "any-source mismatch: source and buffer");
    mtxcomm_request_free(r);
    ck.expect(mtxcomm_isend(&f, 1, MTXCOMM_FLOAT32, MTXCOMM_ANY_SOURCE, 1, c.comm, &r) ==
                      MTXCOMM_INVALID_ARGUMENT &&
                  r == nullptr,
              "isend to MTXCOMM_ANY_SOURCE is refused");
    ck.expect(mtxcomm_request_source(nullptr, &v) == MTXCOMM_INVALID_ARGUMENT,
              "request_source(NULL)");
  }
  ck.expectRc(mtxcomm_barrier(c.comm), MTXCOMM_SUCCESS, c.comm, "barrier");
}

// Every case above, in order (a world that runs them all).
inline void allCases(mtxcomm_comm_t comm, P2pCheck& ck) {
  const Ctx c = ctxOf(comm);
  closedForm(c, ck);
  ordering(c, ck);
  exchange(c, ck, 8);
  exchange(c, ck, size_t{16} << 20);
  ring(c, ck);
  zeroBytes(c, ck);
  sizeMismatch(c, ck);
  badArguments(c, ck);
  selfMessages(c, ck);
  anySource(c, ck);
  concurrentWithCollectives(c, ck);
}

}  // namespace p2pcases
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_P2P_CASES_H_
