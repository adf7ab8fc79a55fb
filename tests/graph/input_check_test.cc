// MatchInput (graph/input_check.h): the one input check behind the interpreter's and the KServe
// front end's refusals.
#include "src/kiln/graph/input_check.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

Graph TwoInputs() {
  Graph g;
  ValueInfo x;
  x.name = "x";
  x.dtype = DType::kFloat32;
  x.has_shape = true;
  x.dims = {Dim{-1, "batch"}, Dim{4, ""}};
  ValueInfo ids;
  ids.name = "ids";
  ids.dtype = DType::kInt64;  // no declared shape: any rank fits
  g.inputs = {x, ids};
  return g;
}

TEST(InputCheck, EachMismatchIsNamedWithTheDeclaredInput) {
  const Graph g = TwoInputs();
  using Kind = InputMismatch::Kind;
  EXPECT_TRUE(MatchInput(g, "x", DType::kFloat32, {7, 4}).ok());
  EXPECT_TRUE(MatchInput(g, "ids", DType::kInt64, {1, 2, 3}).ok());
  EXPECT_EQ(MatchInput(g, "y", DType::kFloat32, {1, 4}).kind, Kind::kUnknown);
  EXPECT_EQ(MatchInput(g, "y", DType::kFloat32, {1, 4}).declared, nullptr);
  const InputMismatch dtype = MatchInput(g, "x", DType::kInt64, {1, 4});
  EXPECT_EQ(dtype.kind, Kind::kDType);
  EXPECT_EQ(dtype.declared->name, "x");
  EXPECT_EQ(MatchInput(g, "x", DType::kFloat32, {4}).kind, Kind::kRank);
  const InputMismatch dim = MatchInput(g, "x", DType::kFloat32, {2, 5});
  EXPECT_EQ(dim.kind, Kind::kDim);
  EXPECT_EQ(dim.dim, 1u);
  EXPECT_EQ(DeclaredInputNames(g), "x, ids");
}

}  // namespace
}  // namespace kiln
