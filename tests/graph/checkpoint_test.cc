// Checkpoint binding: replace weights by name with dtype/shape checked, refuse everything else by
// name; derived checkpoints are deterministic.
#include "src/kiln/graph/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>

#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/tensor/safetensors.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::OnnxBuilder;

Graph SmallGraph() {
  OnnxBuilder b;
  b.Input("x", kFloat, {2}).Output("y", kFloat, {2});
  b.FloatInit("w", {2}, {1, 2});
  b.Int64Init("axes", {1}, {0});
  b.Node("Add", {"x", "w"}, {"y"});
  auto g = ImportOnnxBytes(b.Bytes(), "small");
  EXPECT_TRUE(g.ok());
  return *g;
}

TEST(Checkpoint, ReplacesByName) {
  Graph g = SmallGraph();
  auto w = BindCheckpoint(g, {{"w", Tensor::FromVector<float>({2}, {5, 6})}}, "ck");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_FLOAT_EQ(w->at("w").data<float>()[1], 6);
  EXPECT_EQ(w->count("axes"), 0u);  // structural constants are not weights
}

TEST(Checkpoint, RefusesWrongDTypeShapeAndUnknownNames) {
  Graph g = SmallGraph();
  auto dtype = BindCheckpoint(g, {{"w", Tensor::FromVector<int32_t>({2}, {5, 6})}}, "ck.st");
  ASSERT_FALSE(dtype.ok());
  EXPECT_EQ(dtype.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dtype.status().message().find("'w' is int32[2], the graph expects float32[2]"),
            std::string::npos)
      << dtype.status().ToString();
  EXPECT_NE(dtype.status().message().find("ck.st"), std::string::npos);

  auto shape = BindCheckpoint(g, {{"w", Tensor::FromVector<float>({1, 2}, {5, 6})}}, "ck");
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("float32[1,2]"), std::string::npos);

  auto unknown = BindCheckpoint(g, {{"v", Tensor::FromVector<float>({2}, {5, 6})}}, "ck");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("'v'"), std::string::npos);

  auto structural = BindCheckpoint(g, {{"axes", Tensor::FromVector<int64_t>({1}, {1})}}, "ck");
  ASSERT_FALSE(structural.ok());
  EXPECT_NE(structural.status().message().find("structural"), std::string::npos);

  auto incomplete = BindCheckpoint(g, {}, "ck", /*require_complete=*/true);
  ASSERT_FALSE(incomplete.ok());
  EXPECT_NE(incomplete.status().message().find("'w'"), std::string::npos);
}

TEST(Checkpoint, LoadsSafetensorsAndRefusesAMismatchedFile) {
  Graph g = SmallGraph();
  const std::string path = "/tmp/kiln_ckpt_test.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"w", Tensor::FromVector<float>({3}, {1, 2, 3})}}).ok());
  auto bad = LoadCheckpoint(g, path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path), std::string::npos) << bad.status().ToString();
  ASSERT_TRUE(WriteSafetensors(path, {{"w", Tensor::FromVector<float>({2}, {3, 4})}}).ok());
  auto good = LoadCheckpoint(g, path);
  ASSERT_TRUE(good.ok());
  EXPECT_FLOAT_EQ(good->at("w").data<float>()[0], 3);
}

TEST(Checkpoint, DerivedIsDeterministicAndSeedDependent) {
  Graph g = SmallGraph();
  auto a = DeriveCheckpoint(g, 1), b = DeriveCheckpoint(g, 1), c = DeriveCheckpoint(g, 2);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(std::memcmp(a->at("w").raw_data(), b->at("w").raw_data(), 8), 0);
  EXPECT_NE(std::memcmp(a->at("w").raw_data(), c->at("w").raw_data(), 8), 0);
  EXPECT_NE(std::memcmp(a->at("w").raw_data(), g.initializers.at("w").raw_data(), 8), 0);
  EXPECT_TRUE(BindCheckpoint(g, *a, "derived", true).ok());
}

}  // namespace
}  // namespace kiln
