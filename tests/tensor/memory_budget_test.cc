// Tests for checked tensor sizes and the per-request memory budget (tensor/memory_budget.h), and
// Tensor::Empty's use of them: a size computed from values is checked before anything is
// allocated, refused `request_too_large` (InvalidArgument) when it does not fit, and a budget is
// charged while the storage lives and refunded when it goes.
#include "src/kiln/tensor/memory_budget.h"

#include <gtest/gtest.h>

#include <limits>
#include <thread>
#include <vector>

#include "src/kiln/tensor/tensor.h"

namespace kiln {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

void ExpectTooLarge(const Status& s, const std::string& names) {
  EXPECT_TRUE(s.Is(kRefusalRequestTooLarge)) << s.ToString();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(names), std::string::npos) << names << " not in " << s.ToString();
}

TEST(CheckedSize, ArithmeticRefusesWhatWouldWrap) {
  EXPECT_EQ(*CheckedMul(3037000499, 3037000499, "x"), 9223372030926249001);
  ExpectTooLarge(CheckedMul(3037000500, 3037000500, "Tile 't'").status(), "Tile 't'");
  ExpectTooLarge(CheckedMul(4, int64_t{1} << 62, "dim").status(), "4611686018427387904");
  EXPECT_EQ(*CheckedMul(0, kMax, "x"), 0);
  EXPECT_EQ(*CheckedAdd(kMax - 1, 1, "x"), kMax);
  ExpectTooLarge(CheckedAdd(kMax, 1, "Concat 'c'").status(), "int64 bound");
}

TEST(CheckedSize, ElementCountsAndByteSizes) {
  EXPECT_EQ(*CheckedNumElements({}), 1);
  EXPECT_EQ(*CheckedNumElements({2, 3, 4}), 24);
  // A zero dim makes the count 0 whatever the others are: nothing to overflow.
  EXPECT_EQ(*CheckedNumElements({int64_t{1} << 62, 0, int64_t{1} << 62}), 0);
  ExpectTooLarge(CheckedNumElements({3037000500, 3037000500}).status(), "[3037000500,3037000500]");
  EXPECT_EQ(CheckedNumElements({2, -1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(CheckedNumElements({2, -1}).status().Is(kRefusalRequestTooLarge));

  EXPECT_EQ(*CheckedNumBytes(DType::kFloat32, {2, 3}), 24);
  // 2^62 elements fit int64; 2^62 floats' bytes do not (the worker's old segfault: the byte size
  // wrapped to 0 and a 64-byte buffer was written 2^62 times).
  EXPECT_EQ(*CheckedNumElements({int64_t{1} << 62}), int64_t{1} << 62);
  ExpectTooLarge(CheckedNumBytes(DType::kFloat32, {int64_t{1} << 62}).status(),
                 "float32[4611686018427387904]");
  ExpectTooLarge(CheckedNumBytes(DType::kInt64, {int64_t{1} << 61}).status(), "int64");
  EXPECT_EQ(*CheckedNumBytes(DType::kUInt8, {int64_t{1} << 62}), int64_t{1} << 62);
}

TEST(MemoryBudget, ChargesRefundsAndRefusesNamingTheBound) {
  MemoryBudget b(1000);
  ASSERT_TRUE(b.Charge(600, "a").ok());
  EXPECT_EQ(b.in_use(), 600);
  Status s = b.Charge(500, "float32[125]");
  ExpectTooLarge(s, "float32[125]");
  for (const char* part : {"500 bytes", "budget of 1000 bytes", "600 in use"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << ": " << s.ToString();
  }
  EXPECT_EQ(b.in_use(), 600) << "a refusal charges nothing";
  ASSERT_TRUE(b.Charge(400, "b").ok());
  EXPECT_FALSE(b.Charge(1, "c").ok());
  b.Refund(1000);
  EXPECT_EQ(b.in_use(), 0);
  EXPECT_EQ(b.peak(), 1000);
  ExpectTooLarge(b.Charge(kMax, "huge"), "huge");
}

TEST(MemoryBudget, ConcurrentChargesNeverPassTheLimit) {
  MemoryBudget b(64 * 1000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&b] {
      for (int i = 0; i < 2000; ++i) {
        if (b.Charge(1000, "x").ok()) b.Refund(1000);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(b.in_use(), 0);
  EXPECT_LE(b.peak(), b.limit());
}

TEST(MemoryBudget, EmptyChecksBeforeAllocatingAndRefundsWhenTheStorageGoes) {
  auto budget = std::make_shared<MemoryBudget>(int64_t{1} << 20);
  {
    Result<Tensor> t = Tensor::Empty(DType::kFloat32, {256, 256}, budget);  // 256 KiB
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(budget->in_use(), 256 * 1024);
    Tensor shared = *t;  // a copy shares the storage: still charged once
    EXPECT_EQ(budget->in_use(), 256 * 1024);
    Result<Tensor> over = Tensor::Empty(DType::kFloat32, {1024, 1024}, budget);  // 4 MiB
    ExpectTooLarge(over.status(), "float32[1024,1024]");
    EXPECT_EQ(budget->in_use(), 256 * 1024);
  }
  EXPECT_EQ(budget->in_use(), 0) << "the storage was freed, so its charge is refunded";

  // Without a budget the size is still checked: no wrapped allocation, whatever the machine.
  ExpectTooLarge(Tensor::Empty(DType::kFloat32, {int64_t{1} << 62}).status(), "float32");
  ExpectTooLarge(Tensor::Empty(DType::kFloat32, {3037000500, 3037000500}).status(),
                 "[3037000500,3037000500]");
  // An empty tensor with huge dims is fine: it holds nothing.
  Result<Tensor> empty = Tensor::Empty(DType::kFloat32, {0, int64_t{1} << 62}, budget);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->nbytes(), 0u);
  // Reshaped counts the new shape checked too: [3037000500, 3037000500] does not wrap into a
  // count that could equal 4.
  const Tensor four = Tensor::FromVector<float>({4}, {1, 2, 3, 4});
  ExpectTooLarge(four.Reshaped({3037000500, 3037000500}).status(), "[3037000500,3037000500]");
}

TEST(MemoryBudget, DefaultIsAShareOfTheMachine) {
  const int64_t usable = UsableMemoryBytes();
  ASSERT_GT(usable, 0) << "/proc/meminfo should be readable here";
  const int64_t one = DefaultRequestMemoryBytes(1);
  const int64_t four = DefaultRequestMemoryBytes(4);
  EXPECT_GE(one, int64_t{64} << 20);
  EXPECT_LE(one, usable);
  EXPECT_GE(one, four);
  if (usable / 8 > (int64_t{64} << 20)) {
    EXPECT_EQ(four, usable / 2 / 4);
  }
}

}  // namespace
}  // namespace kiln
