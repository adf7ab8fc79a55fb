// Tests for the values beyond dense numeric tensors (tensor layer): string tensors (their own
// element storage, casts, .npy as numpy's unicode arrays), bfloat16 (conversions and .npy),
// sequences and optionals (handles, files), and packing any of them into bytes and back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "src/kiln/tensor/npy.h"
#include "src/kiln/tensor/packed_value.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {
namespace {

Tensor F32(Shape shape, std::vector<float> v) { return Tensor::FromVector<float>(shape, v); }

TEST(StringTensor, OwnsCopiesAndCastsItsElements) {
  Tensor s = Tensor::Strings({2}, {"3.5", "héllo"}).value();
  EXPECT_EQ(s.dtype(), DType::kString);
  Tensor c = s.Clone().value();
  c.str(0) = "changed";
  EXPECT_EQ(s.str(0), "3.5");  // a deep copy of every element
  EXPECT_EQ(c.str(1), "héllo");
  EXPECT_EQ(Tensor::FromBytes(DType::kString, {1}, "x", 1).status().code(),
            StatusCode::kInvalidArgument);
  Tensor f = Tensor::Strings({2}, {"3.5", "-inf"}).value().CastTo(DType::kFloat32).value();
  EXPECT_EQ(f.data<float>()[0], 3.5f);
  EXPECT_EQ(f.data<float>()[1], -INFINITY);
  Tensor text = F32({3}, {0.47892547f, 1e-5f, NAN}).CastTo(DType::kString).value();
  EXPECT_EQ(text.str(0), "0.47892547");  // shortest decimal that reads back, as numpy prints
  EXPECT_EQ(text.str(1), "1e-05");
  EXPECT_EQ(text.str(2), "nan");
}

TEST(StringTensor, NpyRoundTripsAsNumpyUnicode) {
  const Tensor s = Tensor::Strings({2, 2}, {"a", "", "Ωmega", "four"}).value();
  const std::string bytes = SerializeNpy(s);
  EXPECT_NE(bytes.find("'descr': '<U5'"), std::string::npos);  // the longest is 5 code points
  Tensor back = ParseNpy(bytes, "mem").value();
  ASSERT_EQ(back.dtype(), DType::kString);
  ASSERT_EQ(back.shape(), (Shape{2, 2}));
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(back.str(i), s.str(i));
}

TEST(BFloat16, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256), 0x3f80);  // a tie goes to even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3.0f / 256), 0x3f82);  // a tie to the even above
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(INFINITY)), INFINITY);
  const Tensor t = F32({2}, {1.5f, -2.0f}).CastTo(DType::kBFloat16).value();
  const Tensor back = ParseNpy(SerializeNpy(t), "mem").value();  // numpy's '<V2'
  EXPECT_EQ(back.dtype(), DType::kBFloat16);
  EXPECT_EQ(back.GetAsDouble(1), -2.0);
}

TEST(ValueKinds, SequencesAndOptionalsAreImmutableHandles) {
  const Tensor a = F32({2}, {1, 2});
  const Tensor seq = Tensor::Sequence(DType::kFloat32, {a, F32({1}, {3})});
  EXPECT_EQ(seq.kind(), ValueKind::kSequence);
  EXPECT_TRUE(seq.valid());
  EXPECT_EQ(seq.numel(), 0);
  EXPECT_EQ(seq.raw_data(), nullptr);
  EXPECT_EQ(seq.TypeString(), "sequence<float32>(2 items)");
  EXPECT_EQ(seq.Reshaped({1}).status().code(), StatusCode::kInvalidArgument);
  const Tensor none = Tensor::Optional(ValueKind::kTensor, DType::kInt64, Tensor());
  EXPECT_TRUE(none.items().empty());
  EXPECT_EQ(none.inner_kind(), ValueKind::kTensor);
  const Tensor some = Tensor::Optional(ValueKind::kSequence, DType::kFloat32, seq);
  EXPECT_EQ(some.kind(), ValueKind::kOptionalSequence);
  EXPECT_EQ(some.items()[0].items().size(), 2u);
}

TEST(ValueKinds, FilesRoundTrip) {
  std::string dir = ::testing::TempDir() + "kiln_values_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const Tensor seq = Tensor::Sequence(DType::kFloat32, {F32({2}, {1, 2}), F32({1}, {3})});
  const std::string path = WriteValue(dir, "s", seq).value();
  EXPECT_EQ(path, dir + "/s");
  EXPECT_TRUE(std::filesystem::exists(dir + "/s/1.npy"));
  const Tensor back = ReadValue(path, ValueKind::kSequence, DType::kFloat32).value();
  ASSERT_EQ(back.items().size(), 2u);
  EXPECT_EQ(back.items()[1].data<float>()[0], 3.0f);
  const Tensor empty_seq = Tensor::Sequence(DType::kInt64, {});
  const Tensor empty_back =
      ReadValue(WriteValue(dir, "e", empty_seq).value(), ValueKind::kSequence, DType::kInt64)
          .value();
  EXPECT_TRUE(empty_back.items().empty());
  const Tensor none = Tensor::Optional(ValueKind::kTensor, DType::kFloat32, Tensor());
  EXPECT_EQ(WriteValue(dir, "o", none).value(), dir + "/o.none");
  EXPECT_TRUE(ReadValue(kNoneValuePath, ValueKind::kOptionalTensor, DType::kFloat32)
                  .value()
                  .items()
                  .empty());
  // A directory that is not a sequence's is refused by name.
  ASSERT_TRUE(std::filesystem::create_directories(dir + "/bad"));
  std::filesystem::copy_file(dir + "/s/0.npy", dir + "/bad/x.npy");
  auto bad = ReadValue(dir + "/bad", ValueKind::kSequence, DType::kFloat32);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'x.npy'"), std::string::npos) << bad.status().message();
  std::filesystem::remove_all(dir);
}

TEST(PackedValue, EveryKindRoundTripsAndDamageIsRefused) {
  const Tensor strings = Tensor::Strings({3}, {"a", "", "ccc"}).value();
  const std::vector<Tensor> values = {
      F32({2, 2}, {1, 2, 3, 4}),
      strings,
      Tensor::Sequence(DType::kFloat32, {F32({1}, {5}), F32({0}, {})}),
      Tensor::Optional(ValueKind::kTensor, DType::kString, strings),
      Tensor::Optional(ValueKind::kSequence, DType::kFloat32, Tensor()),
  };
  for (const Tensor& v : values) {
    const Tensor packed = PackValue(v).value();
    ASSERT_EQ(packed.dtype(), DType::kUInt8);
    const Tensor back = UnpackValue(packed, v.kind(), v.dtype()).value();
    EXPECT_EQ(back.TypeString(), v.TypeString());
    EXPECT_EQ(PackValue(back).value().numel(), packed.numel());
    // Cut short anywhere: an error, never a read past the end.
    for (int64_t cut : {int64_t{0}, int64_t{5}, packed.numel() - 1}) {
      const Tensor short_bytes =
          Tensor::FromBytes(DType::kUInt8, {cut}, packed.raw_data(), static_cast<size_t>(cut))
              .value();
      EXPECT_EQ(UnpackValue(short_bytes, v.kind(), v.dtype()).status().code(),
                StatusCode::kInvalidArgument)
          << v.TypeString() << " cut at " << cut;
    }
  }
  // The declared type must match what the bytes hold.
  const Tensor packed = PackValue(F32({1}, {1})).value();
  auto wrong = UnpackValue(packed, ValueKind::kSequence, DType::kFloat32);
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("expected a sequence"), std::string::npos);
}

}  // namespace
}  // namespace kiln
