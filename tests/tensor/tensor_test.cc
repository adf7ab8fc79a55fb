// Tests for DType tables, float16 conversion, shape helpers and Tensor (tensor layer).
#include "src/kiln/tensor/tensor.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

namespace kiln {
namespace {

float Bits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(DTypeTest, SizesNamesAndClasses) {
  struct Case {
    DType t;
    size_t size;
    const char* name;
    bool weight;
    bool is_float;
  };
  const Case cases[] = {
      {DType::kFloat32, 4, "float32", true, true},
      {DType::kFloat16, 2, "float16", true, true},
      {DType::kInt64, 8, "int64", false, false},
      {DType::kInt32, 4, "int32", false, false},
      {DType::kInt8, 1, "int8", true, false},
      {DType::kUInt8, 1, "uint8", true, false},
      {DType::kBool, 1, "bool", false, false},
      {DType::kFloat64, 8, "float64", true, true},
      {DType::kInt16, 2, "int16", false, false},
      {DType::kUInt16, 2, "uint16", false, false},
      {DType::kUInt32, 4, "uint32", false, false},
      {DType::kUInt64, 8, "uint64", false, false},
      {DType::kBFloat16, 2, "bfloat16", true, true},
      {DType::kString, sizeof(std::string), "string", false, false},
  };
  static_assert(sizeof(cases) / sizeof(cases[0]) == kDTypeCount);
  for (const Case& c : cases) {
    EXPECT_EQ(DTypeSize(c.t), c.size) << c.name;
    EXPECT_STREQ(DTypeName(c.t), c.name);
    EXPECT_EQ(IsWeightDType(c.t), c.weight) << c.name;
    EXPECT_EQ(IsFloatDType(c.t), c.is_float) << c.name;
    Result<DType> back = DTypeFromName(c.name);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, c.t);
  }
  Result<DType> bad = DTypeFromName("complex64");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("complex64"), std::string::npos);
  EXPECT_NE(bad.status().message().find("float64"), std::string::npos);  // the list names it
  EXPECT_EQ(DTypeOf<double>::value, DType::kFloat64);
  EXPECT_EQ(DTypeOf<int16_t>::value, DType::kInt16);
  EXPECT_EQ(DTypeOf<uint64_t>::value, DType::kUInt64);
}

// The wider integers: exact reads, integer casts that wrap like C++, float casts that truncate
// and saturate (also at the top of uint64, which a double cannot hold exactly).
// The one ONNX element-type table: every kiln DType has exactly one code, named by ONNX's
// names; codes without a DType (COMPLEX64, the float8s, out of range) map to nothing.
TEST(DTypeTest, OnnxElementTypesMapOneToOne) {
  std::set<DType> seen;
  for (int64_t code = -1; code < 30; ++code) {
    if (std::optional<DType> t = DTypeFromOnnxElemType(code)) {
      EXPECT_TRUE(seen.insert(*t).second) << "two codes for " << DTypeName(*t);
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), kDTypeCount);
  EXPECT_EQ(DTypeFromOnnxElemType(1), DType::kFloat32);
  EXPECT_EQ(DTypeFromOnnxElemType(11), DType::kFloat64);
  EXPECT_EQ(DTypeFromOnnxElemType(13), DType::kUInt64);
  EXPECT_EQ(DTypeFromOnnxElemType(8), DType::kString);
  EXPECT_EQ(DTypeFromOnnxElemType(16), DType::kBFloat16);
  EXPECT_FALSE(DTypeFromOnnxElemType(14).has_value());  // COMPLEX64
  EXPECT_FALSE(DTypeFromOnnxElemType(17).has_value());  // FLOAT8E4M3FN
  EXPECT_STREQ(OnnxElemTypeName(16), "BFLOAT16");
  EXPECT_STREQ(OnnxElemTypeName(999), "unknown");
  EXPECT_EQ(SupportedOnnxElemTypes().rfind("1 FLOAT, 10 FLOAT16, ", 0), 0u);
}

TEST(TensorTest, WideIntegerReadsAndCasts) {
  const uint64_t top = std::numeric_limits<uint64_t>::max();
  Tensor u64 = Tensor::FromVector<uint64_t>({3}, {top, 5, uint64_t{1} << 63});
  EXPECT_EQ(u64.TypeString(), "uint64[3]");
  EXPECT_EQ(u64.GetAsDouble(0), 18446744073709551615.0);
  EXPECT_EQ(u64.GetAsInt64(0), -1);  // wraps, as a C++ conversion does
  Result<Tensor> i64 = u64.CastTo(DType::kInt64);
  ASSERT_TRUE(i64.ok());
  EXPECT_EQ(i64->data<int64_t>()[2], std::numeric_limits<int64_t>::min());
  Result<Tensor> u16 = u64.CastTo(DType::kUInt16);
  ASSERT_TRUE(u16.ok());
  EXPECT_EQ(u16->data<uint16_t>()[0], 0xffff);
  EXPECT_EQ(u16->data<uint16_t>()[1], 5);

  Tensor i16 = Tensor::FromVector<int16_t>({2}, {-32768, 7});
  EXPECT_EQ(i16.GetAsInt64(0), -32768);
  Result<Tensor> as_u32 = i16.CastTo(DType::kUInt32);
  ASSERT_TRUE(as_u32.ok());
  EXPECT_EQ(as_u32->data<uint32_t>()[0], 4294934528u);  // -32768 mod 2^32
  Result<Tensor> as_f = i16.CastTo(DType::kFloat32);
  ASSERT_TRUE(as_f.ok());
  EXPECT_EQ(as_f->data<float>()[0], -32768.0f);

  Tensor f = Tensor::FromVector<float>({4}, {1e30f, -3.7f, 2.9f, std::nanf("")});
  Result<Tensor> fu = f.CastTo(DType::kUInt64);
  ASSERT_TRUE(fu.ok());
  EXPECT_EQ(fu->data<uint64_t>()[0], top);  // saturates instead of overflowing
  EXPECT_EQ(fu->data<uint64_t>()[1], 0u);
  EXPECT_EQ(fu->data<uint64_t>()[2], 2u);
  EXPECT_EQ(fu->data<uint64_t>()[3], 0u);
  Result<Tensor> fi = f.CastTo(DType::kInt64);
  ASSERT_TRUE(fi.ok());
  EXPECT_EQ(fi->data<int64_t>()[0], std::numeric_limits<int64_t>::max());
}

TEST(TensorTest, Float64CastsRoundTripAndKeepPrecision) {
  const double third = 1.0 / 3.0;
  Tensor d = Tensor::FromVector<double>({5}, {third, -2.5, 1e300, 0.0, std::nan("")});
  EXPECT_EQ(d.nbytes(), 40u);
  EXPECT_EQ(d.TypeString(), "float64[5]");
  EXPECT_EQ(d.GetAsDouble(0), third);  // no float32 rounding on the way
  EXPECT_EQ(d.GetAsInt64(1), -2);

  Result<Tensor> f = d.CastTo(DType::kFloat32);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->data<float>()[0], static_cast<float>(third));
  EXPECT_TRUE(std::isinf(f->data<float>()[2]));  // beyond float32 range
  Result<Tensor> back = f->CastTo(DType::kFloat64);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dtype(), DType::kFloat64);
  EXPECT_EQ(back->data<double>()[1], -2.5);
  EXPECT_EQ(back->data<double>()[0], static_cast<double>(static_cast<float>(third)));

  Result<Tensor> i = d.CastTo(DType::kInt32);
  ASSERT_TRUE(i.ok());
  EXPECT_EQ(i->data<int32_t>()[1], -2);                                   // truncates
  EXPECT_EQ(i->data<int32_t>()[2], std::numeric_limits<int32_t>::max());  // saturates
  EXPECT_EQ(i->data<int32_t>()[4], 0);                                    // NaN -> 0

  Tensor big = Tensor::FromVector<int64_t>({2}, {(int64_t{1} << 53) + 0, -7});
  Result<Tensor> wide = big.CastTo(DType::kFloat64);
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ(wide->data<double>()[0], 9007199254740992.0);
  EXPECT_EQ(wide->data<double>()[1], -7.0);

  Result<Tensor> h = d.CastTo(DType::kFloat16);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->data<uint16_t>()[1], FloatToHalf(-2.5f));
  Result<Tensor> hb = h->CastTo(DType::kFloat64);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->data<double>()[1], -2.5);

  Result<Tensor> b = d.CastTo(DType::kBool);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data<uint8_t>()[3], 0);
  EXPECT_EQ(b->data<uint8_t>()[0], 1);
}

TEST(Float16Test, KnownValues) {
  struct Case {
    float f;
    uint16_t h;
  };
  const Case cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.5f, 0x3800},
      {65504.0f, 0x7bff},                  // largest finite
      {std::ldexp(1.0f, -14), 0x0400},     // smallest normal
      {std::ldexp(1.0f, -24), 0x0001},     // smallest subnormal
      {std::ldexp(1023.0f, -24), 0x03ff},  // largest subnormal
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToHalf(c.f), c.h) << c.f;
    EXPECT_EQ(std::bit_cast<uint32_t>(HalfToFloat(c.h)), std::bit_cast<uint32_t>(c.f)) << c.h;
  }
}

TEST(Float16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -10) * 0.75f), 0x3c01);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the rounding midpoint
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);     // overflow -> inf
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);   // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);   // tie -> even subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -30)), 0x0000);   // underflow -> zero
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -30)), 0x8000);  // keeps the sign
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24) * 1.5f), 0x0002);
}

TEST(Float16Test, NanStaysNan) {
  const uint16_t h = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(h & 0x7c00, 0x7c00);
  EXPECT_NE(h & 0x03ff, 0);
  EXPECT_TRUE(std::isnan(HalfToFloat(h)));
  // A NaN whose payload sits only in the low float bits must not collapse to infinity.
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(Bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(HalfToFloat(0xfe00)));
}

TEST(Float16Test, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t u = 0; u <= 0xffff; ++u) {
    const uint16_t h = static_cast<uint16_t>(u);
    const float f = HalfToFloat(h);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << u;
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << u;
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << u;
    }
  }
}

TEST(ShapeTest, Helpers) {
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  EXPECT_EQ(NumElements({2, 0, 4}), 0);
  EXPECT_EQ(ShapeToString({1, 3, 224, 224}), "[1,3,224,224]");
  EXPECT_EQ(ShapeToString({}), "[]");
  EXPECT_EQ(ContiguousStrides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(ContiguousStrides({}), std::vector<int64_t>{});
}

TEST(ShapeTest, BroadcastShapes) {
  EXPECT_EQ(*BroadcastShapes({2, 1, 3}, {4, 1}), (Shape{2, 4, 3}));
  EXPECT_EQ(*BroadcastShapes({}, {5}), (Shape{5}));
  EXPECT_EQ(*BroadcastShapes({3, 1}, {1}), (Shape{3, 1}));
  EXPECT_EQ(*BroadcastShapes({0, 1}, {1, 7}), (Shape{0, 7}));
  EXPECT_EQ(BroadcastStrides({4, 1}, {2, 4, 3}), (std::vector<int64_t>{0, 1, 0}));
}

TEST(ShapeTest, BroadcastErrorNamesBothShapesAndTheDim) {
  Result<Shape> r = BroadcastShapes({2, 3}, {4, 3});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string m = r.status().message();
  EXPECT_NE(m.find("[2,3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4,3]"), std::string::npos) << m;
  EXPECT_NE(m.find("dim 0"), std::string::npos) << m;
}

TEST(ShapeTest, NormalizeAxis) {
  EXPECT_EQ(*NormalizeAxis(-1, 4, "Softmax 'sm'"), 3);
  EXPECT_EQ(*NormalizeAxis(2, 4, "x"), 2);
  Result<int64_t> r = NormalizeAxis(4, 4, "Softmax 'sm'");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Softmax 'sm'"), std::string::npos);
  EXPECT_NE(r.status().message().find("4"), std::string::npos);
  EXPECT_FALSE(NormalizeAxis(-5, 4, "x").ok());
}

TEST(TensorTest, EmptyIsZeroFilledAndAligned) {
  Result<Tensor> t = Tensor::Empty(DType::kFloat32, {3, 5});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->valid());
  EXPECT_EQ(t->numel(), 15);
  EXPECT_EQ(t->nbytes(), 60u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw_data()) % 64, 0u);
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(t->data<float>()[i], 0.0f);
  EXPECT_EQ(t->TypeString(), "float32[3,5]");
  EXPECT_FALSE(Tensor().valid());

  Result<Tensor> zero = Tensor::Empty(DType::kInt64, {0, 4});
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero->valid());
  EXPECT_EQ(zero->nbytes(), 0u);

  Result<Tensor> neg = Tensor::Empty(DType::kFloat32, {2, -1});
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(neg.status().message().find("[2,-1]"), std::string::npos);
}

TEST(TensorTest, CopiesShareAndCloneIsDeep) {
  Tensor a = Tensor::FromVector<float>({2}, {1.0f, 2.0f});
  Tensor shared = a;
  Result<Tensor> deep = a.Clone();
  ASSERT_TRUE(deep.ok());
  a.data<float>()[0] = 9.0f;
  EXPECT_EQ(shared.data<float>()[0], 9.0f);
  EXPECT_EQ(deep->data<float>()[0], 1.0f);
}

TEST(TensorTest, FromBytesChecksSize) {
  const int32_t v[3] = {1, -2, 3};
  Result<Tensor> t = Tensor::FromBytes(DType::kInt32, {3}, v, sizeof(v));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->ToInt64Vector(), (std::vector<int64_t>{1, -2, 3}));
  Result<Tensor> bad = Tensor::FromBytes(DType::kInt32, {4}, v, sizeof(v));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("int32[4]"), std::string::npos);
  EXPECT_NE(bad.status().message().find("16"), std::string::npos);
}

TEST(TensorTest, ViewKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{4.0f, 5.0f, 6.0f});
  std::weak_ptr<std::vector<float>> weak = owner;
  Tensor v = Tensor::View(DType::kFloat32, {3}, owner, owner->data());
  owner.reset();
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(v.data<float>()[2], 6.0f);
  v = Tensor();
  EXPECT_TRUE(weak.expired());
}

TEST(TensorTest, ReshapedSharesBytesOrNamesTheMismatch) {
  Tensor a = Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 3, 4, 5});
  Result<Tensor> r = a.Reshaped({3, 2});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->shape(), (Shape{3, 2}));
  EXPECT_EQ(r->raw_data(), a.raw_data());

  Result<Tensor> bad = a.Reshaped({4});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  const std::string m = bad.status().message();
  EXPECT_NE(m.find("int64[2,3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4]"), std::string::npos) << m;
}

TEST(TensorTest, CastToFollowsOnnxCast) {
  Tensor f = Tensor::FromVector<float>({6}, {-1.7f, 2.9f, 0.0f, 0.25f, 3e9f, NAN});

  Result<Tensor> i32 = f.CastTo(DType::kInt32);
  ASSERT_TRUE(i32.ok());
  EXPECT_EQ(i32->dtype(), DType::kInt32);
  const int32_t* p = i32->data<int32_t>();
  EXPECT_EQ(p[0], -1);  // truncates toward zero
  EXPECT_EQ(p[1], 2);
  EXPECT_EQ(p[2], 0);
  EXPECT_EQ(p[3], 0);
  EXPECT_EQ(p[4], std::numeric_limits<int32_t>::max());  // saturates
  EXPECT_EQ(p[5], 0);                                    // NaN -> 0

  Result<Tensor> b = f.CastTo(DType::kBool);
  ASSERT_TRUE(b.ok());
  const uint8_t* pb = b->data<uint8_t>();
  EXPECT_EQ(std::vector<uint8_t>(pb, pb + 6), (std::vector<uint8_t>{1, 1, 0, 1, 1, 1}));

  Result<Tensor> h = f.CastTo(DType::kFloat16);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->data<uint16_t>()[2], 0x0000);
  EXPECT_EQ(h->data<uint16_t>()[3], 0x3400);
  EXPECT_EQ(h->data<uint16_t>()[4], 0x7c00);  // beyond half range -> inf
  Result<Tensor> back = h->CastTo(DType::kFloat32);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data<float>()[3], 0.25f);

  Tensor ints = Tensor::FromVector<int64_t>({3}, {-3, 0, 300});
  Result<Tensor> u8 = ints.CastTo(DType::kUInt8);
  ASSERT_TRUE(u8.ok());
  EXPECT_EQ(u8->data<uint8_t>()[2], static_cast<uint8_t>(300 & 0xff));  // int -> int wraps
  Result<Tensor> fl = ints.CastTo(DType::kFloat32);
  ASSERT_TRUE(fl.ok());
  EXPECT_EQ(fl->data<float>()[0], -3.0f);

  Result<Tensor> same = ints.CastTo(DType::kInt64);
  ASSERT_TRUE(same.ok());
  EXPECT_NE(same->raw_data(), ints.raw_data());  // a copy, not an alias
}

TEST(TensorTest, ScalarAndGetters) {
  Tensor s = Tensor::Scalar<float>(2.5f);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.GetAsDouble(0), 2.5);
  EXPECT_EQ(s.GetAsInt64(0), 2);
  EXPECT_EQ(s.TypeString(), "float32[]");
}

}  // namespace
}  // namespace kiln
