// Runs a Schedule over a Transport: for each step, posts its receives and sends, waits for
// them (deadline: now + timeout, renewed per step), then runs its local reduces, adasum
// combinations and copies.
// A step marked overlapPrevious is posted before the previous step's local operations run.
#ifndef MTXCOMM_LIB_EXECUTOR_H_
#define MTXCOMM_LIB_EXECUTOR_H_

#include "algos/schedule.h"
#include "transports/transport.h"

namespace mtxcomm {

// Throws what the transport throws, prefixed with "step K of N: ".
void executeSchedule(const Schedule& schedule, Transport& transport, int tag,
                     double timeoutSeconds);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_EXECUTOR_H_
