// The C API's argument checks: invalid arguments are rejected before any byte moves, naming the
// rank and what was wrong, and leave the communicator usable; null handles and output pointers;
// count 0; ranks that disagree on a call get an error, never wrong data.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/api_checks.h"
#include "common/test_util.h"
#include "harness.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace {

using testing::runRanks;
using testutil::contains;
using testutil::expectUsable;

TEST(Api, InvalidArgumentsAreRejectedLocallyAndLeaveTheCommUsable) {
  runRanks(3, [](mtxcomm_comm_t comm, int rank) {
    float buf[64] = {0};
    float out[64] = {0};
    struct Bad {
      std::function<mtxcomm_result_t()> call;
      const char* mustMention;
    };
    std::vector<Bad> bad = {
        {[&] {
           return mtxcomm_allreduce(nullptr, out, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
         },
         "sendbuf is NULL"},
        {[&] {
           return mtxcomm_allreduce(buf, nullptr, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
         },
         "recvbuf is NULL"},
        {[&] {
           return mtxcomm_allreduce(buf, out, 4, static_cast<mtxcomm_datatype_t>(42), MTXCOMM_SUM,
                                    comm, nullptr);
         },
         "invalid datatype 42"},
        {[&] {
           return mtxcomm_allreduce(buf, out, 4, MTXCOMM_FLOAT32, static_cast<mtxcomm_op_t>(-1),
                                    comm, nullptr);
         },
         "invalid op -1"},
        {[&] { return mtxcomm_broadcast(buf, out, 4, MTXCOMM_FLOAT32, 3, comm, nullptr); },
         "root 3 is out of range"},
        {[&] {
           return mtxcomm_reduce(buf, out, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, -1, comm, nullptr);
         },
         "root -1 is out of range"},
        {[&] {
           return mtxcomm_allreduce(buf, buf + 1, 8, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
         },
         "partially overlap"},
        {[&] { return mtxcomm_allgather(buf + 1, buf, 4, MTXCOMM_FLOAT32, comm, nullptr); },
         "partially overlap"},
        {[&] {
           return mtxcomm_reduce_scatter(buf, buf + 1, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm,
                                         nullptr);
         },
         "partially overlap"},
        {[&] {
           return mtxcomm_allreduce(buf, out, std::numeric_limits<size_t>::max() / 2,
                                    MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
         },
         "overflows size_t"},
        {[&] {
           return mtxcomm_allgather(buf, out, std::numeric_limits<size_t>::max() / 8,
                                    MTXCOMM_FLOAT32, comm, nullptr);
         },
         "overflows size_t"},
    };
    for (size_t i = 0; i < bad.size(); ++i) {
      EXPECT_EQ(bad[i].call(), MTXCOMM_INVALID_ARGUMENT) << "case " << i;
      std::string msg = mtxcomm_get_last_error(comm);
      EXPECT_TRUE(contains(msg, bad[i].mustMention)) << "case " << i << ": " << msg;
      EXPECT_TRUE(contains(msg, "rank " + std::to_string(rank))) << msg;
    }
    // The message names the rank and what was wrong (checked for the last error).
    EXPECT_TRUE(contains(mtxcomm_get_last_error(comm), "rank " + std::to_string(rank)))
        << mtxcomm_get_last_error(comm);
    EXPECT_TRUE(contains(mtxcomm_get_last_error(comm), "allgather"))
        << mtxcomm_get_last_error(comm);
    EXPECT_EQ(mtxcomm_allreduce(buf, out, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, &rank),
              MTXCOMM_UNSUPPORTED);
    expectUsable(comm, 3);
  });
}

// Alltoall and alltoallv: no in place, any overlap, NULL arrays, overflowing extents, and a
// block to itself that does not fit are rejected on the calling rank; every rank rejecting the
// same call leaves the communicator usable.
TEST(Api, AlltoallArgumentsAreRejectedLocallyAndLeaveTheCommUsable) {
  runRanks(3, [](mtxcomm_comm_t comm, int rank) {
    float buf[64] = {0};
    float out[64] = {0};
    size_t counts[3] = {1, 1, 1}, displs[3] = {0, 1, 2};
    size_t selfBig[3] = {1, 1, 1};
    selfBig[rank] = 2;  // sendcounts[rank] 1, recvcounts[rank] 2
    const size_t huge = std::numeric_limits<size_t>::max() - 1;
    size_t hugeDispls[3] = {0, 1, 2};
    hugeDispls[(rank + 1) % 3] = huge;
    struct Bad {
      std::function<mtxcomm_result_t()> call;
      const char* mustMention;
    };
    std::vector<Bad> bad = {
        {[&] { return mtxcomm_alltoall(buf, buf, 4, MTXCOMM_FLOAT32, comm, nullptr); },
         "alltoall has no in place"},
        {[&] { return mtxcomm_alltoall(buf + 1, buf, 4, MTXCOMM_FLOAT32, comm, nullptr); },
         "sendbuf and recvbuf overlap"},
        {[&] { return mtxcomm_alltoall(nullptr, out, 4, MTXCOMM_FLOAT32, comm, nullptr); },
         "sendbuf is NULL"},
        {[&] { return mtxcomm_alltoall(buf, nullptr, 4, MTXCOMM_FLOAT32, comm, nullptr); },
         "recvbuf is NULL"},
        {[&] {
           return mtxcomm_alltoall(buf, out, 4, static_cast<mtxcomm_datatype_t>(42), comm, nullptr);
         },
         "invalid datatype 42"},
        {[&] {
           return mtxcomm_alltoall(buf, out, std::numeric_limits<size_t>::max() / 8,
                                   MTXCOMM_FLOAT32, comm, nullptr);
         },
         "overflows size_t"},
        {[&] {
           return mtxcomm_alltoallv(buf, nullptr, displs, out, counts, displs, MTXCOMM_FLOAT32,
                                    comm, nullptr);
         },
         "sendcounts is NULL"},
        {[&] {
           return mtxcomm_alltoallv(buf, counts, displs, out, counts, nullptr, MTXCOMM_FLOAT32,
                                    comm, nullptr);
         },
         "rdispls is NULL"},
        {[&] {
           return mtxcomm_alltoallv(buf, counts, displs, out, selfBig, displs, MTXCOMM_FLOAT32,
                                    comm, nullptr);
         },
         "recvcounts["},
        {[&] {
           return mtxcomm_alltoallv(buf, counts, displs, buf + 2, counts, displs, MTXCOMM_FLOAT32,
                                    comm, nullptr);
         },
         "alltoallv has no in place"},
        {[&] {
           return mtxcomm_alltoallv(buf, counts, hugeDispls, out, counts, displs, MTXCOMM_FLOAT32,
                                    comm, nullptr);
         },
         "overflows size_t"},
        {[&] {
           return mtxcomm_alltoallv(nullptr, counts, displs, out, counts, displs, MTXCOMM_FLOAT32,
                                    comm, nullptr);
         },
         "sendbuf is NULL"},
    };
    for (size_t i = 0; i < bad.size(); ++i) {
      EXPECT_EQ(bad[i].call(), MTXCOMM_INVALID_ARGUMENT) << "case " << i;
      std::string msg = mtxcomm_get_last_error(comm);
      EXPECT_TRUE(contains(msg, bad[i].mustMention)) << "case " << i << ": " << msg;
      EXPECT_TRUE(contains(msg, "rank " + std::to_string(rank))) << msg;
      EXPECT_TRUE(contains(msg, "alltoall")) << msg;
    }
    EXPECT_EQ(mtxcomm_alltoall(buf, out, 4, MTXCOMM_FLOAT32, comm, &rank), MTXCOMM_UNSUPPORTED);
    // Count 0 and all-zero alltoallv counts succeed with NULL buffers.
    const size_t zeros[3] = {0, 0, 0};
    EXPECT_EQ(mtxcomm_alltoall(nullptr, nullptr, 0, MTXCOMM_INT8, comm, nullptr), MTXCOMM_SUCCESS);
    EXPECT_EQ(mtxcomm_alltoallv(nullptr, zeros, zeros, nullptr, zeros, zeros, MTXCOMM_INT8, comm,
                                nullptr),
              MTXCOMM_SUCCESS)
        << mtxcomm_get_last_error(comm);
    expectUsable(comm, 3);
  });
}

// Alltoallv counts that disagree between two ranks (rank 0 sends 2 elements to rank 1, which
// expects 1), with the algorithm algo forced; check(rank, result, message) judges each rank.
void mismatchedAlltoallv(
    const char* algo, const std::function<void(int, mtxcomm_result_t, const std::string&)>& check) {
  Config cfg;
  cfg.timeoutSeconds = 30;
  cfg.algo[static_cast<int>(Collective::kAlltoall)] = algo;
  runRanks(
      3,
      [&](mtxcomm_comm_t comm, int rank) {
        float send[8] = {0}, recv[8] = {0};
        size_t sc[3] = {1, 1, 1}, rc[3] = {1, 1, 1}, d[3] = {0, 2, 4};
        if (rank == 0) sc[1] = 2;
        const mtxcomm_result_t r =
            mtxcomm_alltoallv(send, sc, d, recv, rc, d, MTXCOMM_FLOAT32, comm, nullptr);
        check(rank, r, mtxcomm_get_last_error(comm));
      },
      cfg);
}

// Over shared memory every rank compares the whole count table and fails with
// MTXCOMM_INVALID_USAGE naming the pair, at once (no timeout).
TEST(Api, AlltoallvCountMismatchOverShmIsInvalidUsageOnEveryRank) {
  mismatchedAlltoallv("shm", [](int, mtxcomm_result_t r, const std::string& msg) {
    EXPECT_EQ(r, MTXCOMM_INVALID_USAGE) << msg;
    EXPECT_TRUE(contains(msg, "rank 0 sends 2 elements to rank 1")) << msg;
    EXPECT_TRUE(contains(msg, "alltoall")) << msg;
  });
}

// Over the point-to-point transport the receiving rank of the pair sees a size mismatch.
TEST(Api, AlltoallvCountMismatchOverPairwiseIsAnErrorOnTheReceiver) {
  mismatchedAlltoallv("pairwise", [](int rank, mtxcomm_result_t r, const std::string& msg) {
    if (rank == 1) {
      EXPECT_NE(r, MTXCOMM_SUCCESS);
      EXPECT_TRUE(contains(msg, "size mismatch")) << msg;
    }
  });
}

TEST(Api, InPlaceAllgatherOnRankZeroIsValid) {
  // rank 0 passing sendbuf == recvbuf is in place for allgather (recvbuf + 0 * sendcount).
  runRanks(2, [](mtxcomm_comm_t comm, int rank) {
    int v[4] = {0, 0, 0, 0};
    v[rank * 2] = 10 + rank;
    v[rank * 2 + 1] = 20 + rank;
    ASSERT_EQ(mtxcomm_allgather(v + rank * 2, v, 2, MTXCOMM_INT32, comm, nullptr), MTXCOMM_SUCCESS);
    EXPECT_EQ(v[0], 10);
    EXPECT_EQ(v[1], 20);
    EXPECT_EQ(v[2], 11);
    EXPECT_EQ(v[3], 21);
  });
}

TEST(Api, NullHandlesAndOutputPointers) {
  float x = 1;
  EXPECT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, nullptr, nullptr),
            MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_barrier(nullptr), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(mtxcomm_get_last_error(nullptr), "comm is NULL"));
  int r = 0;
  EXPECT_EQ(mtxcomm_comm_rank(nullptr, &r), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_comm_init_from_env(nullptr), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_get_version(nullptr), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_comm_destroy(nullptr), MTXCOMM_SUCCESS);
  int v = 0;
  EXPECT_EQ(mtxcomm_get_version(&v), MTXCOMM_SUCCESS);
  EXPECT_EQ(v, MTXCOMM_VERSION_CODE);
  int built = -1;
  ASSERT_EQ(mtxcomm_get_build_feature("mpi", &built), MTXCOMM_SUCCESS);
#ifdef MTXCOMM_HAVE_MPI
  EXPECT_EQ(built, 1);
#else
  EXPECT_EQ(built, 0);
#endif
  for (const char* f : {"ucx", "cuda", "nccl", "hwloc"}) {
    built = -1;
    EXPECT_EQ(mtxcomm_get_build_feature(f, &built), MTXCOMM_SUCCESS) << f;
    EXPECT_TRUE(built == 0 || built == 1) << f;
  }
  EXPECT_EQ(mtxcomm_get_build_feature("gloo", &built), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(mtxcomm_get_last_error(nullptr), "unknown build feature 'gloo'"));
  EXPECT_EQ(mtxcomm_get_build_feature(nullptr, &built), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_get_build_feature("mpi", nullptr), MTXCOMM_INVALID_ARGUMENT);
  // The NCCL the nccl path loads: its version, or 0 and why (no nccl path, nothing loadable).
  int nccl = -1;
  ASSERT_EQ(mtxcomm_get_build_feature("nccl", &built), MTXCOMM_SUCCESS);
  const mtxcomm_result_t rc = mtxcomm_get_nccl_version(&nccl);
  if (rc == MTXCOMM_SUCCESS) {
    EXPECT_EQ(built, 1);
    EXPECT_GE(nccl, 21300) << "NCCL_VERSION_CODE of 2.13 or newer";
  } else {
    EXPECT_EQ(rc, MTXCOMM_UNSUPPORTED);
    EXPECT_EQ(nccl, 0);
    EXPECT_TRUE(contains(mtxcomm_get_last_error(nullptr), built ? "cannot load NCCL" : "without"))
        << mtxcomm_get_last_error(nullptr);
  }
  EXPECT_EQ(mtxcomm_get_nccl_version(nullptr), MTXCOMM_INVALID_ARGUMENT);
  for (int code = 0; code <= MTXCOMM_UNSUPPORTED; ++code) {
    std::string s = mtxcomm_get_error_string(static_cast<mtxcomm_result_t>(code));
    EXPECT_FALSE(s.empty());
    EXPECT_NE(s, "unknown result code");
  }
  EXPECT_STREQ(mtxcomm_get_error_string(static_cast<mtxcomm_result_t>(99)), "unknown result code");
  EXPECT_EQ(mtxcomm_datatype_size(MTXCOMM_BFLOAT16), 2u);
  EXPECT_EQ(mtxcomm_datatype_size(MTXCOMM_INT16), 2u);
  EXPECT_EQ(mtxcomm_datatype_size(MTXCOMM_UINT16), 2u);
  EXPECT_EQ(mtxcomm_datatype_size(MTXCOMM_BOOL), 1u);
  EXPECT_EQ(mtxcomm_datatype_size(MTXCOMM_NUM_DATATYPES), 0u);
  EXPECT_EQ(mtxcomm_datatype_size(static_cast<mtxcomm_datatype_t>(13)), 0u);
}

// AVG on bool is refused on every collective that takes an op, before any byte moves (the
// receive buffers keep their bytes), with a message naming the op and the datatype, also with
// count 0; every rank refusing leaves the communicator usable. The other ops on bool, and AVG on
// the new integer types, are accepted.
TEST(Api, BoolAvgIsRejectedOnEveryReducingCollective) {
  runRanks(3, [](mtxcomm_comm_t comm, int rank) {
    uint8_t send[6] = {1, 0, 2, 0xff, 0, 1};
    uint8_t recv[6] = {0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a};
    const std::vector<std::function<mtxcomm_result_t(size_t)>> calls = {
        [&](size_t c) {
          return mtxcomm_allreduce(send, recv, c, MTXCOMM_BOOL, MTXCOMM_AVG, comm, nullptr);
        },
        [&](size_t c) {
          return mtxcomm_allreduce(recv, recv, c, MTXCOMM_BOOL, MTXCOMM_AVG, comm, nullptr);
        },
        [&](size_t c) {
          return mtxcomm_reduce(send, recv, c, MTXCOMM_BOOL, MTXCOMM_AVG, 0, comm, nullptr);
        },
        [&](size_t c) {
          return mtxcomm_reduce(send, recv, c, MTXCOMM_BOOL, MTXCOMM_AVG, 2, comm, nullptr);
        },
        [&](size_t c) {
          return mtxcomm_reduce_scatter(send, recv, c, MTXCOMM_BOOL, MTXCOMM_AVG, comm, nullptr);
        },
    };
    const char* names[] = {"allreduce", "allreduce", "reduce", "reduce", "reduce_scatter"};
    for (size_t i = 0; i < calls.size(); ++i) {
      for (size_t count : {size_t{2}, size_t{0}}) {
        EXPECT_EQ(calls[i](count), MTXCOMM_INVALID_ARGUMENT) << "case " << i << " count " << count;
        const std::string msg = mtxcomm_get_last_error(comm);
        EXPECT_TRUE(contains(msg, "avg")) << msg;
        EXPECT_TRUE(contains(msg, "bool")) << msg;
        EXPECT_TRUE(contains(msg, names[i])) << msg;
        EXPECT_TRUE(contains(msg, "rank " + std::to_string(rank))) << msg;
      }
    }
    for (uint8_t b : recv) EXPECT_EQ(b, 0x5a) << "a refused call wrote its receive buffer";
    expectUsable(comm, 3);
    // The same calls with the logical ops go through.
    for (mtxcomm_op_t op : {MTXCOMM_SUM, MTXCOMM_PROD, MTXCOMM_MIN, MTXCOMM_MAX}) {
      EXPECT_EQ(mtxcomm_allreduce(send, recv, 2, MTXCOMM_BOOL, op, comm, nullptr), MTXCOMM_SUCCESS)
          << mtxcomm_get_last_error(comm);
    }
    int16_t s = static_cast<int16_t>(rank == 0 ? -7 : 0);
    EXPECT_EQ(mtxcomm_allreduce(&s, &s, 1, MTXCOMM_INT16, MTXCOMM_AVG, comm, nullptr),
              MTXCOMM_SUCCESS);
    EXPECT_EQ(s, -2);
  });
}

// A forced allgather algorithm is the caller's: the setup's own allgather (the topology,
// before any shared-memory segment exists) takes the automatic choice, with no warning that
// shm cannot run, and the caller's allgathers then run shm.
TEST(Api, ForcedShmAllgatherIsNotWarnedAboutAtSetup) {
  Config cfg;
  cfg.algo[static_cast<int>(Collective::kAllgather)] = "shm";
  ::testing::internal::CaptureStderr();
  runRanks(
      2,
      [](mtxcomm_comm_t comm, int rank) {
        float mine = static_cast<float>(rank + 1), all[2] = {0, 0};
        ASSERT_EQ(mtxcomm_allgather(&mine, all, 1, MTXCOMM_FLOAT32, comm, nullptr),
                  MTXCOMM_SUCCESS);
        EXPECT_EQ(all[0], 1.0f);
        EXPECT_EQ(all[1], 2.0f);
        EXPECT_STREQ(mtxcomm_comm_last_algorithm(comm), "shm");
      },
      cfg);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(contains(err, "cannot run")) << err;
}

TEST(Api, ZeroCountSucceedsWithNullBuffersAndKeepsRanksInStep) {
  runRanks(4, [](mtxcomm_comm_t comm, int rank) {
    EXPECT_EQ(mtxcomm_allreduce(nullptr, nullptr, 0, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
              MTXCOMM_SUCCESS);
    EXPECT_EQ(mtxcomm_broadcast(nullptr, nullptr, 0, MTXCOMM_INT8, 1, comm, nullptr),
              MTXCOMM_SUCCESS);
    EXPECT_EQ(mtxcomm_allgather(nullptr, nullptr, 0, MTXCOMM_INT8, comm, nullptr), MTXCOMM_SUCCESS);
    expectUsable(comm, 4);
  });
}

TEST(Api, RanksThatDisagreeGetAnErrorNotWrongData) {
  // Over shared memory every barrier carries the call: a mismatch is an error naming both.
  runRanks(3, [](mtxcomm_comm_t comm, int rank) {
    std::vector<float> x(rank == 2 ? 20 : 10, 1.0f);
    mtxcomm_result_t rc = mtxcomm_allreduce(x.data(), x.data(), x.size(), MTXCOMM_FLOAT32,
                                            MTXCOMM_SUM, comm, nullptr);
    EXPECT_NE(rc, MTXCOMM_SUCCESS);
    std::string msg = mtxcomm_get_last_error(comm);
    if (rc == MTXCOMM_INVALID_USAGE) {
      EXPECT_TRUE(contains(msg, "disagree")) << msg;
      EXPECT_TRUE(contains(msg, "allreduce(count 20, float32, sum) as call #")) << msg;
    } else {
      EXPECT_EQ(rc, MTXCOMM_REMOTE_ERROR) << msg;  // a peer that saw it first aborted
    }
  });
  // A rank passing count 0 (nothing to move) where the other passes 4: both fail in this call.
  runRanks(2, [](mtxcomm_comm_t comm, int rank) {
    std::vector<float> x(4, 1.0f);
    const mtxcomm_result_t rc = mtxcomm_allreduce(x.data(), x.data(), rank == 0 ? 0 : 4,
                                                  MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
    EXPECT_EQ(rc, MTXCOMM_INVALID_USAGE) << "rank " << rank << ": " << mtxcomm_get_last_error(comm);
  });
  // Without shared memory, counts whose ring segments line up (1M and 512K floats with 1 MiB
  // segments: every message is 1 MiB on both ranks): the message tags carry the call, so the
  // ranks' messages never match and both fail, where the shorter rank returned success with
  // half its result wrong.
  Config cfg;
  cfg.shm = "off";
  cfg.timeoutSeconds = 1;
  cfg.algo[static_cast<int>(Collective::kAllreduce)] = "ring";
  runRanks(
      2,
      [](mtxcomm_comm_t comm, int rank) {
        std::vector<float> x(rank == 0 ? size_t{1} << 20 : size_t{1} << 19, 1.0f);
        const mtxcomm_result_t rc = mtxcomm_allreduce(x.data(), x.data(), x.size(), MTXCOMM_FLOAT32,
                                                      MTXCOMM_SUM, comm, nullptr);
        EXPECT_NE(rc, MTXCOMM_SUCCESS) << "rank " << rank;
        const std::string msg = mtxcomm_get_last_error(comm);
        if (rc == MTXCOMM_TIMEOUT) {
          EXPECT_TRUE(contains(msg, "disagree on this call")) << msg;
        }
      },
      cfg);
  // A call rejected on one rank only: the others must not pair it with that rank's next call.
  runRanks(2, [](mtxcomm_comm_t comm, int rank) {
    float x = 1.0f + rank, y = 10.0f * (rank + 1);
    mtxcomm_op_t op = rank == 0 ? static_cast<mtxcomm_op_t>(9) : MTXCOMM_SUM;
    mtxcomm_result_t first = mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, op, comm, nullptr);
    EXPECT_NE(first, MTXCOMM_SUCCESS);
    mtxcomm_result_t second =
        mtxcomm_allreduce(&y, &y, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
    if (rank == 0) {
      EXPECT_EQ(first, MTXCOMM_INVALID_ARGUMENT);
      // Its second call meets rank 1's first: a disagreement (or rank 1's abort), never 12.
      EXPECT_NE(second, MTXCOMM_SUCCESS) << "y = " << y;
    } else {
      EXPECT_NE(first, MTXCOMM_SUCCESS) << "x = " << x;
    }
  });
}

}  // namespace
}  // namespace mtxcomm
