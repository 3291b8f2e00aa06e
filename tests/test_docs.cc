// Documentation kept true: README.md's variable table names every variable of the configuration
// registry and every algorithm (MTXCOMM_SOURCE_DIR: the source tree, set in tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "algos/registry.h"
#include "lib/comm/config.h"

namespace mtxcomm {
namespace {

// The README's variable table is kept true: it names every variable of the registry.
TEST(Docs, ReadmeListsEveryVariable) {
  std::ifstream in(std::string(MTXCOMM_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in.good());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const ConfigVar& v : configVars()) {
    EXPECT_NE(text.find("| `" + v.name + "` |"), std::string::npos) << v.name;
  }
  for (const Algorithm& a : algorithms()) {
    EXPECT_NE(text.find(std::string("`") + a.name + "`"), std::string::npos) << a.name;
  }
}

}  // namespace
}  // namespace mtxcomm
