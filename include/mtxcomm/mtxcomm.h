/*
 * mtxcomm — collective communication for data-parallel deep learning.
 *
 * Stable C API. Opaque handles, NCCL-style argument order, usable from C and C++.
 *
 * Semantics every call keeps
 * --------------------------
 * - Ranks: a communicator of size n numbers its ranks 0..n-1. Every rank of a communicator must
 *   call the same collectives, in the same order, with matching count, datatype, op and root.
 * - Same answer everywhere: every rank receives a bitwise-identical result. For a fixed
 *   algorithm, communicator size and count, the result is the same run after run.
 * - Numbers: float16 and bfloat16 accumulate in float32 and are rounded (to nearest even) once
 *   per element at the end. Integer SUM and PROD wrap (two's complement; int16 and uint16 too).
 *   AVG is SUM followed by a division by the communicator size: for floating types in the
 *   accumulation type (float32 for the 16-bit types), for integer types the wrapped sum divided
 *   truncating toward zero, keeping the datatype. NaN propagates through SUM, PROD, MIN and MAX.
 *   MTXCOMM_ADASUM (adaptive summation, allreduce of floating types only) has its own rules, at
 *   mtxcomm_op_t.
 * - bool (MTXCOMM_BOOL): one byte per element; 0 is false, any other byte is true. Reductions are
 *   logical and write 0 or 1: SUM and MAX are logical OR, PROD and MIN are logical AND. AVG on
 *   bool is MTXCOMM_INVALID_ARGUMENT (naming the op and the datatype), on every collective that
 *   takes an op. Collectives that only move data (broadcast, allgather, alltoall, alltoallv)
 *   copy the bytes as they are.
 * - Counts and offsets are size_t end to end: more than 2^31 elements and more than 2 GiB work.
 *   A count is a number of elements, never bytes.
 * - Buffers (as in NCCL): in place is sendbuf == recvbuf; for allgather, in place is
 *   sendbuf == recvbuf + rank*sendcount (elements); for reduce-scatter, in place is
 *   sendbuf + rank*recvcount == recvbuf; alltoall and alltoallv have no in place. Any other
 *   overlap of send and receive buffers is MTXCOMM_INVALID_ARGUMENT. An out-of-place call
 *   never writes its send buffer.
 * - count 0 succeeds on every rank and keeps the ranks in step (buffers may then be NULL).
 * - Host buffers: stream must be NULL; the call is blocking.
 *
 * Device buffers (builds with CUDA; mtxcomm_info says whether this one has it)
 * ----------------------------------------------------------------------------
 * - A buffer is device memory when cudaPointerGetAttributes reports device or managed memory
 *   (checked only when a CUDA device is visible). sendbuf and recvbuf of one call are both
 *   host or both device memory, on one device: the device of the communicator's first call on
 *   device buffers. Shapes, counts (elements) and in-place rules are those of host buffers.
 *   Every rank of a call passes device buffers, or none does.
 * - stream is a cudaStream_t (NULL: the legacy default stream). The call is stream-ordered: it
 *   starts after the work enqueued earlier on stream and later work on stream sees its result;
 *   it waits through events, never synchronises the device, and returns without waiting for
 *   the GPU where the path allows (nccl, cuda_ipc: enqueue only; host_staging waits on the host
 *   for its own copies from stream). recvbuf is valid once stream reaches the call's end.
 * - The path is chosen per call from values every rank agrees on, and logged at
 *   MTXCOMM_LOG_LEVEL=DEBUG: nccl (every rank on its own GPU), cuda_ipc (ranks on one node,
 *   one process per rank, GPUs shared or not), host_staging (pinned host buffers, any
 *   communicator); MTXCOMM_CUDA_PATH forces one (ucx_cuda is not built yet).
 * - Numbers are those above on every path (the nccl path is not used where NCCL's differ:
 *   16-bit float sums on more than 2 ranks, floating MIN/MAX; nor for int16, uint16 and bool
 *   reductions, which NCCL has no type for).
 * - Errors: a failed CUDA or NCCL call is MTXCOMM_CUDA_ERROR naming the call and CUDA's
 *   message (the communicator is then poisoned, as for a failed peer). Mixed host/device
 *   buffers, buffers on another device, or a stream with host buffers are
 *   MTXCOMM_INVALID_ARGUMENT; a stream without CUDA in the build or without a visible device,
 *   or a forced path that cannot take the call, is MTXCOMM_UNSUPPORTED naming the path and why.
 *   These are refused before any byte moves and leave the communicator usable.
 *
 * Errors
 * ------
 * Every call returns an mtxcomm_result_t. Invalid arguments (NULL buffer with count > 0, bad
 * datatype, op or root, AVG on bool, count * element size overflowing size_t, partial overlap, a
 * stream that does not fit the buffers) are rejected on the calling rank before any byte moves:
 * MTXCOMM_INVALID_ARGUMENT (MTXCOMM_UNSUPPORTED for a stream this build or machine cannot use).
 * When every rank rejects the same call the communicator stays usable. Every call, rejected or not,
 * advances the communicator's call sequence, so if only some ranks reject a call, the others' call
 * never pairs with a later one: it fails (MTXCOMM_INVALID_USAGE over shared memory, MTXCOMM_TIMEOUT
 * or a size mismatch otherwise). Ranks that pass different collectives, counts, datatypes, ops or
 * roots to the same call get MTXCOMM_INVALID_USAGE naming both calls when the call runs over shared
 * memory (every rank on one node): in that call, except a broadcast's root and a reader that agrees
 * with its root, which wait for nobody else and get it at their next call that is not a broadcast,
 * or within 64 broadcasts, and the non-roots of a reduce of at most 256 bytes, which write and
 * return and get it at their next call once the peers have entered theirs (within 64 calls),
 * before that call moves a byte; where no call follows, mtxcomm_comm_destroy returns it. Over a
 * point-to-point transport (across nodes, or MTXCOMM_SHM=off) a call's message tags carry its
 * signature, so ranks that disagree exchange no data: a rank whose messages go to or come from a
 * disagreeing rank fails with MTXCOMM_TIMEOUT after MTXCOMM_TIMEOUT seconds (over TCP its peers
 * then get MTXCOMM_REMOTE_ERROR at once), never with a wrong result (unless two 15-bit hashes
 * collide); a rank that exchanged nothing with one (a third rank of a broadcast whose root it
 * agrees with, a rank passing count 0, which moves nothing) may return MTXCOMM_SUCCESS with the
 * right result for its own call. On any error the receive buffer's contents are undefined (partly
 * written). A peer that dies, or that does not answer within MTXCOMM_TIMEOUT seconds (0.001 to
 * 31536000), turns into MTXCOMM_REMOTE_ERROR or MTXCOMM_TIMEOUT; the communicator is then poisoned:
 * later collectives return MTXCOMM_INVALID_USAGE pointing at the first error; abort or destroy it
 * and build a new one. A rank that fails tells its peers over shared memory and TCP (they fail at
 * once, quoting the root cause); over MPI across nodes they fail at their timeout.
 * mtxcomm_get_last_error() returns the detailed message of the last failed call (it names this
 * rank, the peer, the collective and the algorithm); it is not cleared by later successes. The
 * library never calls abort() or exit().
 *
 * Thread safety: a communicator may be used by one thread at a time for collectives. Distinct
 * communicators may be used concurrently from distinct threads. The point-to-point calls
 * (mtxcomm_isend and the rest, below) may be made from any thread at any time. Safe from any thread
 * at any time, also while another thread is inside a collective on the same communicator:
 * mtxcomm_comm_abort and mtxcomm_comm_destroy (the collective in flight returns promptly with an
 * error naming which; the watchdog pattern of ncclCommAbort), mtxcomm_get_last_error, and the
 * engine-support functions mtxcomm_comm_notify_state and mtxcomm_comm_wakeup
 * (mtxcomm/mtxcomm_engine.h). A handle that was destroyed, or never was one, is rejected with
 * MTXCOMM_INVALID_ARGUMENT (a registry of live communicators), never dereferenced.
 *
 * fork(): a communicator belongs to the process that made it. In a child made by fork(), every
 * call on one of its parent's communicators is MTXCOMM_INVALID_USAGE (naming the fork), and
 * mtxcomm_comm_destroy and mtxcomm_comm_abort forget it without touching what the parent still
 * uses (its peers, sockets and shared segments); the child may make communicators of its own. A
 * child that exits does not finalize an MPI its parent's mtxcomm started. mtxcomm's own locks
 * are held across fork(), but a child forked while another thread was inside an init (a
 * bootstrap's connect, MPI) inherits that work half done: as POSIX says for any multi-threaded
 * process, fork while no other thread is in mtxcomm, or exec in the child.
 */
#ifndef MTXCOMM_MTXCOMM_H_
#define MTXCOMM_MTXCOMM_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define MTXCOMM_API __declspec(dllexport)
#else
#define MTXCOMM_API __attribute__((visibility("default")))
#endif

#define MTXCOMM_VERSION_MAJOR 0
#define MTXCOMM_VERSION_MINOR 1
#define MTXCOMM_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH, as returned by mtxcomm_get_version(). */
#define MTXCOMM_VERSION_CODE \
  (MTXCOMM_VERSION_MAJOR * 10000 + MTXCOMM_VERSION_MINOR * 100 + MTXCOMM_VERSION_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque communicator handle. */
typedef struct mtxcomm_comm* mtxcomm_comm_t;

typedef enum {
  MTXCOMM_SUCCESS = 0,
  MTXCOMM_INVALID_ARGUMENT = 1, /* a bad argument on this rank; nothing moved, comm usable */
  MTXCOMM_INVALID_USAGE = 2,    /* call not allowed now (poisoned or destroyed comm, bad config) */
  MTXCOMM_SYSTEM_ERROR = 3,     /* the OS or the transport failed (socket, memory, MPI) */
  MTXCOMM_REMOTE_ERROR = 4,     /* a peer died, aborted or closed its connection */
  MTXCOMM_TIMEOUT = 5,          /* a peer did not answer within MTXCOMM_TIMEOUT seconds */
  MTXCOMM_CUDA_ERROR = 6,       /* a CUDA call failed */
  MTXCOMM_INTERNAL_ERROR = 7,   /* a bug in mtxcomm: please report it */
  MTXCOMM_UNSUPPORTED = 8       /* valid, but not built in or not supported on this path */
} mtxcomm_result_t;

typedef enum {
  MTXCOMM_INT8 = 0,
  MTXCOMM_UINT8 = 1,
  MTXCOMM_INT32 = 2,
  MTXCOMM_UINT32 = 3,
  MTXCOMM_INT64 = 4,
  MTXCOMM_UINT64 = 5,
  MTXCOMM_FLOAT16 = 6,  /* IEEE 754 binary16 */
  MTXCOMM_BFLOAT16 = 7, /* bfloat16: the upper 16 bits of a binary32 */
  MTXCOMM_FLOAT32 = 8,
  MTXCOMM_FLOAT64 = 9,
  MTXCOMM_INT16 = 10,
  MTXCOMM_UINT16 = 11,
  MTXCOMM_BOOL = 12, /* one byte: 0 false, any other byte true; reductions are logical (above) */
  MTXCOMM_NUM_DATATYPES = 13
} mtxcomm_datatype_t;

/* The values above are part of the ABI: a new datatype is appended, never renumbered. */

/* Reduction ops. Every op applies to every datatype except AVG on MTXCOMM_BOOL (refused with
 * MTXCOMM_INVALID_ARGUMENT); on bool, SUM and MAX are logical OR, PROD and MIN logical AND. */
typedef enum {
  MTXCOMM_SUM = 0,
  MTXCOMM_PROD = 1,
  MTXCOMM_MIN = 2,
  MTXCOMM_MAX = 3,
  MTXCOMM_AVG = 4,
  MTXCOMM_ADASUM = 5, /* adaptive summation: mtxcomm_allreduce of floating types only (below) */
  MTXCOMM_NUM_OPS = 6
} mtxcomm_op_t;

/* MTXCOMM_ADASUM: the adaptive summation of Maleki et al., "Scaling Distributed Training with
 * Adaptive Summation" (MLSys 2021), as Horovod's Adasum op. Only mtxcomm_allreduce takes it, and
 * only for MTXCOMM_FLOAT16, MTXCOMM_BFLOAT16, MTXCOMM_FLOAT32 and MTXCOMM_FLOAT64; any other
 * collective that takes an op (reduce, reduce_scatter) or any other datatype (integers, bool) is
 * MTXCOMM_INVALID_ARGUMENT naming the op and the collective or datatype, before any byte moves
 * (the communicator stays usable). Device buffers: MTXCOMM_UNSUPPORTED.
 * - The pair: adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b over whole
 *   vectors (count elements), a term's coefficient taken as 1 when its norm is 0 (adasum(0, b)
 *   = b). Orthogonal vectors add (a + b); equal vectors give a.
 * - The tree, over n ranks: with q the largest power of two <= n, (1) each rank r >= q sends
 *   its vector to rank r - q, which replaces its own v by adasum(v_{r-q}, v_r); (2) the ranks
 *   r < q run log2(q) levels of recursive doubling: at level k (distance d = 2^k) ranks r and
 *   r ^ d exchange their current vectors and both replace theirs by adasum(lower rank's vector,
 *   higher rank's vector); (3) each rank r >= q receives the result from rank r - q. E.g. on 4
 *   ranks: adasum(adasum(v0, v1), adasum(v2, v3)); on 3: adasum(adasum(v0, v2), v1).
 * - Numbers: per pair, the dot product and both squared norms are accumulated in double (element
 *   i into partial sum i % 8, the 8 added pairwise in a fixed order), the coefficients and the
 *   combination are computed in double, and each level's output is rounded once to the datatype
 *   (float16 and bfloat16 through float32: their elements are widened for the arithmetic only,
 *   and 16-bit vectors travel as 16 bits). Both partners of a pair compute the same operands in
 *   the same order: every rank gets the same bits, and a fixed communicator size and count give
 *   the same bits run after run. An Inf or NaN in any input makes the whole result NaN. count 0
 *   succeeds and moves nothing; on one rank the result is the rank's own vector.
 * - Only the allreduce algorithm "adasum" computes it, whatever MTXCOMM_ALLREDUCE_ALGO names (a
 *   forced other algorithm falls back to it with a warning). */

/* ---- Communicators ---------------------------------------------------------------------- */

/* The world communicator of this job.
 * - Under Open MPI's mpirun (or Slurm's srun with PMI): bootstraps through MPI, initialising
 *   MPI (MPI_THREAD_MULTIPLE requested) if the program has not; data moves over MPI p2p.
 * - Otherwise: reads MTXCOMM_RANK, MTXCOMM_SIZE and MTXCOMM_STORE ("file:PATH" or
 *   "tcp:HOST:PORT", a small rendezvous hosted by rank 0) and connects the ranks over TCP.
 * - With none of these set: a communicator of size 1.
 * MTXCOMM_TRANSPORT=auto|mpi|tcp overrides the choice. Configuration (every MTXCOMM_* variable)
 * is read and validated here; a bad value fails with MTXCOMM_INVALID_USAGE naming the variable.
 * Collective over the job. */
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_init_from_env(mtxcomm_comm_t* comm);

/* MPI_Comm_split semantics: ranks with the same color form one new communicator, ordered by
 * key, then by rank in comm. Any color < 0 (MTXCOMM_UNDEFINED) returns *newcomm = NULL. The new
 * communicator has the parent's configuration and its own shared-memory segment when its ranks
 * share a node. Collective over comm. */
#define MTXCOMM_UNDEFINED (-1)
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_split(mtxcomm_comm_t comm, int color, int key,
                                                mtxcomm_comm_t* newcomm);

/* Frees the communicator. Local, not collective: call it on every rank after the last
 * collective. NULL is accepted and ignored; a handle that is not live (destroyed already) is
 * MTXCOMM_INVALID_ARGUMENT. Over shared memory the peers are told: a peer still waiting on this
 * rank, or entering a later collective, fails at once with MTXCOMM_REMOTE_ERROR naming it.
 * From another thread while a collective runs on comm: that collective ends with an error
 * ("destroyed ... during this call"), then the communicator is freed.
 * A disagreement is never lost at the end: over shared memory, the checks of calls that
 * returned before their peers had entered them (a broadcast's root, a small reduce's non-root)
 * and that no later call ran are run here, waiting (up to MTXCOMM_TIMEOUT) for the peers to
 * enter those calls. Where the ranks disagreed, destroy returns MTXCOMM_INVALID_USAGE with the
 * message the next call would have given ("... found when this rank destroyed the
 * communicator"); where a peer destroyed or died before making such a call,
 * MTXCOMM_REMOTE_ERROR naming it. The communicator is freed either way, and
 * mtxcomm_get_last_error (this handle, or NULL) gives the message. */
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_destroy(mtxcomm_comm_t comm);

/* Marks the communicator failed on this rank and tells the peers it can reach; collectives
 * blocked on this rank elsewhere end with MTXCOMM_REMOTE_ERROR where the transport can tell.
 * Then frees it, like destroy. Never blocks for longer than the transport's close. Safe from a
 * watchdog thread while another thread is blocked in a collective on comm: that collective
 * returns promptly with MTXCOMM_INVALID_USAGE ("aborted ... during this call"). Over TCP
 * (across nodes, or MTXCOMM_SHM=off) a communicator and those split from it share their
 * connections, and an abort of any of them fails them all, on every rank; over shared memory
 * it fails only the aborted one. */
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_abort(mtxcomm_comm_t comm);

/* Says that this process is ending on an error (call it just before exit). Where mtxcomm started
 * MPI (mtxcomm_comm_init_from_env under mpirun), it finalizes MPI at exit, and MPI_Finalize waits
 * for every rank of the job: a rank that failed (a stall, a timeout, an exception) would wait
 * there for as long as another rank stays busy or hangs, and the launcher would never see it
 * exit. After this call the exit skips MPI_Finalize (with a warning), so the process ends at
 * once and the launcher ends the job (mpirun: a rank that exits without MPI_Finalize, or with a
 * non-zero status, aborts the others). mtxcomm's Python packages call it at exit when an
 * exception ended the program (sys.last_value), and offer it as mtxcomm.exiting_on_error().
 * No effect where the program started MPI itself or where MPI is not used. Never fails. */
MTXCOMM_API void mtxcomm_exiting_on_error(void);

MTXCOMM_API mtxcomm_result_t mtxcomm_comm_rank(mtxcomm_comm_t comm, int* rank);
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_size(mtxcomm_comm_t comm, int* size);
/* This rank's index among the communicator's ranks on the same node (ordered by rank), and
 * their number; agreed at init from the ranks' node identities. Local, not collective. */
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_local_rank(mtxcomm_comm_t comm, int* local_rank);
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_local_size(mtxcomm_comm_t comm, int* local_size);

/* ---- Collectives (host buffers: blocking, stream NULL; device buffers: stream-ordered) ---- */

/* recvbuf[i] = op over ranks r of sendbuf_r[i], i in [0, count). Buffers: count elements each. */
MTXCOMM_API mtxcomm_result_t mtxcomm_allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                               mtxcomm_datatype_t datatype, mtxcomm_op_t op,
                                               mtxcomm_comm_t comm, void* stream);

/* recvbuf = root's sendbuf on every rank (count elements). sendbuf is read on root only and may
 * be NULL elsewhere. In place on root: sendbuf == recvbuf. */
MTXCOMM_API mtxcomm_result_t mtxcomm_broadcast(const void* sendbuf, void* recvbuf, size_t count,
                                               mtxcomm_datatype_t datatype, int root,
                                               mtxcomm_comm_t comm, void* stream);

/* root's recvbuf[i] = op over ranks of sendbuf_r[i]. recvbuf is used on root only (may be NULL
 * elsewhere). In place on root: sendbuf == recvbuf. */
MTXCOMM_API mtxcomm_result_t mtxcomm_reduce(const void* sendbuf, void* recvbuf, size_t count,
                                            mtxcomm_datatype_t datatype, mtxcomm_op_t op, int root,
                                            mtxcomm_comm_t comm, void* stream);

/* recvbuf[r*sendcount + i] = sendbuf_r[i]. recvbuf holds size*sendcount elements. */
MTXCOMM_API mtxcomm_result_t mtxcomm_allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                               mtxcomm_datatype_t datatype, mtxcomm_comm_t comm,
                                               void* stream);

/* recvbuf[i] on rank r = op over ranks q of sendbuf_q[r*recvcount + i]. sendbuf holds
 * size*recvcount elements, recvbuf recvcount. */
MTXCOMM_API mtxcomm_result_t mtxcomm_reduce_scatter(const void* sendbuf, void* recvbuf,
                                                    size_t recvcount, mtxcomm_datatype_t datatype,
                                                    mtxcomm_op_t op, mtxcomm_comm_t comm,
                                                    void* stream);

/* Alltoall (MPI_Alltoall semantics): block j of sendbuf (elements [j*count, (j+1)*count)) goes
 * to rank j; block i of recvbuf comes from rank i: recvbuf_r[i*count + k] = sendbuf_i[r*count +
 * k]. sendbuf and recvbuf hold size*count elements each; count is per rank pair and equal on
 * every rank. Every datatype (a copy: no op, no widening). Not in place: sendbuf == recvbuf, and
 * any other overlap of the two buffers, is MTXCOMM_INVALID_ARGUMENT (as in NCCL, which has no
 * in-place alltoall; copy sendbuf aside first). Host buffers only: device buffers are
 * MTXCOMM_UNSUPPORTED. */
MTXCOMM_API mtxcomm_result_t mtxcomm_alltoall(const void* sendbuf, void* recvbuf, size_t count,
                                              mtxcomm_datatype_t datatype, mtxcomm_comm_t comm,
                                              void* stream);

/* Alltoallv (MPI_Alltoallv semantics), counts and displacements in elements, arrays of size
 * entries each (never NULL): rank r sends sendcounts[j] elements from sendbuf + sdispls[j] to
 * rank j and receives recvcounts[i] elements from rank i into recvbuf + rdispls[i]. The call is
 * valid only when sendcounts[j] on rank i equals recvcounts[i] on rank j for every pair; the
 * datatype must be equal on every rank. Checked on the calling rank: NULL arrays, a NULL buffer
 * whose extent (max of displacement + count) is not 0, an extent overflowing size_t, and any
 * overlap of the send and receive extents (no in place) are MTXCOMM_INVALID_ARGUMENT; blocks of
 * recvbuf that overlap each other are undefined. A count mismatch between two ranks is
 * MTXCOMM_INVALID_USAGE on every rank over shared memory (every rank on one node: the ranks
 * exchange their counts first) and over the point-to-point transports a size mismatch on the
 * affected pair (its other ranks may then fail with MTXCOMM_REMOTE_ERROR or MTXCOMM_TIMEOUT).
 * sendcounts[me] must equal recvcounts[me] (the local block is a copy). Host buffers only. */
MTXCOMM_API mtxcomm_result_t mtxcomm_alltoallv(const void* sendbuf, const size_t* sendcounts,
                                               const size_t* sdispls, void* recvbuf,
                                               const size_t* recvcounts, const size_t* rdispls,
                                               mtxcomm_datatype_t datatype, mtxcomm_comm_t comm,
                                               void* stream);

/* Returns on any rank only after every rank has entered it. */
MTXCOMM_API mtxcomm_result_t mtxcomm_barrier(mtxcomm_comm_t comm);

/* ---- Point-to-point (host buffers) ----------------------------------------------------------
 *
 * Tagged, non-blocking sends and receives between two ranks of a communicator, as MPI's
 * MPI_Isend/MPI_Irecv/MPI_Test/MPI_Wait (for frameworks: torch.distributed's send, recv, isend,
 * irecv and batch_isend_irecv).
 * - Shapes and units: buf holds count elements of datatype (count * mtxcomm_datatype_size bytes);
 *   peer is a rank of comm; tag is in [0, MTXCOMM_P2P_MAX_TAG]. Host buffers only.
 * - Matching: a receive matches a send from peer to this rank with the same tag on the same
 *   communicator. Messages from one sender to one receiver with one tag are matched in the order
 *   they were posted (MPI's non-overtaking rule); other tags and peers are independent. User
 *   messages never match the communicator's collectives (they travel in a context of their own).
 * - Sizes: a matched send and receive must have the same byte count (count * element size; the
 *   datatypes may differ). A mismatch fails the receive with MTXCOMM_INVALID_USAGE naming both
 *   byte counts, the peer and the tag; nothing is written to its buffer and the message is
 *   consumed (the next receive matches the next message). The send completes normally.
 * - Any source: a receive may name peer MTXCOMM_ANY_SOURCE (as MPI_ANY_SOURCE; mtxcomm_irecv and
 *   mtxcomm_recv): it takes the first message with its tag from any rank, this one included;
 *   mtxcomm_request_source then says which rank sent it. Per sender the order rule above holds
 *   (a message goes to the oldest receive that matches it, named or any-source); across senders
 *   the order is whichever arrives first. Each peer gets a header receive of that tag posted for
 *   it; one that another peer's message made unnecessary stays posted but idle, and takes that
 *   peer's next message of the tag for the next receive that matches it. Over shared memory a
 *   peer that has left (destroyed its communicator, exited, died) is simply no candidate: the
 *   receive takes another peer's message, and waits until its timeout if every other peer has
 *   left. Limit over the other transports: once a peer has closed its connection (exited,
 *   even after destroying its communicator), a later receive from any source of a tag that has
 *   such a receive toward it fails naming that peer; receive from named peers there.
 * - Self: peer == own rank is allowed: the message is matched within the process (a send with no
 *   receive posted yet is copied aside and completes at once).
 * - count 0 is a message of zero bytes: it is matched and delivered like any other (buf may then
 *   be NULL).
 * - Buffers: mtxcomm_isend and mtxcomm_irecv return at once; the buffer belongs to the library
 *   until the request has completed (mtxcomm_test says done, or mtxcomm_wait returned): do not
 *   write a send buffer or read a receive buffer before.
 * - Progress: made by a thread of the communicator (started at its first point-to-point call)
 *   and by the callers where that costs them no wait: a post starts its operation at once when
 *   no other thread is making progress (a send that fits the shared-memory ring then completes
 *   before mtxcomm_isend returns), mtxcomm_test makes one round, and mtxcomm_wait makes
 *   progress itself for about 100 us (5 us with more ranks than cores) before it sleeps (two
 *   ranks that wait for each other then exchange without a thread hand-over). A posted receive
 *   never waits for an earlier operation, so the exchange "irecv from peer; isend to peer; wait
 *   both" on both ranks works at every size. Where every rank is on one node and shared memory
 *   is on (MTXCOMM_SHM), the messages go through rings of a shared-memory segment of their own
 *   (1 MiB per pair of ranks at 2 ranks, less beyond: about 8 MiB in all; a larger message
 *   streams through); else, or where /dev/shm cannot hold that segment (a warning), over the
 *   communicator's point-to-point transport (MPI, TCP or UCX).
 * - Setup: each communicator (init and split) makes its point-to-point context at creation,
 *   collectively (under MPI an MPI_Comm_create_group; on one node with shared memory, the
 *   rings' segment); nothing is made later.
 * - Errors: invalid arguments (comm not live, a datatype that is not one, peer not in [0, size)
 *   and not MTXCOMM_ANY_SOURCE for a receive,
 *   tag out of range, buf NULL with count > 0, count * element size overflowing size_t, req
 *   NULL) are MTXCOMM_INVALID_ARGUMENT naming what was wrong, before anything is posted; *req is
 *   then NULL. The first failure of the communicator's point-to-point channel - a peer that died
 *   or aborted (MTXCOMM_REMOTE_ERROR), a wait that timed out (MTXCOMM_TIMEOUT), this rank's
 *   mtxcomm_comm_abort or mtxcomm_comm_destroy (MTXCOMM_INVALID_USAGE), a collective of the
 *   communicator that failed - completes every pending request with that error, each message
 *   naming this rank, the peer, send or receive, the tag and the bytes (mtxcomm_get_last_error
 *   of comm, or of NULL once comm is gone); later isend/irecv on the communicator are
 *   MTXCOMM_INVALID_USAGE quoting it. Its collectives are not failed by it (unless the transport
 *   itself failed: a dead peer). A timed-out or failed request's buffer is no longer touched
 *   once the request has completed.
 * - Thread safety: every function here may be called from any thread, also while another thread
 *   runs a collective on the same communicator, and several threads may post, test and wait on
 *   one communicator at once (posts of one thread are ordered as that thread made them). A
 *   request may be tested and waited on by several threads; it is freed once, after completion.
 *   Under MPI this needs MPI_THREAD_MULTIPLE (what mtxcomm asks for when it initialises MPI);
 *   over an MPI the program initialised at a lower level, make point-to-point and collective
 *   calls from one thread at a time.
 *   mtxcomm_comm_destroy and mtxcomm_comm_abort complete the pending requests with an error
 *   (the request handles stay valid until freed). */

#define MTXCOMM_P2P_MAX_TAG 32767 /* MPI's least MPI_TAG_UB */
#define MTXCOMM_ANY_SOURCE (-1)   /* a receive's peer: whichever rank sends (MPI_ANY_SOURCE) */

/* Opaque request handle of one non-blocking send or receive. */
typedef struct mtxcomm_request_s* mtxcomm_request_t;

/* Posts a send of count elements of buf to peer with tag; *req receives the request. */
MTXCOMM_API mtxcomm_result_t mtxcomm_isend(const void* buf, size_t count,
                                           mtxcomm_datatype_t datatype, int peer, int tag,
                                           mtxcomm_comm_t comm, mtxcomm_request_t* req);

/* Posts a receive of count elements into buf from peer with tag; *req receives the request. */
MTXCOMM_API mtxcomm_result_t mtxcomm_irecv(void* buf, size_t count, mtxcomm_datatype_t datatype,
                                           int peer, int tag, mtxcomm_comm_t comm,
                                           mtxcomm_request_t* req);

/* Non-blocking: *done = 1 once req has completed (then the result is the request's:
 * MTXCOMM_SUCCESS or its error, the same at every later test or wait), else *done = 0 and
 * MTXCOMM_SUCCESS. MTXCOMM_INVALID_ARGUMENT for a req or done that is NULL or not live. */
MTXCOMM_API mtxcomm_result_t mtxcomm_test(mtxcomm_request_t req, int* done);

/* Blocks until req completes and returns its result. timeout_seconds <= 0: the communicator's
 * MTXCOMM_TIMEOUT. Past the timeout the communicator's point-to-point channel fails (above):
 * req and every other pending request complete with MTXCOMM_TIMEOUT, and this returns it. */
MTXCOMM_API mtxcomm_result_t mtxcomm_wait(mtxcomm_request_t req, double timeout_seconds);

/* *source = the rank whose message a completed receive took (its peer, or the sender for
 * MTXCOMM_ANY_SOURCE; MTXCOMM_ANY_SOURCE if it failed before a message matched it), or the peer
 * of a send. MTXCOMM_INVALID_USAGE while the request is in flight; MTXCOMM_INVALID_ARGUMENT for
 * a req or source that is NULL or not live. */
MTXCOMM_API mtxcomm_result_t mtxcomm_request_source(mtxcomm_request_t req, int* source);

/* Frees a completed request (NULL is accepted and ignored). A request still in flight is not
 * freed: MTXCOMM_INVALID_USAGE (there is no cancel; wait for it first). A handle that is not
 * live (freed already) is MTXCOMM_INVALID_ARGUMENT. */
MTXCOMM_API mtxcomm_result_t mtxcomm_request_free(mtxcomm_request_t req);

/* Blocking conveniences: post, wait with the communicator's MTXCOMM_TIMEOUT, free. */
MTXCOMM_API mtxcomm_result_t mtxcomm_send(const void* buf, size_t count,
                                          mtxcomm_datatype_t datatype, int peer, int tag,
                                          mtxcomm_comm_t comm);
MTXCOMM_API mtxcomm_result_t mtxcomm_recv(void* buf, size_t count, mtxcomm_datatype_t datatype,
                                          int peer, int tag, mtxcomm_comm_t comm);

/* ---- Errors and version ------------------------------------------------------------------ */

/* A static, short description of the code ("invalid argument", ...). Never NULL. */
MTXCOMM_API const char* mtxcomm_get_error_string(mtxcomm_result_t result);

/* The detailed message of the last failure on comm; with comm NULL, of the last failure on this
 * thread that had no communicator to record it (a failed init, a NULL comm argument). "" if
 * none. Valid until the next call on comm. */
MTXCOMM_API const char* mtxcomm_get_last_error(mtxcomm_comm_t comm);

/* The name of the algorithm (or device path) the last collective on comm used ("shm", "ring",
 * "local" for one rank or count 0, ...; "" before the first). Valid until the next call on
 * comm; NULL comm gives "". For timelines and logs. */
MTXCOMM_API const char* mtxcomm_comm_last_algorithm(mtxcomm_comm_t comm);

/* The flight recorder (MTXCOMM_FLIGHT_RECORDER calls per communicator, on by default): each
 * rank keeps its last calls (kind, count, datatype, op, root, algorithm, transport, a label,
 * state, the peer a call waits on, times). A timeout, a peer's failure or a disagreement (any
 * collective failing with MTXCOMM_TIMEOUT, MTXCOMM_REMOTE_ERROR or MTXCOMM_INVALID_USAGE after
 * it started), SIGUSR1 (unless the program handles or ignores SIGUSR1 itself), or
 * mtxcomm_comm_dump_flight_recorder writes every communicator's record of the process as JSON
 * to MTXCOMM_FLIGHT_RECORDER_DIR (one file per communicator and rank, mode 0600) and asks the
 * node's other ranks to write theirs; `mtxcomm_info --why-stuck DIR` merges them and names the
 * rank the job waits for, the first call where the ranks differ and who waits on whom.
 *
 * mtxcomm_comm_set_call_label: the name the record gives this rank's next collective on comm
 * (a framework's tensor names; NULL or "" for none; cut to 63 bytes). The thread that makes the
 * calls. */
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_set_call_label(mtxcomm_comm_t comm, const char* label);

/* Writes the flight records of this process now, with reason (e.g. an engine's stall error),
 * and asks comm's other ranks on this node to write theirs. The folder is copied to dir (len
 * bytes, NUL-terminated; "" when nothing was written: the recorder is off, or the folder is not
 * this user's own, which is logged). MTXCOMM_INVALID_ARGUMENT for NULL reason or dir, or a dir
 * too short. Any thread. */
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_dump_flight_recorder(mtxcomm_comm_t comm,
                                                               const char* reason, char* dir,
                                                               size_t len);

/* *version = MTXCOMM_VERSION_CODE of the library actually loaded. */
MTXCOMM_API mtxcomm_result_t mtxcomm_get_version(int* version);

/* Whether this build of the library has a component: feature is one of "mpi" (the MPI
 * bootstrap and transport), "ucx" (the UCX transport, loaded on use), "cuda" (device buffers),
 * "nccl" (the NCCL device path), "hwloc" (topology from hwloc). *built is set to 1 or 0.
 * MTXCOMM_INVALID_ARGUMENT for a NULL argument or another name (mtxcomm_get_last_error(NULL)
 * names it). Built is not usable: UCX, for instance, may still fail to load at init. */
MTXCOMM_API mtxcomm_result_t mtxcomm_get_build_feature(const char* feature, int* built);

/* *version = NCCL_VERSION_CODE (major*10000 + minor*100 + patch) of the NCCL the nccl device path
 * loads in this process (loading it now if no device call has: MTXCOMM_NCCL_LIBRARY, the
 * loader's search, the build-time directory; docs/gpus.md). MTXCOMM_UNSUPPORTED, *version = 0,
 * when this build has no nccl path or NCCL cannot be loaded (mtxcomm_get_last_error(NULL) says
 * why); MTXCOMM_INVALID_ARGUMENT for a NULL version. */
MTXCOMM_API mtxcomm_result_t mtxcomm_get_nccl_version(int* version);

/* The effective value of configuration variable name ("MTXCOMM_FUSION_BYTES", ...), validated
 * and normalised (bytes and seconds as plain numbers), NUL-terminated into value[0, len).
 * MTXCOMM_INVALID_ARGUMENT: unknown name or value too short; MTXCOMM_INVALID_USAGE: the
 * environment holds an invalid value (the last error names it). For framework bindings. */
MTXCOMM_API mtxcomm_result_t mtxcomm_config_get(const char* name, char* value, size_t len);

/* Size in bytes of one element of datatype, 0 if datatype is not valid. */
MTXCOMM_API size_t mtxcomm_datatype_size(mtxcomm_datatype_t datatype);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MTXCOMM_MTXCOMM_H_ */
