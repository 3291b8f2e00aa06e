// The flight recorder: each communicator keeps its last N calls (MTXCOMM_FLIGHT_RECORDER, a
// ring), so that a job that hangs or fails tells which rank it waits for. On a timeout, a
// peer's failure, a disagreement, an engine's stall error (mtxcomm_flight_recorder_dump) or
// SIGUSR1, every recorder of the process writes its ring as JSON to
// MTXCOMM_FLIGHT_RECORDER_DIR (one file per communicator and rank, mode 0600), and asks the
// other ranks on its node to do the same; `mtxcomm_info --why-stuck DIR` merges the files
// (lib/comm/why_stuck.h). The idea is PyTorch's flight recorder for ProcessGroupNCCL
// (torch/csrc/distributed/c10d/FlightRecorder.hpp), here for every transport.
//
// Cost: a call writes about a dozen relaxed atomic words; no lock, no allocation, no clock
// (bench/RESULTS.md, "Flight recorder": a coarse clock read per call cost 5-10% of an 8-byte
// allreduce at np=2). Times are taken where a call is slow anyway: when its wait stops spinning
// (the time it began waiting, with the peer) and when it fails. A reader (a dump, on any
// thread) takes a call's identity only when the entry's version is even and unchanged across
// the read (a seqlock); its state, path and times as they stand.
#ifndef MTXCOMM_LIB_COMM_FLIGHT_RECORDER_H_
#define MTXCOMM_LIB_COMM_FLIGHT_RECORDER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lib/base/call.h"
#include "lib/base/wait_record.h"

namespace mtxcomm {

class FlightRecorder {
 public:
  // The state of a recorded call.
  enum class State : uint32_t { kEntered = 1, kDone, kFailed, kRejected };
  static constexpr size_t kLabelBytes = 64;  // a label (tensor names) is cut to 63 bytes
  using Label = char[kLabelBytes];           // NUL-terminated

  // commName: the same on every rank of the communicator ("world", "world.split2.color1").
  FlightRecorder(size_t capacity, std::string commName, int rank, int size);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  const std::string& commName() const { return commName_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // The calling thread of the communicator. A call enters with its signature (and the label
  // the caller gave it, "" for none), is given its algorithm and transport once chosen, and
  // ends done, failed or rejected.
  void enter(const CallSignature& call, const Label& label);
  void setPath(const char* algorithm, const char* transport);
  void end(State state);
  // The peer the call in progress waits on and since when: the waits of the transports and of
  // the shared-memory segment note it once they stop spinning (lib/base/wait_record.h).
  WaitRecord* waitRecord() { return &wait_; }
  // The error that failed this communicator (its first; the calling thread), written with
  // every later dump: a dump a peer asks for afterwards keeps it.
  void setError(const std::string& message);

  // Any thread: the ring as JSON, oldest call first, with the reason of the dump.
  std::string json(const std::string& reason) const;

 private:
  struct Entry;
  std::unique_ptr<Entry[]> ring_;
  size_t capacity_;
  uint64_t next_ = 0;               // calls entered (the calling thread only)
  std::atomic<size_t> current_{0};  // the slot of the newest call (a dump reads it)
  std::string commName_;
  int rank_, size_;
  WaitRecord wait_;
  mutable std::mutex errorMu_;
  std::string error_;
};

// Process-wide. Every live recorder is registered (by the communicator that owns it).
void registerFlightRecorder(FlightRecorder* r);
void unregisterFlightRecorder(FlightRecorder* r);

// Where dumps go: MTXCOMM_FLIGHT_RECORDER_DIR; else, with MTXCOMM_STORE=file:DIR,
// DIR/mtxcomm.flight_recorder; else /tmp/mtxcomm_flight_<job> (job: the launcher's job id,
// PMIX_NAMESPACE or SLURM_JOB_ID, else the tcp: store's address, else this process's id).
std::string flightRecorderDir();

// Writes every registered recorder of this process to the dump directory (a folder of this
// user's, made with mode 0700; files with mode 0600, never following a link), with reason.
// Returns the folder ("" when nothing was written: no recorder, or the folder is unsafe, which
// is logged). Safe from any thread, never from a signal handler.
std::string dumpFlightRecorders(const std::string& reason);

// Once per process, when a communicator of peers is set up: SIGUSR1 dumps every recorder, unless
// the program has a SIGUSR1 handler of its own or ignores it. The handler wakes a thread of the
// library's that runs while any recorder is registered (it ends with the last, so a program
// that forks between its communicators forks a one-thread process). Whether this process dumps
// on SIGUSR1.
bool flightRecorderHandlesSigusr1();

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_FLIGHT_RECORDER_H_
