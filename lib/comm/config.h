// The configuration registry: every MTXCOMM_* environment variable is declared here once
// (name, type, default, unit, help), read and validated at init, echoed at INFO and listed by
// `mtxcomm_info`. A bad value fails init naming the variable; an unknown MTXCOMM_* name is
// warned about (it is probably a typo).
#ifndef MTXCOMM_LIB_CONFIG_H_
#define MTXCOMM_LIB_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/base/auth.h"
#include "lib/base/call.h"
#include "lib/base/log.h"
#include "lib/comm/cost_model.h"

namespace mtxcomm {

struct ConfigVar {
  std::string name;
  std::string type;          // "seconds", "bytes", "int", "string", "enum"
  std::string defaultValue;  // as it would be written in the environment ("" = unset)
  std::string help;
  std::vector<std::string> choices;  // for "enum"
  // Every rank of a communicator must have the same value: compared at init, where a rank that
  // differs fails every rank naming the variable and the ranks (Comm::agreeConfig).
  bool mustAgree = false;
};

// Every variable, in a fixed order.
const std::vector<ConfigVar>& configVars();

struct Config {
  double timeoutSeconds = 300.0;        // MTXCOMM_TIMEOUT
  LogLevel logLevel = LogLevel::kWarn;  // MTXCOMM_LOG_LEVEL
  size_t segmentBytes = 1 << 20;        // MTXCOMM_SEGMENT_BYTES
  std::string transport = "auto";       // MTXCOMM_TRANSPORT
  std::string algo[kNumCollectives] = {"auto", "auto", "auto", "auto", "auto", "auto", "auto"};
  int rank = -1;                           // MTXCOMM_RANK (-1: unset)
  int size = -1;                           // MTXCOMM_SIZE (-1: unset)
  std::string store;                       // MTXCOMM_STORE
  std::string tcpHost;                     // MTXCOMM_TCP_HOST
  std::string tcpIfaddr;                   // MTXCOMM_TCP_IFADDR (read by the TCP transport)
  std::string jobSecret;                   // MTXCOMM_JOB_SECRET (never echoed)
  std::string jobSecretFile;               // MTXCOMM_JOB_SECRET_FILE
  size_t ucxEagerLimit = size_t{4} << 20;  // MTXCOMM_UCX_EAGER_LIMIT
  std::string shm = "auto";                // MTXCOMM_SHM
  size_t shmSlotBytes = 0;                 // MTXCOMM_SHM_SLOT_BYTES (0: auto)
  // MTXCOMM_SHM_CHUNK_BYTES: the chunk of the shm reductions (0: auto, shmReductionChunkBytes of
  // the auto slot, or the slot the user set). Tests force each chunking with it.
  size_t shmReductionChunkBytes = 0;
  std::string cudaPath = "auto";              // MTXCOMM_CUDA_PATH
  size_t cudaIpcBytes = size_t{64} << 20;     // MTXCOMM_CUDA_IPC_BYTES
  size_t cudaStagingBytes = size_t{4} << 20;  // MTXCOMM_CUDA_STAGING_BYTES
  // Read by framework bindings through mtxcomm_config_get().
  double cycleTimeSeconds = 0.001;              // MTXCOMM_CYCLE_TIME
  size_t fusionBytes = 64 << 20;                // MTXCOMM_FUSION_BYTES
  double stallWarningSeconds = 60.0;            // MTXCOMM_STALL_WARNING
  size_t torchInlineBytes = 64 << 10;           // MTXCOMM_TORCH_INLINE_BYTES
  std::string torchBackend = "auto";            // MTXCOMM_TORCH_BACKEND
  int cacheCapacity = 1024;                     // MTXCOMM_CACHE_CAPACITY
  double stallTimeoutSeconds = 300.0;           // MTXCOMM_STALL_TIMEOUT
  std::string timeline;                         // MTXCOMM_TIMELINE
  size_t timelineMaxBytes = size_t{100} << 20;  // MTXCOMM_TIMELINE_MAX_BYTES
  std::string placement = "auto";               // MTXCOMM_PLACEMENT
  size_t flightRecorder = 64;                   // MTXCOMM_FLIGHT_RECORDER (calls kept; 0: off)
  std::string flightRecorderDir;                // MTXCOMM_FLIGHT_RECORDER_DIR
  // Read by the Python package (mtxcomm.transparent).
  std::string transparent = "0";            // MTXCOMM_TRANSPARENT
  std::string transparentOutput = "rank0";  // MTXCOMM_TRANSPARENT_OUTPUT
  std::string tuningFile;                   // MTXCOMM_TUNING_FILE
  std::string ncclLibrary;                  // MTXCOMM_NCCL_LIBRARY (read by gpu/nccl_api.cc)
  CostParams cost;                          // loaded from tuningFile (defaults otherwise); rank 0's
                                            // after a communicator's setup

  // Reads and validates every variable from the environment. Throws
  // mtxcomm::Error(MTXCOMM_INVALID_USAGE) naming the first bad variable and its value.
  static Config fromEnvironment();
  // Names of set MTXCOMM_* variables that are not in the registry.
  static std::vector<std::string> unknownVariables();
  // "NAME=value" for every variable: the effective configuration (a secret reads "(set)").
  std::vector<std::string> describe() const;
  // The configured job secret (MTXCOMM_JOB_SECRET, else MTXCOMM_JOB_SECRET_FILE), or none.
  // Throws MTXCOMM_INVALID_USAGE naming the variable when it is too short or the file unsafe.
  JobSecret loadJobSecret() const;
  // Forced algorithm for collective c, or "auto".
  const std::string& algorithmFor(Collective c) const { return algo[static_cast<int>(c)]; }
};

// The shared-memory slot (the chunk of the shm algorithms) where MTXCOMM_SHM_SLOT_BYTES is
// auto: one core's share of its L2 cache (l2Bytes, the smallest the ranks report; 0 = unknown:
// 256 KiB) within [256 KiB, 1 MiB], halved while 2 x ranks x slot would pass 32 MiB
// or half of shmFreeBytes (the least free space of /dev/shm the ranks report), not below
// 256 KiB (where even that does not fit, the segment's creation fails naming /dev/shm). Fewer
// chunks mean fewer of the two barriers each chunk costs; measured at 512 KiB-4 MiB (np = 2-4,
// bench/RESULTS.md): a 512 KiB or 1 MiB slot 0.6-0.8x the time of a 256 KiB one where the L2 is 1
// MiB, none slower; a 2 MiB slot gains nothing more at 4 MiB.
size_t defaultShmSlotBytes(size_t l2Bytes, int ranks, size_t shmFreeBytes = SIZE_MAX);

// The chunk of the shared-memory reductions (allreduce, reduce_scatter) where the slot is auto:
// half the slot where a chunk's working set on each rank (its send and receive bytes, its own
// slot and half a peer's: about 4 chunks) fits in l2Bytes at half the slot but not at the whole,
// and the half is still at least 512 KiB (each chunk costs two barriers); else the whole slot.
// Measured (bench/RESULTS.md, "Half-slot reductions"): with 2 MiB of L2 per core (Intel Xeon),
// 512 KiB chunks in 1 MiB slots took 0.80-0.87x the time of whole-slot chunks at 1-16 MiB for
// reduce_scatter at np = 2 and 0.80-1.00x for allreduce at np = 2, within the runs' spread at
// np = 3-4; with 1 MiB of L2 (AMD Zen 4) the whole 1 MiB slot was the faster at 1-2 MiB, and
// there it stays.
size_t shmReductionChunkBytes(size_t slotBytes, size_t l2Bytes);

// Looks up "MTXCOMM_...": the value, or nullptr when unset.
const char* getEnv(const char* name);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_CONFIG_H_
