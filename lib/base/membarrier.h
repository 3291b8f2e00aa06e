// membarrier(2): a full memory barrier on other threads' cores, issued by the rare side of an
// asymmetric Dekker so that the frequent side needs only a compiler barrier (Linux 4.14+; the
// frequent side keeps its fence where the kernel lacks the command).
//
// Pattern (both commands): the frequent side stores A, then (compiler barrier only) loads B;
// the rare side stores B, issues the barrier, then loads A. After the barrier returns, either
// the frequent side's store of A is visible to the rare side, or its load of B sees the rare
// side's store. Source: membarrier(2); P. McKenney, "Memory Barriers: a Hardware View".
#ifndef MTXCOMM_LIB_MEMBARRIER_H_
#define MTXCOMM_LIB_MEMBARRIER_H_

namespace mtxcomm {

// Registers this process for MEMBARRIER_CMD_GLOBAL_EXPEDITED (once per process; later calls
// return the first answer). True when registered: other processes' globalMembarrier() then
// reaches this process's threads.
bool registerGlobalMembarrier();
// A full barrier on every core running a thread of a registered process (any process).
void globalMembarrier();

// Registers this process for MEMBARRIER_CMD_PRIVATE_EXPEDITED (once per process, as above).
bool registerPrivateMembarrier();
// A full barrier on every core running a thread of this process. False when the kernel
// refused (not registered: a forked child, for instance); the caller must then not rely on it.
bool privateMembarrier();

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_MEMBARRIER_H_
