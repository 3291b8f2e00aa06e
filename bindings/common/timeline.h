// The engine's timeline (MTXCOMM_TIMELINE): a Chrome trace (the JSON array format of the Trace
// Event Format, opened by chrome://tracing and Perfetto) of what happened to every tensor:
//   NEGOTIATE     from this rank's submission until every active rank had submitted it; args:
//                 each rank's arrival (us on this rank's clock) and the cycle;
//   QUEUE         from agreement until its collective started (behind other operations);
//   MEMCPY_IN_FUSION_BUFFER / MEMCPY_OUT_FUSION_BUFFER: the fusion copies;
//   <COLLECTIVE>  the library call, with the algorithm mtxcomm chose and the bytes;
//   CYCLE         each negotiation exchange (track "engine").
// One file per rank: "{rank}" in the path is replaced by the rank, else rank r writes
// PATH.r (rank 0 too). pid = rank, one track (tid) per tensor name.
//
// The file is valid JSON at every moment: each append overwrites the closing "]" with the new
// events followed by "]" in one write, so a rank killed mid-run (SIGKILL) leaves a complete
// array. Bounded: at MTXCOMM_TIMELINE_MAX_BYTES the timeline records one last event saying it
// stopped, and nothing more.
#ifndef MTXCOMM_BINDINGS_COMMON_TIMELINE_H_
#define MTXCOMM_BINDINGS_COMMON_TIMELINE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace mtxcomm::binding {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  Timeline() = default;
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Opens the file for rank (see above); returns false with *error set when it cannot.
  bool open(const std::string& path, int rank, size_t maxBytes, std::string* error);
  bool enabled() const { return fd_ >= 0 && !full_; }
  const std::string& path() const { return path_; }

  // A complete event ("ph": "X") on the track of tensor (or "engine"), from begin to end;
  // args: a JSON object's members ("\"algorithm\": \"shm\", \"bytes\": 4096") or "".
  void complete(const std::string& track, const char* name, Clock::time_point begin,
                Clock::time_point end, const std::string& args = "");
  // Writes what was recorded since the last flush (one write).
  void flush();

 private:
  int trackId(const std::string& track);
  void append(const std::string& event);

  int fd_ = -1;
  int rank_ = 0;
  std::string path_;
  size_t maxBytes_ = 0;
  size_t written_ = 0;  // bytes in the file, the closing "]" included
  bool first_ = true;
  bool full_ = false;
  std::string pending_;
  std::map<std::string, int> tracks_;
  Clock::time_point origin_ = Clock::now();
};

// s with JSON string escapes (no surrounding quotes).
std::string jsonEscape(const std::string& s);

}  // namespace mtxcomm::binding

#endif  // MTXCOMM_BINDINGS_COMMON_TIMELINE_H_
