/*
 * mtxcomm — the C functions for progress engines over a communicator: the framework bindings'
 * engine (bindings/common/) and any other that runs collectives on behalf of a framework. A
 * program that only calls collectives needs mtxcomm/mtxcomm.h alone.
 *
 * Part of the stable C API (the same library, libmtxcomm, and the same rules: the header
 * comment of mtxcomm/mtxcomm.h): the number of threads a rank's work should use, notifications
 * that wake an engine sleeping while it has nothing to do, and the cycle an engine is in.
 */
#ifndef MTXCOMM_MTXCOMM_ENGINE_H_
#define MTXCOMM_MTXCOMM_ENGINE_H_

#include <stdint.h>

#include "mtxcomm/mtxcomm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* This rank's share of its node's cores, the number of threads its work should use: the node's
 * cores divided by the ranks on the node (at least 1), or the cores the launcher bound this
 * process to. mtxcomm_comm_init_from_env binds an unbound rank to its share unless
 * MTXCOMM_PLACEMENT=off (README, "Placement"). Local. */
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_cpu_share(mtxcomm_comm_t comm, int* cores);

/* ---- Notifications, for event-driven progress engines (framework bindings) --------------- *
 * An engine that runs collectives on behalf of a framework sleeps while it has nothing to do
 * and must be woken when any rank has work. mtxcomm_comm_notify(comm, cycle) asks every other
 * rank to join the engine's cycle number `cycle` (the highest asked is kept);
 * mtxcomm_comm_wait_notify sleeps until the rank's state differs from *seen — a peer's
 * notify, or mtxcomm_comm_wakeup called by any thread of this process — or timeout_s passes,
 * and stores the new state in *now. Take *seen with mtxcomm_comm_notify_state before checking
 * your own work queue, so that no wakeup is lost. notify and wait_notify: the thread that uses
 * comm; notify_state and wakeup: any thread. Available where the communicator's ranks share a
 * node and its shared-memory segment; MTXCOMM_UNSUPPORTED otherwise (then poll).
 * mtxcomm_comm_wait_notify returns MTXCOMM_REMOTE_ERROR when a peer aborted or its process died
 * (without destroying its communicator) while this rank slept: no peer will notify it, so run
 * the next exchange, whose error names that peer. Sleeps are checked every 200 ms.
 * mtxcomm_comm_set_idle(comm, 1) before sleeping tells the peers that nothing of this rank's own
 * waits for them (its next collective will come from its own submission, which wakes it with
 * mtxcomm_comm_wakeup): a peer's notify then wakes it only if the notifier's next collective
 * has waited 1 ms for it, and not at all when this rank joins that collective first. Woken at once,
 * an engine with nothing to do would take the core from the framework thread about to submit. 0
 * (the default): every notify wakes it at once. The thread that uses comm. */
typedef struct {
  uint64_t token; /* changes with every wakeup or notification */
  uint64_t cycle; /* the highest cycle a peer asked this rank to join */
} mtxcomm_notify_state_t;
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_notify(mtxcomm_comm_t comm, uint64_t cycle);
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_notify_state(mtxcomm_comm_t comm,
                                                       mtxcomm_notify_state_t* state);
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_wait_notify(mtxcomm_comm_t comm,
                                                      const mtxcomm_notify_state_t* seen,
                                                      double timeout_s,
                                                      mtxcomm_notify_state_t* now);
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_wakeup(mtxcomm_comm_t comm);
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_set_idle(mtxcomm_comm_t comm, int idle);
/* mtxcomm_comm_enter_cycle(comm, cycle): this rank is entering cycle `cycle` (its first
 * collective follows); no peer is woken. mtxcomm_comm_notify implies it. The thread that uses
 * comm. mtxcomm_comm_peers_in_cycle: how many other ranks have entered cycle `cycle` or a later
 * one, in *count; spin != 0 first waits for all of them up to the collectives' spin (about
 * 22 us, never sleeping). With *count == size - 1 a thread that starts that cycle's collective
 * now waits for no peer's arrival: an engine may run a small cycle on the submitting thread
 * instead of handing it to its own. Any thread. */
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_enter_cycle(mtxcomm_comm_t comm, uint64_t cycle);
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_peers_in_cycle(mtxcomm_comm_t comm, uint64_t cycle,
                                                         int spin, int* count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MTXCOMM_MTXCOMM_ENGINE_H_ */
