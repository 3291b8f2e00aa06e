// `mtxcomm_info --why-stuck DIR`: reads the flight records the ranks wrote to DIR
// (lib/comm/flight_recorder.h, one JSON file per communicator and rank) and says, per
// communicator, in one paragraph: which rank is behind and the last call every rank completed;
// the first call where the ranks differ (kind, count, datatype, op, root or name); and which
// ranks wait on whom. As PyTorch's `torch.distributed.flight_recorder` analyser does for NCCL
// dumps, from the records alone: no rank need still be running.
#ifndef MTXCOMM_LIB_COMM_WHY_STUCK_H_
#define MTXCOMM_LIB_COMM_WHY_STUCK_H_

#include <string>

namespace mtxcomm {

// The explanation of the records in dir. Throws mtxcomm::Error(MTXCOMM_INVALID_ARGUMENT)
// naming dir when it holds no record, and naming a file that is not one (bad JSON, a field
// missing or of the wrong type); records of other files are never trusted for their sizes.
std::string explainFlightRecords(const std::string& dir);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_WHY_STUCK_H_
