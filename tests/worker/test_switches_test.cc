// Tests for the test-only fault switch's parser (src/kiln/worker/test_switches.h): a malformed
// value is an error naming the item, never a silently ignored switch.
#include "src/kiln/worker/test_switches.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(TestSwitches, ParsesTargetsFaultsAndRequestNumbers) {
  auto spec = ParseCellFaultSpec("mlp:oom@1,mlp:fault@3,enc:fault@2");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_EQ(spec->size(), 2u);
  EXPECT_EQ(spec->at("mlp").at(1), kCellOom);
  EXPECT_EQ(spec->at("mlp").at(3), kCellFault);
  EXPECT_EQ(spec->at("enc").at(2), kCellFault);
}

TEST(TestSwitches, MalformedItemsAreNamed) {
  for (const char* bad : {"mlp", "mlp:oom", "mlp:crash@1", "mlp:oom@0", "mlp:oom@x", ":oom@1"}) {
    auto spec = ParseCellFaultSpec(bad);
    ASSERT_FALSE(spec.ok()) << bad;
    EXPECT_NE(spec.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << spec.status().ToString();
  }
}

}  // namespace
}  // namespace kiln
