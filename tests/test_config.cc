// The configuration registry: a bad value fails naming the variable and the value, values are
// parsed and normalised, unknown MTXCOMM_* names are reported, every variable has help text, and
// bindings read the normalised values through the C API.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/test_util.h"
#include "lib/base/error.h"
#include "lib/comm/config.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace {

using testutil::contains;

TEST(Config, BadValuesNameTheVariable) {
  struct Case {
    const char* var;
    const char* value;
  } cases[] = {{"MTXCOMM_TIMEOUT", "abc"},
               {"MTXCOMM_TIMEOUT", "-1"},
               {"MTXCOMM_LOG_LEVEL", "LOUD"},
               {"MTXCOMM_SEGMENT_BYTES", "12Q"},
               {"MTXCOMM_SEGMENT_BYTES", "1"},
               {"MTXCOMM_ALLREDUCE_ALGO", "nonsense"},
               {"MTXCOMM_TRANSPORT", "carrier_pigeon"},
               {"MTXCOMM_STORE", "http://x"},
               {"MTXCOMM_RANK", "-3"},
               {"MTXCOMM_UCX_EAGER_LIMIT", "2G"},
               {"MTXCOMM_UCX_EAGER_LIMIT", "lots"},
               // Only plain decimal numbers: strtod alone took hexadecimal and a leading space,
               // strtol a '+' and spaces.
               {"MTXCOMM_TIMEOUT", "0x10"},
               {"MTXCOMM_TIMEOUT", "0x1p3"},
               {"MTXCOMM_TIMEOUT", " 5"},
               {"MTXCOMM_TIMEOUT", "5 "},
               {"MTXCOMM_TIMEOUT", "+5"},
               {"MTXCOMM_TIMEOUT", "inf"},
               {"MTXCOMM_TIMEOUT", "1e"},
               {"MTXCOMM_RANK", " 1"},
               {"MTXCOMM_RANK", "+1"},
               {"MTXCOMM_SEGMENT_BYTES", "1.5M"}};
  for (const Case& c : cases) {
    setenv(c.var, c.value, 1);
    try {
      Config::fromEnvironment();
      ADD_FAILURE() << c.var << "=" << c.value << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_INVALID_USAGE);
      EXPECT_TRUE(contains(e.what(), c.var)) << e.what();
      EXPECT_TRUE(contains(e.what(), c.value)) << e.what();
    }
    unsetenv(c.var);
  }
  setenv("MTXCOMM_ALLREDUCE_ALGO", "nonsense", 1);
  try {
    Config::fromEnvironment();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "ring|recursive_doubling|rabenseifner")) << e.what();
  }
  unsetenv("MTXCOMM_ALLREDUCE_ALGO");
}

TEST(Config, ValuesAreParsedAndUnknownNamesReported) {
  setenv("MTXCOMM_TIMEOUT", "2.5", 1);
  setenv("MTXCOMM_SEGMENT_BYTES", "64K", 1);
  setenv("MTXCOMM_BROADCAST_ALGO", "scatter_allgather", 1);
  setenv("MTXCOMM_TIMEOUTT", "1", 1);
  setenv("MTXCOMM_UCX_EAGER_LIMIT", "256K", 1);
  setenv("MTXCOMM_TCP_IFADDR", "127.0.0.1", 1);
  Config c = Config::fromEnvironment();
  EXPECT_EQ(c.timeoutSeconds, 2.5);
  EXPECT_EQ(c.segmentBytes, 65536u);
  EXPECT_EQ(c.ucxEagerLimit, 262144u);
  EXPECT_EQ(c.tcpIfaddr, "127.0.0.1");
  EXPECT_EQ(c.algorithmFor(Collective::kBroadcast), "scatter_allgather");
  auto unknown = Config::unknownVariables();
  EXPECT_NE(std::find(unknown.begin(), unknown.end(), "MTXCOMM_TIMEOUTT"), unknown.end());
  bool echoed = false;
  for (const auto& line : c.describe()) echoed = echoed || line == "MTXCOMM_SEGMENT_BYTES=65536";
  EXPECT_TRUE(echoed);
  EXPECT_EQ(std::find(unknown.begin(), unknown.end(), "MTXCOMM_TCP_IFADDR"), unknown.end());
  for (const char* v : {"MTXCOMM_TIMEOUT", "MTXCOMM_SEGMENT_BYTES", "MTXCOMM_BROADCAST_ALGO",
                        "MTXCOMM_TIMEOUTT", "MTXCOMM_UCX_EAGER_LIMIT", "MTXCOMM_TCP_IFADDR"})
    unsetenv(v);
  // Plain decimal forms of seconds.
  for (const auto& [text, value] : {std::pair<const char*, double>{".5", 0.5},
                                    {"30", 30.0},
                                    {"1e1", 10.0},
                                    {"2.", 2.0},
                                    {"5E-1", 0.5}}) {
    setenv("MTXCOMM_TIMEOUT", text, 1);
    EXPECT_EQ(Config::fromEnvironment().timeoutSeconds, value) << text;
  }
  unsetenv("MTXCOMM_TIMEOUT");
  // Every variable in the registry has help text and a type.
  for (const ConfigVar& v : configVars()) {
    EXPECT_FALSE(v.help.empty()) << v.name;
    EXPECT_FALSE(v.type.empty()) << v.name;
  }
}

TEST(Config, TheShmSlotFollowsTheL2CacheWithinItsBounds) {
  constexpr size_t K = 1024;
  EXPECT_EQ(defaultShmSlotBytes(0, 2), 256 * K);  // unknown L2: the old fixed default
  EXPECT_EQ(defaultShmSlotBytes(128 * K, 2), 256 * K);
  EXPECT_EQ(defaultShmSlotBytes(512 * K, 4), 512 * K);
  EXPECT_EQ(defaultShmSlotBytes(768 * K, 2), 768 * K);
  EXPECT_EQ(defaultShmSlotBytes(1024 * K, 2), 1024 * K);
  EXPECT_EQ(defaultShmSlotBytes(1280 * K, 2), 1024 * K);  // Ice Lake's 1.25 MiB
  EXPECT_EQ(defaultShmSlotBytes(2048 * K, 2), 1024 * K);
  // The segment stays within 32 MiB: 16 ranks x 2 x 1 MiB fits, 17 halve the slot, 64 and more
  // keep 256 KiB (the segment then grows with the ranks, as before).
  EXPECT_EQ(defaultShmSlotBytes(1024 * K, 16), 1024 * K);
  EXPECT_EQ(defaultShmSlotBytes(1024 * K, 17), 512 * K);
  EXPECT_EQ(defaultShmSlotBytes(1024 * K, 64), 256 * K);
  EXPECT_EQ(defaultShmSlotBytes(1024 * K, 500), 256 * K);
  EXPECT_EQ(defaultShmSlotBytes(1000 * K + 5, 2) % 4096, 0u);
  // A small /dev/shm: the segment takes at most half of its free space (of 48 MiB free, 16
  // ranks get 512 KiB slots, a 16 MiB segment), and 256 KiB where even that does not fit.
  EXPECT_EQ(defaultShmSlotBytes(1024 * K, 2, 64 * K * K), 1024 * K);
  EXPECT_EQ(defaultShmSlotBytes(1024 * K, 16, 48 * K * K), 512 * K);
  EXPECT_EQ(defaultShmSlotBytes(1024 * K, 2, 2 * K * K), 256 * K);
  EXPECT_EQ(defaultShmSlotBytes(1024 * K, 2, 0), 256 * K);
  // The reductions' chunk: half the slot only where that half (at least 512 KiB) fits in the L2
  // four times and the whole slot does not.
  EXPECT_EQ(shmReductionChunkBytes(1024 * K, 2048 * K), 512 * K);   // Xeon, 2 MiB of L2
  EXPECT_EQ(shmReductionChunkBytes(1024 * K, 1024 * K), 1024 * K);  // Zen 4: L3-bound either way
  EXPECT_EQ(shmReductionChunkBytes(1024 * K, 1280 * K), 1024 * K);
  EXPECT_EQ(shmReductionChunkBytes(1024 * K, 4096 * K), 1024 * K);  // the whole slot fits
  EXPECT_EQ(shmReductionChunkBytes(512 * K, 2048 * K), 512 * K);    // half would be < 512 KiB
  EXPECT_EQ(shmReductionChunkBytes(256 * K, 0), 256 * K);           // unknown L2
  EXPECT_EQ(shmReductionChunkBytes(1000 * K, 2048 * K) % 4096, 0u);
  setenv("MTXCOMM_SHM_SLOT_BYTES", "auto", 1);
  EXPECT_EQ(Config::fromEnvironment().shmSlotBytes, 0u);
  setenv("MTXCOMM_SHM_SLOT_BYTES", "64K", 1);
  EXPECT_EQ(Config::fromEnvironment().shmSlotBytes, 64 * K);
  // A count whose multiple wraps around 2^64, and a leading space, are refused.
  for (const char* bad : {"18014398509481988K", "17592186044417M", " 1M", "+1M"}) {
    setenv("MTXCOMM_SHM_SLOT_BYTES", bad, 1);
    EXPECT_THROW(Config::fromEnvironment(), Error) << bad;
  }
  unsetenv("MTXCOMM_SHM_SLOT_BYTES");
  EXPECT_EQ(Config::fromEnvironment().shmSlotBytes, 0u);
  // The reductions' chunk: auto, or a size that forces one chunking whatever the L2.
  EXPECT_EQ(Config::fromEnvironment().shmReductionChunkBytes, 0u);
  setenv("MTXCOMM_SHM_CHUNK_BYTES", "512K", 1);
  EXPECT_EQ(Config::fromEnvironment().shmReductionChunkBytes, 512 * K);
  setenv("MTXCOMM_SHM_CHUNK_BYTES", "auto", 1);
  EXPECT_EQ(Config::fromEnvironment().shmReductionChunkBytes, 0u);
  for (const char* bad : {"1K", "65M", "half"}) {
    setenv("MTXCOMM_SHM_CHUNK_BYTES", bad, 1);
    EXPECT_THROW(Config::fromEnvironment(), Error) << bad;
  }
  unsetenv("MTXCOMM_SHM_CHUNK_BYTES");
}

TEST(Config, BindingsReadNormalisedValuesThroughTheCApi) {
  char buf[64];
  ASSERT_EQ(mtxcomm_config_get("MTXCOMM_FUSION_BYTES", buf, sizeof(buf)), MTXCOMM_SUCCESS);
  EXPECT_STREQ(buf, "67108864");  // the default, 64M
  setenv("MTXCOMM_FUSION_BYTES", "2K", 1);
  setenv("MTXCOMM_CYCLE_TIME", "0.005", 1);
  ASSERT_EQ(mtxcomm_config_get("MTXCOMM_FUSION_BYTES", buf, sizeof(buf)), MTXCOMM_SUCCESS);
  EXPECT_STREQ(buf, "2048");
  ASSERT_EQ(mtxcomm_config_get("MTXCOMM_CYCLE_TIME", buf, sizeof(buf)), MTXCOMM_SUCCESS);
  EXPECT_STREQ(buf, "0.005");
  EXPECT_EQ(mtxcomm_config_get("MTXCOMM_CYCLE_TIME", buf, 3), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_config_get("MTXCOMM_NO_SUCH", buf, sizeof(buf)), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mtxcomm_get_last_error(nullptr)).find("MTXCOMM_NO_SUCH"),
            std::string::npos);
  setenv("MTXCOMM_CYCLE_TIME", "2", 1);  // above the 1 s limit
  EXPECT_EQ(mtxcomm_config_get("MTXCOMM_CYCLE_TIME", buf, sizeof(buf)), MTXCOMM_INVALID_USAGE);
  EXPECT_NE(std::string(mtxcomm_get_last_error(nullptr)).find("MTXCOMM_CYCLE_TIME"),
            std::string::npos);
  unsetenv("MTXCOMM_FUSION_BYTES");
  unsetenv("MTXCOMM_CYCLE_TIME");
  // Seconds read back exactly (a stream's 6 digits made 1234567.5 into 1.23457e+06).
  setenv("MTXCOMM_STALL_TIMEOUT", "1234567.5", 1);
  ASSERT_EQ(mtxcomm_config_get("MTXCOMM_STALL_TIMEOUT", buf, sizeof(buf)), MTXCOMM_SUCCESS);
  EXPECT_EQ(std::strtod(buf, nullptr), 1234567.5) << buf;
  unsetenv("MTXCOMM_STALL_TIMEOUT");
}

}  // namespace
}  // namespace mtxcomm
