// Rank arithmetic on its own: ring neighbours, block partitions, the power-of-two fold and
// binomial trees, checked against brute-force properties.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "algos/patterns.h"

namespace mtxcomm {
namespace {

using namespace patterns;

TEST(Patterns, RingNeighbours) {
  EXPECT_EQ(ringRight(0, 1), 0);
  EXPECT_EQ(ringLeft(0, 3), 2);
  EXPECT_EQ(ringRight(2, 3), 0);
  for (int n = 1; n <= 17; ++n)
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ringLeft(ringRight(r, n), n), r);
      EXPECT_EQ(mod(r - n, n), r);
    }
}

// Pairwise exchange: at step k the peer r sends to receives from r; over steps 1..n-1 every
// rank sends to every other rank exactly once.
TEST(Patterns, PairwiseExchangeMeetsEveryPairOnce) {
  for (int n = 1; n <= 17; ++n)
    for (int r = 0; r < n; ++r) {
      std::set<int> to, from;
      for (int k = 1; k < n; ++k) {
        const int q = pairwiseSendPeer(r, k, n);
        EXPECT_EQ(pairwiseRecvPeer(q, k, n), r) << "n " << n << " r " << r << " k " << k;
        EXPECT_NE(q, r);
        to.insert(q);
        from.insert(pairwiseRecvPeer(r, k, n));
      }
      EXPECT_EQ(static_cast<int>(to.size()), n - 1);
      EXPECT_EQ(static_cast<int>(from.size()), n - 1);
    }
}

TEST(Patterns, BlocksCoverExactlyAndDifferByAtMostOne) {
  for (size_t count : {0ul, 1ul, 2ul, 7ul, 16ul, 17ul, 1000003ul}) {
    for (int n = 1; n <= 16; ++n) {
      size_t next = 0, lo = count, hi = 0;
      for (int b = 0; b < n; ++b) {
        EXPECT_EQ(blockOffset(count, n, b), next) << "count " << count << " n " << n;
        next += blockCount(count, n, b);
        lo = std::min(lo, blockCount(count, n, b));
        hi = std::max(hi, blockCount(count, n, b));
      }
      EXPECT_EQ(next, count);
      EXPECT_EQ(blockOffset(count, n, n), count);
      EXPECT_LE(hi - lo, 1u);
    }
  }
  EXPECT_EQ(blockCount(10, 4, 0), 3u);
  EXPECT_EQ(blockCount(10, 4, 3), 2u);
  EXPECT_EQ(blockOffset(10, 4, 2), 6u);
}

TEST(Patterns, PowerOfTwo) {
  EXPECT_TRUE(isPowerOfTwo(1));
  EXPECT_TRUE(isPowerOfTwo(16));
  EXPECT_FALSE(isPowerOfTwo(12));
  EXPECT_FALSE(isPowerOfTwo(0));
  EXPECT_EQ(powerOfTwoFloor(1), 1);
  EXPECT_EQ(powerOfTwoFloor(7), 4);
  EXPECT_EQ(powerOfTwoFloor(8), 8);
  EXPECT_EQ(powerOfTwoFloor(13), 8);
}

TEST(Patterns, FoldIsABijectionOntoThePowerOfTwoGroup) {
  for (int n = 1; n <= 33; ++n) {
    const int p2 = powerOfTwoFloor(n);
    std::set<int> newranks;
    int sittingOut = 0;
    for (int r = 0; r < n; ++r) {
      int nr = foldNewRank(r, n);
      if (nr < 0) {
        ++sittingOut;
        // A rank that sits out hands its data to the rank above it, which participates.
        EXPECT_GE(foldNewRank(r + 1, n), 0) << "n " << n << " r " << r;
        continue;
      }
      EXPECT_LT(nr, p2);
      EXPECT_EQ(foldOldRank(nr, n), r);
      newranks.insert(nr);
    }
    EXPECT_EQ(static_cast<int>(newranks.size()), p2) << "n " << n;
    EXPECT_EQ(sittingOut, n - p2);
  }
  // n = 6: p2 = 4, r = 2: ranks 0 and 2 sit out; 1 -> 0, 3 -> 1, 4 -> 2, 5 -> 3.
  EXPECT_EQ(foldNewRank(0, 6), -1);
  EXPECT_EQ(foldNewRank(1, 6), 0);
  EXPECT_EQ(foldNewRank(2, 6), -1);
  EXPECT_EQ(foldNewRank(3, 6), 1);
  EXPECT_EQ(foldNewRank(4, 6), 2);
  EXPECT_EQ(foldNewRank(5, 6), 3);
}

// Adasum's fold: the ranks >= q pair with r - q, each rank < q with at most one of them, and the
// pairing is symmetric (brute force against the definition).
TEST(Patterns, UpperFoldPairsEachUpperRankWithRMinusQ) {
  for (int n = 1; n <= 33; ++n) {
    const int q = powerOfTwoFloor(n);
    for (int r = 0; r < n; ++r) {
      const int peer = upperFoldPeer(r, n);
      int want = -1;
      for (int s = 0; s < n; ++s) {
        if (s != r && (s == r + q || s == r - q)) want = s;
      }
      EXPECT_EQ(peer, want) << "n " << n << " r " << r;
      if (peer >= 0) {
        EXPECT_EQ(upperFoldPeer(peer, n), r) << "n " << n << " r " << r;
        EXPECT_TRUE((r < q) != (peer < q)) << "n " << n << " r " << r;
      }
    }
  }
  // n = 6: q = 4; 4 -> 0, 5 -> 1; 2 and 3 have no partner.
  EXPECT_EQ(upperFoldPeer(4, 6), 0);
  EXPECT_EQ(upperFoldPeer(5, 6), 1);
  EXPECT_EQ(upperFoldPeer(0, 6), 4);
  EXPECT_EQ(upperFoldPeer(2, 6), -1);
  EXPECT_EQ(upperFoldPeer(3, 8), -1);
}

TEST(Patterns, BinomialTreeReachesEveryRankOnce) {
  for (int n = 1; n <= 33; ++n) {
    std::vector<int> parentOf(n, -2);
    parentOf[0] = -1;
    for (int v = 0; v < n; ++v) {
      for (int m = binomialLowBit(v, n) / 2; m >= 1; m /= 2) {
        if (v + m >= n) continue;
        EXPECT_EQ(parentOf[v + m], -2) << "vrank " << v + m << " has two parents, n " << n;
        parentOf[v + m] = v;
        EXPECT_EQ(binomialParent(v + m), v);
      }
    }
    for (int v = 0; v < n; ++v) EXPECT_NE(parentOf[v], -2) << "vrank " << v << " unreached";
  }
  EXPECT_EQ(binomialLowBit(0, 5), 8);
  EXPECT_EQ(binomialLowBit(6, 8), 2);
  EXPECT_EQ(binomialParent(6), 4);
}

}  // namespace
}  // namespace mtxcomm
