// The flight recorder (lib/comm/flight_recorder.h) and `mtxcomm_info --why-stuck`
// (lib/comm/why_stuck.h): what a ring keeps, what a fault writes and where, and the
// explanation of the records, for ranks as threads (the mpirun case is tests/mp/mp_flight.sh).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "harness.h"
#include "lib/base/error.h"
#include "lib/comm/flight_recorder.h"
#include "lib/comm/why_stuck.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace {

using Json = nlohmann::json;
using testutil::contains;

// A fresh folder for one test's records, named in MTXCOMM_FLIGHT_RECORDER_DIR while it lives.
class RecordDir {
 public:
  RecordDir() {
    char tmpl[] = "/tmp/mtxcomm_fr_test.XXXXXX";
    base_ = mkdtemp(tmpl);
    dir_ = base_ + "/records";
    setenv("MTXCOMM_FLIGHT_RECORDER_DIR", dir_.c_str(), 1);
  }
  ~RecordDir() {
    unsetenv("MTXCOMM_FLIGHT_RECORDER_DIR");
    std::filesystem::remove_all(base_);
  }
  const std::string& path() const { return dir_; }
  Json read(const std::string& name) const {
    std::ifstream in(dir_ + "/" + name);
    return Json::parse(in);
  }

 private:
  std::string base_, dir_;
};

CallSignature sig(Collective c, uint64_t count, uint64_t seq, int root = 0) {
  CollArgs a;
  a.coll = c;
  a.count = count;
  a.dtype = MTXCOMM_FLOAT32;
  a.op = MTXCOMM_SUM;
  a.root = root;
  return callSignature(a, seq);
}

// A label as Comm keeps it (cut to 63 bytes).
const FlightRecorder::Label& label(const std::string& text) {
  static FlightRecorder::Label l;
  std::memset(l, 0, sizeof(l));
  std::memcpy(l, text.data(), std::min(text.size(), sizeof(l) - 1));
  return l;
}

// A ring of 4 keeps the last 4 calls, oldest first, each with its fields and state; the call
// in progress shows the peer it waits on; a label is cut to 63 bytes.
TEST(FlightRecorder, TheRingKeepsTheLastCallsWithTheirFieldsAndStates) {
  FlightRecorder r(4, "world", 1, 3);
  for (uint64_t s = 1; s <= 6; ++s) {
    r.enter(sig(Collective::kAllreduce, 100 + s, s), label("grad " + std::to_string(s)));
    r.setPath("ring", "tcp");
    r.end(s == 5 ? FlightRecorder::State::kRejected : FlightRecorder::State::kDone);
  }
  const std::string longName(100, 'x');
  r.enter(sig(Collective::kBroadcast, 8, 7, 2), label(longName));
  r.waitRecord()->note(2);
  const Json j = Json::parse(r.json("a test"));
  EXPECT_EQ(j["format"], "mtxcomm flight recorder 1");
  EXPECT_EQ(j["comm"], "world");
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["size"], 3);
  EXPECT_EQ(j["reason"], "a test");
  EXPECT_EQ(j["pid"], static_cast<int64_t>(getpid()));
  ASSERT_EQ(j["calls"].size(), 4u);
  EXPECT_EQ(j["calls"][0]["seq"], 4);
  EXPECT_EQ(j["calls"][0]["kind"], "allreduce");
  EXPECT_EQ(j["calls"][0]["count"], 104);
  EXPECT_EQ(j["calls"][0]["dtype"], "float32");
  EXPECT_EQ(j["calls"][0]["op"], "sum");
  EXPECT_EQ(j["calls"][0]["root"], -1);
  EXPECT_EQ(j["calls"][0]["name"], "grad 4");
  EXPECT_EQ(j["calls"][0]["algorithm"], "ring");
  EXPECT_EQ(j["calls"][0]["transport"], "tcp");
  EXPECT_EQ(j["calls"][0]["state"], "done");
  EXPECT_EQ(j["calls"][0]["waiting_on"], -1);
  EXPECT_EQ(j["calls"][1]["state"], "rejected");
  const Json& now = j["calls"][3];
  EXPECT_EQ(now["seq"], 7);
  EXPECT_EQ(now["kind"], "broadcast");
  EXPECT_EQ(now["root"], 2);
  EXPECT_EQ(now["op"], "");
  EXPECT_EQ(now["state"], "entered");
  EXPECT_EQ(now["waiting_on"], 2);
  EXPECT_EQ(now["name"], std::string(63, 'x'));
  EXPECT_EQ(now["ended_us"], 0);
  EXPECT_EQ(j["calls"][0]["waiting_since_us"], 0);  // completed without a slow wait
  // Wall-clock microseconds, within a minute of now.
  const int64_t wall = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  EXPECT_LT(std::llabs(now["waiting_since_us"].get<int64_t>() - wall), 60000000);
  // A failed call keeps the peer it waited on.
  r.end(FlightRecorder::State::kFailed);
  const Json k = Json::parse(r.json("again"));
  EXPECT_EQ(k["calls"][3]["state"], "failed");
  EXPECT_EQ(k["calls"][3]["waiting_on"], 2);
  EXPECT_GT(k["calls"][3]["ended_us"].get<int64_t>(), 0);
  EXPECT_GE(k["calls"][3]["ended_us"].get<int64_t>(),
            k["calls"][3]["waiting_since_us"].get<int64_t>());
}

// Ranks that disagree on a count over a point-to-point transport (no shm: the call times out,
// naming nobody else) write their records at the fault, the waits name the peer, and the
// explanation names the first call where the counts differ and who waited on whom.
TEST(FlightRecorder, RanksThatDisagreeOnACountAreExplained) {
  RecordDir dir;
  Config cfg;
  cfg.shm = "off";
  cfg.timeoutSeconds = 1;
  testing::runRanks(
      3,
      [](mtxcomm_comm_t c, int rank) {
        std::vector<float> buf(300, 1.0f);
        for (int step = 0; step < 3; ++step) {
          ASSERT_EQ(mtxcomm_comm_set_call_label(c, "layer.w"), MTXCOMM_SUCCESS);
          ASSERT_EQ(mtxcomm_allreduce(buf.data(), buf.data(), 300, MTXCOMM_FLOAT32, MTXCOMM_SUM, c,
                                      nullptr),
                    MTXCOMM_SUCCESS);
        }
        const size_t count = rank == 2 ? 255 : 256;
        EXPECT_NE(mtxcomm_allreduce(buf.data(), buf.data(), count, MTXCOMM_FLOAT32, MTXCOMM_SUM, c,
                                    nullptr),
                  MTXCOMM_SUCCESS);
      },
      cfg);
  for (int r = 0; r < 3; ++r) {
    const Json j = dir.read("world.rank" + std::to_string(r) + ".json");
    EXPECT_EQ(j["calls"].back()["state"], "failed") << r;
    EXPECT_EQ(j["calls"].back()["count"], r == 2 ? 255 : 256) << r;
    struct stat st {};
    ASSERT_EQ(stat((dir.path() + "/world.rank" + std::to_string(r) + ".json").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  struct stat st {};
  ASSERT_EQ(stat(dir.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const std::string why = explainFlightRecords(dir.path());
  for (const char* part :
       {"Communicator world (3 ranks): records from ranks 0-2.",
        "The last call every rank completed is allreduce(count 300, float32, sum) as call #",
        "'layer.w'", "The first call where the ranks differ is #",
        "allreduce(count 255, float32, sum) on rank 2; allreduce(count 256, float32, sum) on "
        "ranks 0,1.",
        " waited on rank "}) {
    EXPECT_TRUE(contains(why, part)) << part << "\n" << why;
  }
}

// A rank that stops before a call: the others wait on it and time out; the records (all three
// ranks live in this process, so one dump holds them all) say who is behind.
TEST(FlightRecorder, ARankThatStopsBeforeACallIsNamed) {
  RecordDir dir;
  Config cfg;
  cfg.timeoutSeconds = 1;
  testing::runRanks(
      3,
      [](mtxcomm_comm_t c, int rank) {
        std::vector<float> buf(64, 1.0f);
        ASSERT_EQ(
            mtxcomm_allreduce(buf.data(), buf.data(), 64, MTXCOMM_FLOAT32, MTXCOMM_SUM, c, nullptr),
            MTXCOMM_SUCCESS);
        if (rank == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          return;  // never makes the second call
        }
        // The first to time out aborts; the other hears it (MTXCOMM_REMOTE_ERROR).
        const mtxcomm_result_t rc =
            mtxcomm_allreduce(buf.data(), buf.data(), 64, MTXCOMM_FLOAT32, MTXCOMM_SUM, c, nullptr);
        EXPECT_TRUE(rc == MTXCOMM_TIMEOUT || rc == MTXCOMM_REMOTE_ERROR)
            << rc << ": " << mtxcomm_get_last_error(c);
      },
      cfg);
  const std::string why = explainFlightRecords(dir.path());
  for (const char* part : {"Rank 2 is behind", "which ranks 0,1 entered", " on rank 2 in call #",
                           "and rank 2 is in no call"}) {
    EXPECT_TRUE(contains(why, part)) << part << "\n" << why;
  }
}

// The records are input from files: what is not one is refused naming the file and why.
TEST(FlightRecorder, WhyStuckRefusesWhatIsNotARecord) {
  RecordDir dir;
  EXPECT_THROW(explainFlightRecords(dir.path()), Error);  // no folder
  std::filesystem::create_directories(dir.path());
  try {
    explainFlightRecords(dir.path());
    ADD_FAILURE() << "an empty folder was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "holds no flight record")) << e.what();
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{not json", "is not a flight record of mtxcomm"},
      {R"({"format": "something else"})", "an unknown format"},
      {R"({"format": "mtxcomm flight recorder 1", "comm": "world", "rank": 5, "size": 2})",
       "rank 5 of size 2"},
      {R"({"format": "mtxcomm flight recorder 1", "comm": "world", "rank": "0", "size": 2})",
       "field \"rank\" has the wrong type"},
      {R"({"format": "mtxcomm flight recorder 1", "comm": "world", "rank": 0, "size": 2,
           "host": "h", "pid": 1, "reason": "r", "dumped_us": 1, "calls": 7})",
       "no array \"calls\""}};
  for (const auto& [text, why] : bad) {
    std::ofstream(dir.path() + "/world.rank0.json") << text;
    try {
      explainFlightRecords(dir.path());
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_INVALID_ARGUMENT);
      EXPECT_TRUE(contains(e.what(), "world.rank0.json")) << e.what();
      EXPECT_TRUE(contains(e.what(), why)) << e.what();
    }
  }
  // Beside a good record, a bad file or a planted link is skipped, saying so, and a second
  // record of one rank is named; the good record is still explained.
  FlightRecorder r(2, "world", 0, 1);
  r.enter(sig(Collective::kBarrier, 0, 1), label(""));
  r.end(FlightRecorder::State::kDone);
  std::ofstream(dir.path() + "/world.rank0.json") << r.json("test");
  std::ofstream(dir.path() + "/copy.rank0.json") << r.json("test");
  std::ofstream(dir.path() + "/zz.json") << "junk";
  std::filesystem::create_symlink("/etc/hostname", dir.path() + "/link.json");
  const std::string why = explainFlightRecords(dir.path());
  EXPECT_TRUE(contains(why, "Communicator world (1 ranks): records from rank 0.")) << why;
  EXPECT_TRUE(contains(why, "Skipped: '" + dir.path() + "/zz.json' is not a flight record")) << why;
  EXPECT_TRUE(contains(why, "Note: two records of rank 0 of world")) << why;
  EXPECT_FALSE(contains(why, "link.json")) << why;
}

// A folder another user could write, or a link planted in its place, is never written into.
TEST(FlightRecorder, AnUnsafeFolderIsNotWritten) {
  RecordDir dir;
  const std::string parent = std::filesystem::path(dir.path()).parent_path();
  FlightRecorder r(2, "world", 0, 2);
  registerFlightRecorder(&r);
  r.enter(sig(Collective::kBarrier, 0, 1), label(""));
  std::filesystem::create_directories(dir.path());
  chmod(dir.path().c_str(), 0777);
  EXPECT_EQ(dumpFlightRecorders("test"), "");
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/world.rank0.json"));
  std::filesystem::remove_all(dir.path());
  const std::string elsewhere = parent + "/elsewhere";
  std::filesystem::create_directories(elsewhere);
  chmod(elsewhere.c_str(), 0700);
  std::filesystem::create_directory_symlink(elsewhere, dir.path());
  EXPECT_EQ(dumpFlightRecorders("test"), "");
  EXPECT_FALSE(std::filesystem::exists(elsewhere + "/world.rank0.json"));
  std::filesystem::remove(dir.path());
  EXPECT_EQ(dumpFlightRecorders("test"), dir.path());  // made, 0700: written
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/world.rank0.json"));
  unregisterFlightRecorder(&r);
}

// MTXCOMM_FLIGHT_RECORDER=0 records nothing: a fault writes no file.
TEST(FlightRecorder, OffWritesNothing) {
  RecordDir dir;
  Config cfg;
  cfg.flightRecorder = 0;
  cfg.timeoutSeconds = 1;
  testing::runRanks(
      2,
      [](mtxcomm_comm_t c, int rank) {
        std::vector<float> buf(8, 1.0f);
        if (rank == 0) {
          EXPECT_EQ(mtxcomm_allreduce(buf.data(), buf.data(), 8, MTXCOMM_FLOAT32, MTXCOMM_SUM, c,
                                      nullptr),
                    MTXCOMM_TIMEOUT);
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(1300));
        }
        char where[256] = "x";
        EXPECT_EQ(mtxcomm_comm_dump_flight_recorder(c, "asked", where, sizeof(where)),
                  MTXCOMM_SUCCESS);
        EXPECT_STREQ(where, "");
      },
      cfg);
  EXPECT_FALSE(std::filesystem::exists(dir.path()));
}

}  // namespace
}  // namespace mtxcomm
