// The conformance regression gate: every (mode, case) in tests/conformance/baseline.txt must
// still pass. The cases are generated at test time into the build directory by the
// conformance_cases CTest fixture (tests/conformance/generate_cases.py); new passes are printed
// with the command that records them (`bash tools/conformance.sh --update`), never a failure.
// Both halves run in the sanitizer build too: its eager half takes about a second there, and the
// compiled half's time is the system compiler building cells, which the sanitizer does not slow.
#include "tests/conformance/conformance.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace kiln::conformance {
namespace {

// Writes one case directory as generate_cases.py does: y = Abs(x) over float32 [3].
void WriteAbsCase(const std::string& dir, const std::string& op, std::vector<float> x,
                  std::vector<float> want) {
  std::filesystem::create_directories(dir + "/test_data_set_0");
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("case");
  auto* n = g->add_node();
  n->set_op_type(op);
  n->add_input("x");
  n->add_output("y");
  for (const char* name : {"x", "y"}) {
    auto* vi = std::string(name) == "x" ? g->add_input() : g->add_output();
    vi->set_name(name);
    vi->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    vi->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(3);
  }
  std::ofstream(dir + "/model.onnx", std::ios::binary) << m.SerializeAsString();
  auto write = [&](const std::string& file, const char* name, const std::vector<float>& v) {
    onnx::TensorProto t;
    t.set_name(name);
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_dims(3);
    t.set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
    std::ofstream(dir + "/test_data_set_0/" + file, std::ios::binary) << t.SerializeAsString();
  };
  write("input_0.pb", "x", x);
  write("output_0.pb", "y", want);
}

// The runner itself: a match within tolerance (NaN equal to NaN) passes, a wrong value fails
// naming output, index, got and want in both modes, an unlisted op is excluded, and the
// baseline diff reports a lost pass and a new one.
TEST(Conformance, RunnerPassesFailsAndExcludes) {
  char tmpl[] = "/tmp/kiln-conformance-self-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  const float nan = std::nanf("");
  WriteAbsCase(root + "/test_ok", "Abs", {-1, nan, 2}, {1, nan, 2.0015f});
  WriteAbsCase(root + "/test_bad", "Abs", {-1, nan, 2}, {1, nan, 3});
  WriteAbsCase(root + "/test_unlisted", "NoSuchOp", {1, 2, 3}, {1, 2, 3});
  std::ofstream(root + "/index.tsv") << "# test\n"
                                     << "test_bad\tAbs\t13\t0.001\t1e-07\n"
                                     << "test_ok\tAbs\t13\t0.001\t1e-07\n"
                                     << "test_unlisted\tNoSuchOp\t13\t0.001\t1e-07\n";
  auto cases = ReadIndex(root);
  ASSERT_TRUE(cases.ok()) << cases.status().ToString();
  ASSERT_EQ(cases->size(), 3u);
  RunOptions options;
  options.work_dir = root;
  const std::vector<CaseResult> r = RunCases(*cases, options);
  ASSERT_EQ(r.size(), 3u);
  for (const ModeResult* m : {&r[0].eager, &r[0].compiled}) {
    EXPECT_EQ(m->outcome, Outcome::kFail);
    EXPECT_EQ(m->detail, "output 'y' [2]: got 2, want 3");
  }
  EXPECT_EQ(r[1].eager.outcome, Outcome::kPass) << r[1].eager.detail;
  EXPECT_EQ(r[1].compiled.outcome, Outcome::kPass) << r[1].compiled.detail;
  EXPECT_FALSE(r[2].op_listed);
  EXPECT_EQ(r[2].eager.outcome, Outcome::kExcluded);
  EXPECT_EQ(r[2].eager.detail, "op not listed as supported");

  const BaselineDiff diff = DiffBaseline(r, {"eager test_bad", "eager test_gone"}, false);
  ASSERT_EQ(diff.regressions.size(), 2u);
  EXPECT_EQ(diff.regressions[0], "eager test_bad: fail: output 'y' [2]: got 2, want 3");
  EXPECT_EQ(diff.regressions[1], "eager test_gone: no such case was generated");
  ASSERT_FALSE(diff.new_passes.empty());
  EXPECT_EQ(diff.new_passes[0], "compiled test_ok");
  const Summary s = Summarize(r);
  EXPECT_EQ(s.total, 3);
  EXPECT_EQ(s.listed, 2);
  EXPECT_EQ(s.listed_eager_pass, 1);
  std::filesystem::remove_all(root);
}

// A shape computed from an input (y = Reshape(x, Add(s, zero)), as a function expansion writes
// it): compiled mode binds the input the shape comes from, s, as a constant, so the case
// compiles instead of being excluded as data-dependent.
TEST(Conformance, CompiledModeBindsTheInputsAShapeIsComputedFrom) {
  char tmpl[] = "/tmp/kiln-conformance-shape-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  const std::string dir = root + "/test_computed_shape";
  std::filesystem::create_directories(dir + "/test_data_set_0");
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("case");
  auto* zero = g->add_initializer();
  zero->set_name("zero");
  zero->set_data_type(onnx::TensorProto::INT64);
  zero->add_dims(2);
  zero->add_int64_data(0);
  zero->add_int64_data(0);
  auto* add = g->add_node();
  add->set_op_type("Add");
  add->add_input("s");
  add->add_input("zero");
  add->add_output("shape");
  auto* reshape = g->add_node();
  reshape->set_op_type("Reshape");
  reshape->add_input("x");
  reshape->add_input("shape");
  reshape->add_output("y");
  auto declare = [](onnx::ValueInfoProto* vi, const char* name, int elem,
                    std::vector<int64_t> dims) {
    vi->set_name(name);
    vi->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
    for (int64_t d : dims) {
      vi->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
    }
  };
  declare(g->add_input(), "x", onnx::TensorProto::FLOAT, {6});
  declare(g->add_input(), "s", onnx::TensorProto::INT64, {2});
  declare(g->add_output(), "y", onnx::TensorProto::FLOAT, {2, 3});
  std::ofstream(dir + "/model.onnx", std::ios::binary) << m.SerializeAsString();
  auto write = [&](const std::string& file, const char* name, int elem, std::vector<int64_t> dims,
                   const std::string& bytes) {
    onnx::TensorProto t;
    t.set_name(name);
    t.set_data_type(elem);
    for (int64_t d : dims) t.add_dims(d);
    t.set_raw_data(bytes);
    std::ofstream(dir + "/test_data_set_0/" + file, std::ios::binary) << t.SerializeAsString();
  };
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> shape = {2, 3};
  const std::string xb(reinterpret_cast<const char*>(x.data()), x.size() * 4);
  write("input_0.pb", "x", onnx::TensorProto::FLOAT, {6}, xb);
  write("input_1.pb", "s", onnx::TensorProto::INT64, {2},
        std::string(reinterpret_cast<const char*>(shape.data()), shape.size() * 8));
  write("output_0.pb", "y", onnx::TensorProto::FLOAT, {2, 3}, xb);
  std::ofstream(root + "/index.tsv") << "# test\n"
                                     << "test_computed_shape\tReshape\t13\t0.001\t1e-07\n";
  auto cases = ReadIndex(root);
  ASSERT_TRUE(cases.ok()) << cases.status().ToString();
  RunOptions options;
  options.work_dir = root;
  const std::vector<CaseResult> r = RunCases(*cases, options);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].eager.outcome, Outcome::kPass) << r[0].eager.detail;
  EXPECT_EQ(r[0].compiled.outcome, Outcome::kPass) << r[0].compiled.detail;
  std::filesystem::remove_all(root);
}

std::string SourcePath(const char* file) {
  return (std::filesystem::path(KILN_SOURCE_DIR) / "tests" / "conformance" / file).string();
}

TEST(Conformance, BaselineCasesStillPass) {
  const char* env = std::getenv("KILN_CONFORMANCE_CASES");
  const std::string cases_dir = env != nullptr ? env : KILN_CONFORMANCE_CASES;
  auto cases = ReadIndex(cases_dir);
  ASSERT_TRUE(cases.ok()) << cases.status().ToString()
                          << "\n(the conformance_cases CTest fixture generates them: "
                             "`ctest -R conformance`, or `bash tools/conformance.sh`)";
  auto baseline = ReadBaseline(SourcePath("baseline.txt"));
  ASSERT_TRUE(baseline.ok()) << baseline.status().ToString();

  RunOptions options;
  auto skip = ReadSkipFile(SourcePath("skip.txt"));
  ASSERT_TRUE(skip.ok()) << skip.status().ToString();
  options.skip = *skip;
  char tmpl[] = "/tmp/kiln-conformance-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  options.work_dir = tmpl;
  const std::vector<CaseResult> results = RunCases(*cases, options);
  std::filesystem::remove_all(options.work_dir);
  std::cout << "conformance: " << SummaryLine(Summarize(results)) << "\n";

  const BaselineDiff diff = DiffBaseline(results, *baseline, /*compiled_ran=*/true);
  for (const auto& l : diff.new_passes) std::cout << "conformance: newly passing: " << l << "\n";
  if (!diff.new_passes.empty()) {
    std::cout << "conformance: " << diff.new_passes.size()
              << " (mode, case) pairs pass that the baseline lacks; record them with "
                 "`bash tools/conformance.sh --update`\n";
  }
  for (const auto& l : diff.regressions) ADD_FAILURE() << "no longer passes: " << l;
}

}  // namespace
}  // namespace kiln::conformance
