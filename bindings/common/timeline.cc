#include "bindings/common/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace mtxcomm::binding {

std::string jsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

Timeline::~Timeline() {
  flush();
  if (fd_ >= 0) ::close(fd_);
}

bool Timeline::open(const std::string& path, int rank, size_t maxBytes, std::string* error) {
  std::string p = path;
  const size_t at = p.find("{rank}");
  if (at != std::string::npos) {
    p.replace(at, 6, std::to_string(rank));
  } else {
    p += "." + std::to_string(rank);
  }
  // O_NOFOLLOW: a planted symbolic link does not redirect the trace; 0600: the job's only.
  fd_ = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0) {
    *error = "MTXCOMM_TIMELINE: cannot open " + p + " for writing: " + std::strerror(errno);
    return false;
  }
  path_ = p;
  rank_ = rank;
  maxBytes_ = maxBytes;
  const std::string head = "[\n]";
  if (::write(fd_, head.data(), head.size()) != static_cast<ssize_t>(head.size())) {
    *error = "MTXCOMM_TIMELINE: cannot write " + p + ": " + std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    return false;
  }
  written_ = head.size();
  // Process and track names, so the viewer labels the rank.
  append("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank) +
         ", \"args\": {\"name\": \"rank " + std::to_string(rank) + "\"}}");
  flush();
  return true;
}

int Timeline::trackId(const std::string& track) {
  auto it = tracks_.find(track);
  if (it != tracks_.end()) return it->second;
  const int id = static_cast<int>(tracks_.size()) + 1;
  tracks_[track] = id;
  append("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
         ", \"tid\": " + std::to_string(id) + ", \"args\": {\"name\": \"" + jsonEscape(track) +
         "\"}}");
  return id;
}

void Timeline::append(const std::string& event) {
  pending_ += first_ ? "" : ",\n";
  pending_ += event;
  first_ = false;
}

void Timeline::complete(const std::string& track, const char* name, Clock::time_point begin,
                        Clock::time_point end, const std::string& args) {
  if (!enabled()) return;
  const int tid = trackId(track);
  const double ts = std::chrono::duration<double, std::micro>(begin - origin_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - begin).count();
  char head[160];
  std::snprintf(head, sizeof(head),
                "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, "
                "\"dur\": %.3f",
                name, rank_, tid, ts, dur < 0 ? 0.0 : dur);
  std::string e = head;
  if (!args.empty()) e += ", \"args\": {" + args + "}";
  e += "}";
  append(e);
}

void Timeline::flush() {
  if (fd_ < 0 || pending_.empty() || full_) return;
  if (written_ + pending_.size() + 2 > maxBytes_) {
    // One last event says why the trace ends here.
    pending_ =
        (first_ ? "" : ",\n") +
        std::string(
            "{\"name\": \"timeline stopped at MTXCOMM_TIMELINE_MAX_BYTES\", "
            "\"ph\": \"i\", \"s\": \"g\", \"pid\": ") +
        std::to_string(rank_) + ", \"ts\": " +
        std::to_string(std::chrono::duration<double, std::micro>(Clock::now() - origin_).count()) +
        "}";
    full_ = true;
  }
  // The closing "]" of the file is overwritten by the events and a new "]": one write, so the
  // file is a complete JSON array before and after it.
  std::string chunk = pending_ + "\n]";
  const off_t at = static_cast<off_t>(written_ - 2);  // where "\n]" starts
  if (::pwrite(fd_, chunk.data(), chunk.size(), at) == static_cast<ssize_t>(chunk.size())) {
    written_ = static_cast<size_t>(at) + chunk.size();
  } else {
    full_ = true;  // a full disk: stop recording, the file stays valid up to here
  }
  pending_.clear();
}

}  // namespace mtxcomm::binding
