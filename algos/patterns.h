// Pure rank arithmetic shared by the algorithms: ring neighbours, block partitions, the fold
// of a non-power-of-two rank count into a power of two, binomial trees. No I/O, no state:
// unit-tested on their own (tests/test_patterns.cc).
#ifndef MTXCOMM_ALGOS_PATTERNS_H_
#define MTXCOMM_ALGOS_PATTERNS_H_

#include <cstddef>

namespace mtxcomm {
namespace patterns {

inline int mod(int a, int n) { return ((a % n) + n) % n; }
inline int ringRight(int rank, int n) { return mod(rank + 1, n); }
inline int ringLeft(int rank, int n) { return mod(rank - 1, n); }

// Splits count elements into n blocks as evenly as possible; the first count % n blocks get
// one element more. Block i starts at blockOffset(count, n, i) and holds blockCount elements.
inline size_t blockCount(size_t count, int n, int i) {
  return count / n + (static_cast<size_t>(i) < count % n ? 1 : 0);
}
inline size_t blockOffset(size_t count, int n, int i) {
  size_t q = count / n, r = count % n;
  size_t ui = static_cast<size_t>(i);
  return ui * q + (ui < r ? ui : r);
}

// Pairwise exchange (alltoall): at step k = 1..n-1 rank r sends to r+k and receives from r-k,
// so over the n-1 steps every ordered pair (r, q != r) meets exactly once, and the rank r
// sends to at step k is the one that receives from r at step k.
inline int pairwiseSendPeer(int rank, int step, int n) { return mod(rank + step, n); }
inline int pairwiseRecvPeer(int rank, int step, int n) { return mod(rank - step, n); }

inline bool isPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }
// Largest power of two <= n (n >= 1).
inline int powerOfTwoFloor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// Fold of n ranks onto p2 = powerOfTwoFloor(n) (as in MPICH's recursive doubling and
// Rabenseifner): with r = n - p2 extra ranks, among ranks [0, 2r) each even rank hands its data
// to the odd rank above it and sits out; the odd ones and the ranks >= 2r form the
// power-of-two group, renumbered 0..p2-1.
// foldNewRank: the rank in the power-of-two group, or -1 for a rank that sits out.
inline int foldNewRank(int rank, int n) {
  int r = n - powerOfTwoFloor(n);
  if (rank < 2 * r) return (rank % 2 == 1) ? rank / 2 : -1;
  return rank - r;
}
// foldOldRank: inverse of foldNewRank for newrank in [0, p2).
inline int foldOldRank(int newrank, int n) {
  int r = n - powerOfTwoFloor(n);
  return newrank < r ? 2 * newrank + 1 : newrank + r;
}

// The fold of n ranks onto q = powerOfTwoFloor(n) by the upper ranks (Adasum's tree): each
// rank r >= q hands its vector to r - q, the ranks [0, q) run the tree, and r - q hands the
// result back. upperFoldPeer: the rank's partner in that fold (r - q for r >= q, r + q for
// r < n - q), or -1 for a rank with none.
inline int upperFoldPeer(int rank, int n) {
  const int q = powerOfTwoFloor(n);
  if (rank >= q) return rank - q;
  return rank + q < n ? rank + q : -1;
}

// Binomial tree rooted at vrank 0 (vrank = (rank - root) mod n), as in MPICH's broadcast:
// the parent of vrank v > 0 is v with its lowest set bit cleared; binomialLowBit(v) is that bit
// (for v == 0: the smallest power of two >= n). The subtree of v covers vranks
// [v, min(v + binomialLowBit(v), n)); v's children are v + m for powers of two
// m < binomialLowBit(v) with v + m < n.
inline int binomialLowBit(int vrank, int n) {
  if (vrank == 0) {
    int m = 1;
    while (m < n) m *= 2;
    return m;
  }
  return vrank & -vrank;
}
inline int binomialParent(int vrank) { return vrank & (vrank - 1); }

}  // namespace patterns
}  // namespace mtxcomm

#endif  // MTXCOMM_ALGOS_PATTERNS_H_
