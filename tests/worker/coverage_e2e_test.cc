// Partial coverage with real processes (docs/design.md "Partial coverage"): a target declares
// three shape classes and the compiler refuses one (the test switch KILN_TEST_UNCOMPILABLE_CLASS,
// compile/pipeline.h). The cell minted for it carries the other two and records the third as a
// gap; an optional target arms it, the census row says `compiled=2/3` and names the gap, the two
// classes are served compiled and the third eager with `entry_not_compiled`, after a restart too.
// A mandatory target fails closed unless its manifest says `coverage = "partial"`, and a worker
// whose compiler does compile the gap class refuses the cell (a cell cannot drop a class).
// A ranged entry beside the classes is compiled and served over its range, or (refused by the
// same switch) is a gap served eager and named.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures

// The mlp example declares x = [1,64], [4,64], [16,64]; the compiler is told to refuse [4,64].
constexpr const char* kGap = "{x=[4,64]}";

std::map<std::string, std::string> GapEnv() { return {{"KILN_TEST_UNCOMPILABLE_CLASS", kGap}}; }

Worker::Answer InferBatch(const Worker& w, int64_t batch) {
  std::vector<float> data;
  for (int64_t i = 0; i < batch * 64; ++i) data.push_back(static_cast<float>(i % 7) / 7.0f - 0.5f);
  return w.Infer("mlp", {{"x", Tensor::FromVector<float>({batch, 64}, data)}});
}

int CountRows(const Worker& w, const std::string& kind, const std::string& phase) {
  int n = 0;
  for (const Row& r : w.Rows()) n += r.kind == kind && r.phase == phase;
  return n;
}

// Waits until more than `before` rows of kind/phase are on disk; the newest one.
::testing::AssertionResult WaitForNewRow(const Worker& w, const std::string& kind,
                                         const std::string& phase, int before, int timeout_ms,
                                         Row* found) {
  for (int waited = 0; waited <= timeout_ms; waited += 50) {
    std::vector<Row> rows;
    for (const Row& r : w.Rows()) {
      if (r.kind == kind && r.phase == phase) rows.push_back(r);
    }
    if (static_cast<int>(rows.size()) > before) {
      *found = rows.back();
      return ::testing::AssertionSuccess();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return ::testing::AssertionFailure()
         << "no new " << kind << "/" << phase << " row after " << timeout_ms << " ms; the log:\n"
         << w.Log();
}

// The manifest of the mlp example with `line` added to its target table.
std::string ManifestWith(ManifestOptions o, const std::string& line) {
  std::string text = Manifest(o);
  const size_t at = text.find("\nexport = { family = \"");
  if (at != std::string::npos) text.insert(at, "\n" + line);
  return text;
}

// Answers of the two compiled classes come from the cell, the gap's from eager and named, and an
// undeclared shape is still out_of_envelope (served eager on an optional lane, refused by name on
// a mandatory one).
void ExpectServedAsCovered(const Worker& w, const std::string& ref, bool mandatory = false) {
  for (int64_t batch : {1, 16}) {
    auto a = InferBatch(w, batch);
    ASSERT_EQ(a.status, 200) << a.body.dump();
    EXPECT_EQ(a.mode(), "aot_cell") << "batch " << batch << ": " << a.body.dump();
    if (!ref.empty()) {
      EXPECT_EQ(a.ref(), ref);
    }
  }
  auto gap = InferBatch(w, 4);
  ASSERT_EQ(gap.status, 200) << gap.body.dump();
  EXPECT_EQ(gap.mode(), "eager");
  EXPECT_EQ(gap.reason(), "entry_not_compiled") << gap.body.dump();
  auto undeclared = InferBatch(w, 2);
  if (mandatory) {
    EXPECT_EQ(undeclared.status, 400) << undeclared.body.dump();
    EXPECT_EQ(undeclared.body.value("token", ""), "out_of_envelope");
  } else {
    ASSERT_EQ(undeclared.status, 200) << undeclared.body.dump();
    EXPECT_EQ(undeclared.reason(), "out_of_envelope");
  }
  EXPECT_GE(CountRows(w, "ingress_refused", "entry_not_compiled"), 1);
  // Still armed after both: the next compiled request is the cell's.
  EXPECT_EQ(InferBatch(w, 1).mode(), "aot_cell");
}

class Coverage : public MachinesTest {};

TEST_F(Coverage, AnOptionalTargetArmsTwoOfThreeClassesAndSaysSoAtMintAndAtBoot) {
  const std::string dir = root_ + "/machine";
  std::string ref;
  {
    Worker w(dir, Manifest(ManifestOptions{}), GapEnv());
    ASSERT_TRUE(w.Start());
    Row census;
    ASSERT_TRUE(WaitForNewRow(w, "compiled_shape_coverage", "partial", 0, 180000, &census));
    EXPECT_TRUE(DetailNames(census, "compiled=2/3"));
    EXPECT_TRUE(DetailNames(census, std::string("missing=") + kGap));
    EXPECT_TRUE(DetailNames(census, "refused by the test switch"));
    Row armed;
    ASSERT_TRUE(w.WaitForRow("local_cell_armed", "armed", 10000, &armed));
    auto first = InferBatch(w, 1);
    ref = first.ref();
    ASSERT_FALSE(ref.empty()) << first.body.dump();
    ExpectServedAsCovered(w, ref);
    EXPECT_EQ(w.Stop(), 0);
  }
  // The restart adopts the partial cell from the local store, as is: same ref, same census.
  Worker again(dir, Manifest(ManifestOptions{}), GapEnv());
  const int before = CountRows(again, "compiled_shape_coverage", "partial");
  ASSERT_TRUE(again.Start());
  Row census;
  ASSERT_TRUE(WaitForNewRow(again, "compiled_shape_coverage", "partial", before, 10000, &census));
  EXPECT_TRUE(DetailNames(census, "compiled=2/3"));
  EXPECT_TRUE(DetailNames(census, std::string("missing=") + kGap));
  Row boot;
  ASSERT_TRUE(WaitForNewRow(again, "boot_adopt", "local_hit", 0, 10000, &boot));
  ExpectServedAsCovered(again, ref);
  EXPECT_EQ(again.Stop(), 0);

  // A worker whose compiler compiles [4,64] does not believe the gap: the stored cell is refused
  // by provenance (it dropped a class this compiler serves) and never arms.
  Worker honest(dir, Manifest(ManifestOptions{}));
  const int refused_before = CountRows(honest, "boot_adopt", "source_mismatch");
  ASSERT_TRUE(honest.Start());
  Row refused;
  ASSERT_TRUE(
      WaitForNewRow(honest, "boot_adopt", "source_mismatch", refused_before, 10000, &refused));
  EXPECT_TRUE(DetailNames(refused, "compiles here"));
  EXPECT_NE(InferBatch(honest, 1).ref(), ref);
  honest.Stop();
}

TEST_F(Coverage, AMandatoryTargetFailsClosedUnlessItsManifestAcceptsPartialCells) {
  const std::string dir = root_ + "/machine";
  ManifestOptions o;
  o.lane = "mandatory";
  {
    Worker w(dir, Manifest(o), GapEnv());
    ASSERT_TRUE(w.Start());
    // The mint stores the partial cell, but the target requires every class: nothing arms.
    ASSERT_TRUE(w.WaitForRow("serve_posture", "coverage_incomplete", 180000)) << w.Log();
    ASSERT_TRUE(w.WaitForRow("local_cell_armed", "arm_refused", 10000));
    EXPECT_EQ(CountRows(w, "compiled_shape_coverage", "partial"), 0);
    for (int64_t batch : {1, 4}) {
      auto a = InferBatch(w, batch);
      EXPECT_EQ(a.status, 503) << "batch " << batch << ": " << a.body.dump();
    }
    EXPECT_FALSE(w.MapsACell());
    EXPECT_EQ(w.Stop(), 0);
  }
  {
    // A restart finds it in the local store and still refuses it, before loading anything.
    Worker w(dir, Manifest(o), GapEnv());
    ASSERT_TRUE(w.Start());
    Row boot;
    ASSERT_TRUE(WaitForNewRow(w, "boot_adopt", "coverage_incomplete", 0, 10000, &boot));
    EXPECT_TRUE(DetailNames(boot, "compiled=2/3"));
    EXPECT_FALSE(w.MapsACell());
    EXPECT_EQ(w.Stop(), 0);
  }
  // The manifest says partial cells are acceptable: the same cell arms, the gap serves eager.
  Worker w(dir, ManifestWith(o, "coverage = \"partial\""), GapEnv());
  const int before = CountRows(w, "compiled_shape_coverage", "partial");
  ASSERT_TRUE(w.Start());
  Row census;
  ASSERT_TRUE(WaitForNewRow(w, "compiled_shape_coverage", "partial", before, 10000, &census));
  EXPECT_TRUE(DetailNames(census, "compiled=2/3"));
  ExpectServedAsCovered(w, "", /*mandatory=*/true);
  EXPECT_EQ(w.Stop(), 0);
}

// The mlp manifest with its last class replaced by a ranged entry, batch in [5, 16].
std::string RangedManifest() {
  std::string text = Manifest(ManifestOptions{});
  const std::string last = "  { x = [16, 64] },\n";
  if (text.find(last) == std::string::npos) return text;
  text.replace(text.find(last), last.size(),
               "  { x = [\"batch\", 64], ranges = { batch = [5, 16] } },\n");
  return text;
}

constexpr const char* kRanged = "{x=[batch,64] batch=[5,16]}";

// A ranged entry beside two classes, compiled: the cell carries the classes and the ranged
// entry's code, which serves every batch of its range compiled (each answer the cell's, by ref);
// past the range the request is served eager as declared_range_exceeded and the cell stays armed.
// A restart adopts the same cell from the local store: the worker regenerates its source, ranged
// entry included, and it is the cell's.
TEST_F(Coverage, ARangedEntryIsServedCompiledInsideItsRangeAndEagerPastIt) {
  const std::string dir = root_ + "/machine";
  std::string ref;
  for (int boot = 0; boot < 2; ++boot) {
    Worker w(dir, RangedManifest());
    ASSERT_TRUE(w.Start());
    Row armed;
    ASSERT_TRUE(w.WaitForRow("local_cell_armed", "armed", 180000, &armed)) << w.Log();
    if (boot == 1) {
      Row adopted;
      ASSERT_TRUE(WaitForNewRow(w, "boot_adopt", "local_hit", 0, 10000, &adopted));
    }
    EXPECT_EQ(CountRows(w, "compiled_shape_coverage", "partial"), 0) << w.Log();
    for (int64_t batch : {1, 4, 5, 8, 11, 16}) {
      auto a = InferBatch(w, batch);
      ASSERT_EQ(a.status, 200) << a.body.dump();
      EXPECT_EQ(a.mode(), "aot_cell") << "batch " << batch << ": " << a.body.dump();
      if (ref.empty()) ref = a.ref();
      EXPECT_EQ(a.ref(), ref) << "batch " << batch;
    }
    auto past = InferBatch(w, 17);
    ASSERT_EQ(past.status, 200) << past.body.dump();
    EXPECT_EQ(past.mode(), "eager");
    EXPECT_EQ(past.reason(), "declared_range_exceeded") << past.body.dump();
    EXPECT_NE(past.body.dump().find("symbol 'batch' is 17"), std::string::npos) << past.body.dump();
    EXPECT_GE(CountRows(w, "ingress_refused", "declared_range_exceeded"), 1);
    EXPECT_EQ(InferBatch(w, 9).mode(), "aot_cell") << "the cell did not stay armed";
    EXPECT_EQ(w.Stop(), 0);
  }
}

// A ranged entry the compiler refuses (the test switch names it) is the cell's gap: the census
// says 2/3 and names it with the compiler's reason, requests inside its range are served eager as
// entry_not_compiled and past it as declared_range_exceeded, the cell staying armed; a restart
// adopts the same cell from the local store (the gap re-derived by provenance).
TEST_F(Coverage, ARangedEntryTheCompilerRefusesIsAGapCheckedAtIngress) {
  const std::string dir = root_ + "/machine";
  const std::map<std::string, std::string> env = {{"KILN_TEST_UNCOMPILABLE_CLASS", kRanged}};
  std::string ref;
  for (int boot = 0; boot < 2; ++boot) {
    Worker w(dir, RangedManifest(), env);
    const int before = CountRows(w, "compiled_shape_coverage", "partial");
    ASSERT_TRUE(w.Start());
    Row census;
    ASSERT_TRUE(WaitForNewRow(w, "compiled_shape_coverage", "partial", before, 180000, &census));
    EXPECT_TRUE(DetailNames(census, "compiled=2/3"));
    EXPECT_TRUE(DetailNames(census, std::string("missing=") + kRanged));
    EXPECT_TRUE(DetailNames(census, "refused by the test switch"));
    if (boot == 1) {
      Row adopted;
      ASSERT_TRUE(WaitForNewRow(w, "boot_adopt", "local_hit", 0, 10000, &adopted));
    }
    auto compiled = InferBatch(w, 4);
    ASSERT_EQ(compiled.status, 200) << compiled.body.dump();
    EXPECT_EQ(compiled.mode(), "aot_cell") << compiled.body.dump();
    if (boot == 0) ref = compiled.ref();
    EXPECT_EQ(compiled.ref(), ref);
    auto inside = InferBatch(w, 8);
    ASSERT_EQ(inside.status, 200) << inside.body.dump();
    EXPECT_EQ(inside.reason(), "entry_not_compiled") << inside.body.dump();
    auto past = InferBatch(w, 17);
    ASSERT_EQ(past.status, 200) << past.body.dump();
    EXPECT_EQ(past.mode(), "eager");
    EXPECT_EQ(past.reason(), "declared_range_exceeded") << past.body.dump();
    EXPECT_GE(CountRows(w, "ingress_refused", "declared_range_exceeded"), 1);
    EXPECT_EQ(InferBatch(w, 1).mode(), "aot_cell") << "the cell did not stay armed";
    EXPECT_EQ(w.Stop(), 0);
  }
}

}  // namespace
}  // namespace kiln
