// alltoall / pairwise: n-1 exchange steps, at step k rank r sends its block for r+k and receives
// the block of r-k; the own block is a local copy. Also alltoallv (per-pair counts).
//
// Accepts: any rank count n >= 2, alltoall (count per pair) and alltoallv (counts and
//   displacements per peer; each message is posted also when empty, so a count that two ranks
//   disagree on is the transport's size mismatch, never a hang).
// Steps: step 0 copies sendbuf block r to recvbuf block r; step k = 1..n-1 sends block
//   (r+k) mod n to rank (r+k) mod n and receives block (r-k) mod n from rank (r-k) mod n, the
//   send and the receive posted together (patterns::pairwiseSendPeer / pairwiseRecvPeer).
// Bytes on the wire per rank: (n-1) blocks each way in n-1 rounds, every block sent once and
//   directly: optimal bytes, n-1 latencies (best for medium and large blocks).
// Example, n = 3, rank r's blocks r0 r1 r2 (block j for rank j): step 1: r0 sends 01 -> r1,
//   r1 sends 12 -> r2, r2 sends 20 -> r0; step 2: r0 sends 02 -> r2, r1 sends 10 -> r0,
//   r2 sends 21 -> r1. Rank 0 ends with 00 10 20.
// Source: Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations
//   in MPICH", IJHPCA 2005 (pairwise exchange); MPICH MPIR_Alltoall_intra_pairwise, Open MPI
//   ompi_coll_base_alltoall_intra_pairwise.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/schedule.h"

namespace mtxcomm {

void buildAlltoallPairwise(const CollArgs& args, int rank, int n, const AlgoParams&, Schedule& s) {
  const size_t es = args.elemSize;
  const char* send = static_cast<const char*>(args.sendbuf);
  char* recv = static_cast<char*>(args.recvbuf);
  const bool v = args.isAlltoallv();
  // Byte offset and length of block j on either side.
  auto sendAt = [&](int j) { return (v ? args.sdispls[j] : j * args.count) * es; };
  auto sendLen = [&](int j) { return (v ? args.sendcounts[j] : args.count) * es; };
  auto recvAt = [&](int j) { return (v ? args.rdispls[j] : j * args.count) * es; };
  auto recvLen = [&](int j) { return (v ? args.recvcounts[j] : args.count) * es; };
  s.copy(recv + recvAt(rank), send + sendAt(rank), sendLen(rank));
  s.endStep();
  for (int k = 1; k < n; ++k) {
    const int to = patterns::pairwiseSendPeer(rank, k, n);
    const int from = patterns::pairwiseRecvPeer(rank, k, n);
    s.send(to, send + sendAt(to), sendLen(to));
    s.recv(from, recv + recvAt(from), recvLen(from));
    s.endStep();
  }
}

}  // namespace mtxcomm
