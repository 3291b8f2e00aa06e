#include "lib/comm/why_stuck.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "lib/base/error.h"

namespace mtxcomm {

namespace {

using Json = nlohmann::json;

struct Call {
  uint64_t seq = 0;
  std::string text;  // "allreduce(count 256, float32, sum) as call #42"
  std::string what;  // the same without " as call #N": what ranks must agree on
  std::string name, state, algorithm, transport;
  int waitingOn = -1;
  int64_t waitingSinceUs = 0, endedUs = 0;  // 0: never waited past the spin; not ended
};

struct Record {
  std::string file;
  int rank = 0, size = 0;
  std::string host, reason, error;  // why the record was written; what failed the rank
  int64_t pid = 0, dumpedUs = 0;
  std::vector<Call> calls;  // by seq
  const Call* find(uint64_t seq) const {
    for (const Call& c : calls) {
      if (c.seq == seq) return &c;
    }
    return nullptr;
  }
  uint64_t lastDone() const {
    uint64_t s = 0;
    for (const Call& c : calls) {
      if (c.state == "done") s = std::max(s, c.seq);
    }
    return s;
  }
  uint64_t newest() const { return calls.empty() ? 0 : calls.back().seq; }
  // The call this rank is in (entered and not ended), or null.
  const Call* current() const {
    return !calls.empty() && calls.back().state == "entered" ? &calls.back() : nullptr;
  }
};

[[noreturn]] void badRecord(const std::string& file, const std::string& why) {
  fail(MTXCOMM_INVALID_ARGUMENT, "'", file, "' is not a flight record of mtxcomm: ", why);
}

template <class T>
T field(const Json& j, const char* key, const std::string& file) {
  if (!j.is_object() || !j.contains(key)) badRecord(file, strCat("no field \"", key, "\""));
  try {
    return j.at(key).get<T>();
  } catch (const Json::exception&) {
    badRecord(file, strCat("field \"", key, "\" has the wrong type"));
  }
}

Record readRecord(const std::string& file, std::string* comm) {
  std::ifstream in(file);
  Json j;
  try {
    j = Json::parse(in);
  } catch (const Json::exception& e) {
    badRecord(file, e.what());
  }
  if (field<std::string>(j, "format", file) != "mtxcomm flight recorder 1") {
    badRecord(file, "an unknown format");
  }
  Record r;
  r.file = file;
  *comm = field<std::string>(j, "comm", file);
  r.rank = field<int>(j, "rank", file);
  r.size = field<int>(j, "size", file);
  if (r.size < 1 || r.size > (1 << 24) || r.rank < 0 || r.rank >= r.size) {
    badRecord(file, strCat("rank ", r.rank, " of size ", r.size));
  }
  r.host = field<std::string>(j, "host", file);
  r.pid = field<int64_t>(j, "pid", file);
  r.reason = field<std::string>(j, "reason", file);
  r.error = j.contains("error") ? field<std::string>(j, "error", file) : std::string();
  r.dumpedUs = field<int64_t>(j, "dumped_us", file);
  const Json calls = j.contains("calls") ? j["calls"] : Json();
  if (!calls.is_array()) badRecord(file, "no array \"calls\"");
  for (const Json& c : calls) {
    Call call;
    call.seq = field<uint64_t>(c, "seq", file);
    call.text = field<std::string>(c, "call", file);
    const size_t as = call.text.rfind(" as call #");
    call.what = as == std::string::npos ? call.text : call.text.substr(0, as);
    call.name = field<std::string>(c, "name", file);
    call.state = field<std::string>(c, "state", file);
    call.algorithm = field<std::string>(c, "algorithm", file);
    call.transport = field<std::string>(c, "transport", file);
    call.waitingOn = field<int>(c, "waiting_on", file);
    call.waitingSinceUs = field<int64_t>(c, "waiting_since_us", file);
    call.endedUs = field<int64_t>(c, "ended_us", file);
    r.calls.push_back(std::move(call));
  }
  std::sort(r.calls.begin(), r.calls.end(),
            [](const Call& a, const Call& b) { return a.seq < b.seq; });
  return r;
}

// "rank 2", "ranks 0,1", "ranks 0-3,5".
std::string rankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ",";
    out += std::to_string(ranks[i]);
    if (j >= i + 2) {
      out += "-" + std::to_string(ranks[j]);
    } else if (j == i + 1) {
      out += "," + std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

std::string capitalized(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

std::string callText(const Call& c) {
  std::string out = c.text;
  if (!c.name.empty()) out += " '" + c.name + "'";
  return out;
}

std::string seconds(int64_t us) {
  std::ostringstream s;
  s.precision(us < 10000000 ? 2 : 3);
  s << static_cast<double>(us) / 1e6 << " s";
  return s.str();
}

std::string explainComm(const std::string& comm, const std::map<int, Record>& byRank) {
  const int n = byRank.begin()->second.size;
  std::vector<int> present, missing;
  for (int r = 0; r < n; ++r) (byRank.count(r) ? present : missing).push_back(r);
  std::string out =
      strCat("Communicator ", comm, " (", n, " ranks): records from ", rankList(present), ".");
  if (!missing.empty()) {
    out += strCat(" No record from ", rankList(missing),
                  ": its process wrote none (stuck outside mtxcomm with SIGUSR1 handled or "
                  "ignored by the program, gone, or on another node whose records are "
                  "elsewhere).");
  }
  // Progress: the newest call each rank has entered.
  uint64_t least = UINT64_MAX, most = 0;
  for (const auto& [r, rec] : byRank) {
    least = std::min(least, rec.newest());
    most = std::max(most, rec.newest());
  }
  // The last call every present rank completed.
  uint64_t allDone = UINT64_MAX;
  for (const auto& [r, rec] : byRank) allDone = std::min(allDone, rec.lastDone());
  const std::string every = missing.empty() ? "every rank" : "every rank with a record";
  if (allDone > 0) {
    const Call* c = byRank.begin()->second.find(allDone);
    out += strCat(" The last call ", every, " completed is ",
                  c ? callText(*c) : strCat("call #", allDone), ".");
  } else {
    out += strCat(" No call is completed on ", every, " in the records.");
  }
  // Who is behind.
  if (least < most) {
    std::vector<int> behind, ahead;
    for (const auto& [r, rec] : byRank) (rec.newest() == least ? behind : ahead).push_back(r);
    if (behind.empty() || ahead.empty()) return out;  // never: least < most
    const Record& b = byRank.at(behind.front());
    const Call* mine = b.find(least);
    const Call* theirs = byRank.at(ahead.front()).find(least + 1);
    out += strCat(" ", capitalized(rankList(behind)), behind.size() == 1 ? " is" : " are",
                  " behind: the newest call ", behind.size() == 1 ? "it" : "they", " entered is #",
                  least);
    if (mine) out += strCat(" (", mine->state, ")");
    out += strCat(", and ", behind.size() == 1 ? "it has" : "they have", " not entered call #",
                  least + 1, theirs ? " (" + callText(*theirs) + ")" : std::string(), ", which ",
                  rankList(ahead), " entered.");
  } else if (!byRank.empty()) {
    const Record& any = byRank.begin()->second;
    const Call* c = any.find(most);
    bool allIn = true;
    for (const auto& [r, rec] : byRank) allIn = allIn && rec.current() != nullptr;
    const std::string none =
        missing.empty() ? " No rank is behind:"
                        : " No rank with a record is behind (" + rankList(missing) + " left none):";
    if (c && allIn) {
      out +=
          strCat(none, " every rank with a record entered ", callText(*c), " and is still in it.");
    } else {
      out += strCat(none, " every rank with a record got to call #", most, ".");
    }
  }
  // The first call where the ranks differ, among the calls every record holds.
  uint64_t from = 0, to = UINT64_MAX;
  for (const auto& [r, rec] : byRank) {
    if (rec.calls.empty()) {
      to = 0;
      continue;
    }
    from = std::max(from, rec.calls.front().seq);
    to = std::min(to, rec.calls.back().seq);
  }
  bool differ = false;
  for (uint64_t s = from; s <= to && to != UINT64_MAX && !differ; ++s) {
    std::map<std::string, std::vector<int>> kinds;
    bool all = true;
    for (const auto& [r, rec] : byRank) {
      const Call* c = rec.find(s);
      if (!c) {
        all = false;
        break;
      }
      std::string key = c->what;
      if (!c->name.empty()) key += " '" + c->name + "'";
      if (c->state == "rejected") key += " (rejected by the rank)";
      kinds[key].push_back(r);
    }
    if (!all || kinds.size() < 2) continue;
    differ = true;
    out += strCat(" The first call where the ranks differ is #", s, ":");
    bool first = true;
    for (const auto& [k, ranks] : kinds) {
      out += strCat(first ? " " : "; ", k, " on ", rankList(ranks));
      first = false;
    }
    out += ".";
  }
  if (!differ && to != UINT64_MAX && from <= to && from > 0) {
    out += strCat(" The ranks agree on every call the records all hold (#", from, "-#", to, ").");
  }
  // Who waits (or waited, in a call that failed) on whom.
  std::map<int, std::vector<int>> waitersOf;      // awaited rank -> waiting ranks
  std::map<uint64_t, std::vector<int>> failedIn;  // call -> ranks where it failed
  for (const auto& [r, rec] : byRank) {
    if (rec.calls.empty()) continue;
    const Call& c = rec.calls.back();
    if ((c.state == "entered" || c.state == "failed") && c.waitingOn >= 0) {
      waitersOf[c.waitingOn].push_back(r);
    }
    if (c.state == "failed") failedIn[c.seq].push_back(r);
  }
  for (const auto& [awaited, waiters] : waitersOf) {
    const Record& w = byRank.at(waiters.front());
    const Call& c = w.calls.back();
    const bool ended = c.state == "failed";
    const int64_t waited =
        c.waitingSinceUs ? (ended ? c.endedUs : w.dumpedUs) - c.waitingSinceUs : -1;
    out += strCat(" ", capitalized(rankList(waiters)),
                  ended ? " waited" : (waiters.size() == 1 ? " waits" : " wait"), " on rank ",
                  awaited, " in call #", c.seq);
    if (waited >= 0) {
      out += strCat(" (", seconds(waited),
                    ended ? ", until the call failed)" : " when the record was written)");
    }
    if (byRank.count(awaited)) {
      const Record& a = byRank.at(awaited);
      if (const Call* in = a.current()) {
        out += strCat(", and rank ", awaited, " is in ", callText(*in));
        if (in->waitingOn >= 0) out += strCat(" waiting on rank ", in->waitingOn);
      } else {
        out += strCat(", and rank ", awaited, " is in no call (its newest is #", a.newest(),
                      a.calls.empty() ? "" : ", " + a.calls.back().state, ")");
      }
    } else {
      out += strCat(", and rank ", awaited, " left no record");
    }
    out += ".";
  }
  if (failedIn.empty()) {
    // No call failed: the records were asked for (a stall error, SIGUSR1): say why, once each.
    std::map<std::string, std::vector<int>> reasons;
    for (const auto& [r, rec] : byRank) {
      reasons[(rec.error.empty() ? rec.reason : rec.error).substr(0, 400)].push_back(r);
    }
    for (const auto& [reason, ranks] : reasons) {
      out += strCat(" ", capitalized(rankList(ranks)), " wrote ",
                    ranks.size() == 1 ? "its record" : "their records", " on: ", reason, ".");
    }
  }
  for (const auto& [seq, ranks] : failedIn) {
    const Record& first = byRank.at(ranks.front());
    out += strCat(" Call #", seq, " failed on ", rankList(ranks), " (",
                  (first.error.empty() ? first.reason : first.error).substr(0, 400), ").");
  }
  return out;
}

}  // namespace

std::string explainFlightRecords(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> files;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    // A link is never followed (the writer never makes one; a planted one is read as nothing).
    if (it->path().extension() == ".json" && it->is_regular_file() && !it->is_symlink()) {
      files.push_back(it->path().string());
    }
  }
  if (ec) fail(MTXCOMM_INVALID_ARGUMENT, "cannot read '", dir, "': ", ec.message());
  if (files.empty()) {
    fail(MTXCOMM_INVALID_ARGUMENT, "'", dir,
         "' holds no flight record (*.json; MTXCOMM_FLIGHT_RECORDER_DIR says where ranks write)");
  }
  std::sort(files.begin(), files.end());
  std::map<std::string, std::map<int, Record>> byComm;
  std::string skipped;  // files that are not records, or records that contradict others
  for (const std::string& f : files) {
    try {
      std::string comm;
      Record r = readRecord(f, &comm);
      auto& ranks = byComm[comm];
      if (!ranks.empty() && ranks.begin()->second.size != r.size) {
        badRecord(f, strCat("communicator ", comm, " has ", ranks.begin()->second.size,
                            " ranks in '", ranks.begin()->second.file, "' and ", r.size, " here"));
      }
      auto same = ranks.find(r.rank);
      if (same != ranks.end()) {
        // Two records of one rank (a copy, or a file of another job): the newer one stands.
        const bool newer = r.dumpedUs > same->second.dumpedUs;
        skipped += strCat("Note: two records of rank ", r.rank, " of ", comm, ": '", f, "' and '",
                          same->second.file, "'; the newer ('", newer ? f : same->second.file,
                          "') is used.\n");
        if (!newer) continue;
      }
      ranks[r.rank] = std::move(r);
    } catch (const Error& e) {
      skipped += strCat("Skipped: ", e.what(), "\n");
    }
  }
  for (auto it = byComm.begin(); it != byComm.end();) {
    it = it->second.empty() ? byComm.erase(it) : std::next(it);
  }
  if (byComm.empty()) {
    fail(MTXCOMM_INVALID_ARGUMENT, "'", dir, "' holds no readable flight record: ", skipped);
  }
  std::string out;
  for (const auto& [comm, ranks] : byComm) out += explainComm(comm, ranks) + "\n";
  return out + skipped;
}

}  // namespace mtxcomm
