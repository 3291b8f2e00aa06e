// barrier / dissemination: at round k every rank signals rank + 2^k and waits for rank - 2^k.
//
// Accepts: any rank count n >= 2.
// Steps: ceil(log2 n) rounds, each a one-byte message out and one in. After round k a rank has
//   (transitively) heard from 2^(k+1) ranks, so after the last round from all of them.
// Example, n = 3: round 0: 0->1, 1->2, 2->0; round 1: 0->2, 1->0, 2->1.
// Source: Hensgen, Finkel & Manber, "Two algorithms for barrier synchronization", IJPP 1988;
//   MPICH MPIR_Barrier_intra_dissemination.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/schedule.h"

namespace mtxcomm {

void buildBarrierDissemination(const CollArgs&, int rank, int n, const AlgoParams&, Schedule& s) {
  char* token = s.scratch(2);
  token[0] = 1;
  for (int d = 1; d < n; d *= 2) {
    s.send(patterns::mod(rank + d, n), token, 1);
    s.recv(patterns::mod(rank - d, n), token + 1, 1);
    s.endStep();
  }
}

}  // namespace mtxcomm
