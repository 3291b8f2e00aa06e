// The binding's engine: one background thread per process that owns the world communicator and
// runs every collective a framework submits, in the same order on every rank.
//
// Frameworks issue collectives from many threads in an order that differs between ranks
// (TensorFlow runs independent ops in any order). The engine makes the order agree, as Horovod's
// controller does (Sergeev & Del Balso, "Horovod: fast and easy distributed deep learning in
// TensorFlow", 2018), but without a coordinator rank:
//   1. a cycle is one exchange (an allgather of a small fixed-size slot per rank) of the
//      requests each rank submitted since its last cycle; a request the ranks agreed on before
//      travels as one bit of the response cache (negotiation.h);
//   2. every rank keeps the same table, name -> per-rank FIFO of requests; the k-th request of a
//      name on one rank pairs with the k-th of the same name on every other rank;
//   3. a name whose FIFO head is present on every active rank is ready; ready requests run in
//      the order their last rank submitted them (a global sequence all ranks agree on), after a
//      check that the ranks agree on kind, op, root, dtypes and shapes (else every rank gets the
//      same error naming the tensor and the ranks);
//   4. consecutive ready allreduces with the same op are packed per dtype into one buffer of up
//      to MTXCOMM_FUSION_BYTES (tensor fusion, executor.h) and reduced by one collective.
// No idle polling: where the ranks share a node (the shared-memory segment), an engine with
// nothing to do sleeps on a futex; a rank that submits work asks every rank to join its next
// cycle (mtxcomm_comm_notify), so a cycle starts promptly everywhere and nobody waits for a
// peer's next wake-up. A rank so asked that has nothing pending waits up to MTXCOMM_CYCLE_TIME
// (at most 1 ms) for its own submission before it joins (a cycle without it makes nothing ready),
// so ranks that arrive a little apart agree in one cycle instead of two. Without a segment (ranks
// on several nodes, MTXCOMM_SHM=off) an idle engine cycles every MTXCOMM_CYCLE_TIME. A world of
// one rank never wakes while idle. A small request runs its cycle on the submitting thread
// (Entry::mayRunInline) where no peer keeps it waiting there: in a world of one rank, or where
// every peer has entered the next cycle, at once or within the collectives' spin (about 22 us)
// after this rank asked them (mtxcomm_comm_peers_in_cycle); otherwise the engine's thread runs
// it.
//
// Stalls end: a name some ranks submitted and others did not fails on the ranks that submitted
// it after MTXCOMM_STALL_TIMEOUT, naming it and the missing ranks (rank 0 decides, through its
// next message, so every rank fails the same requests); MTXCOMM_STALL_WARNING warns earlier.
// Join: a rank out of data submits a join; until every rank has joined, the others' collectives
// proceed with the joined ranks standing in — zeros for allreduce and reduce-scatter, no rows
// for allgather, received and dropped for broadcast (a joined root is an error) — and the join
// returns, on every rank, the last rank to join.
// A rank that calls shutdown (or exits through it) ends the engine on every rank in the same
// cycle: requests still waiting fail with an error naming that rank. A communication failure
// fails every waiting and later request with the library's message.
//
// The engine's parts: request.h (what is submitted, its wire format), entry.h (a request with its
// buffers and callbacks), negotiation.h (the table every rank keeps, the response cache),
// executor.h (fusion and the collectives), timeline.h (MTXCOMM_TIMELINE), engine_internal.h (the
// Engine class), engine.cc (the thread: submissions, sleeping and waking, the inline cycle) and
// engine_cycle.cc (one cycle: the exchange of requests, running what is ready, stalls). None
// includes framework headers: the framework side (bindings/tensorflow/, bindings/python/ for the
// array API, a future bindings/torch/) provides buffers and callbacks through Entry.
#ifndef MTXCOMM_BINDINGS_COMMON_ENGINE_H_
#define MTXCOMM_BINDINGS_COMMON_ENGINE_H_

#include <cstdint>

#include "bindings/common/entry.h"
#include "bindings/common/request.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm::binding {

// The process-wide engine. All functions are thread-safe.
// Creates the world communicator (mtxcomm_comm_init_from_env) and starts the thread; collective
// across ranks. A second call while running is a no-op.
Status init();
// Ends the engine on every rank (see above) and destroys the communicator. Idempotent. Returns
// what the destroy returned: MTXCOMM_INVALID_USAGE where a check an earlier call left pending
// (a broadcast returns before its peers have entered it) finds the ranks disagreeing there.
Status shutdown();
bool isInitialized();
// Rank facts of the world communicator; -1 when not initialised.
int rank();
int size();
int localRank();
int localSize();
// This rank's share of its node's cores (mtxcomm_comm_cpu_share); -1 when not initialised.
int cpuShare();
// The world communicator while the engine runs, else null: for point-to-point calls beside
// the engine (mtxcomm_isend/irecv may be called from any thread while the engine runs
// collectives on it). The handle is destroyed by shutdown: later calls on it fail with
// MTXCOMM_INVALID_ARGUMENT (the registry of live handles), they never touch freed memory.
mtxcomm_comm_t worldComm();
// Queues an entry. When the engine is not running or has failed, done is called at once with the
// error.
void enqueue(Entry entry);
// Library collectives the engine has executed for submitted requests (not counting its own
// negotiation), for tests and profiling.
uint64_t collectiveCount();
// Cycles that a submitting thread ran itself (Entry::mayRunInline) since the process started,
// for tests and profiling.
uint64_t inlineCycleCount();

}  // namespace mtxcomm::binding

#endif  // MTXCOMM_BINDINGS_COMMON_ENGINE_H_
