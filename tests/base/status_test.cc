// Tests for Status/Result and the error-propagation macros (base layer), plus log levels.
#include "src/kiln/base/status.h"

#include <gtest/gtest.h>

#include <string>

#include "src/kiln/base/log.h"

namespace kiln {
namespace {

TEST(StatusTest, OkIsDefaultAndCarriesNoMessage) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(Status::OK().ok());
}

TEST(StatusTest, NamedConstructorsSetCodeAndMessage) {
  struct Case {
    Status status;
    StatusCode code;
    const char* name;
  };
  const Case cases[] = {
      {Status::InvalidArgument("a"), StatusCode::kInvalidArgument, "invalid_argument"},
      {Status::NotFound("a"), StatusCode::kNotFound, "not_found"},
      {Status::Unimplemented("a"), StatusCode::kUnimplemented, "unimplemented"},
      {Status::Corruption("a"), StatusCode::kCorruption, "corruption"},
      {Status::IOError("a"), StatusCode::kIOError, "io_error"},
      {Status::ResourceExhausted("a"), StatusCode::kResourceExhausted, "resource_exhausted"},
      {Status::Internal("a"), StatusCode::kInternal, "internal"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_EQ(c.status.message(), "a");
    EXPECT_STREQ(StatusCodeName(c.code), c.name);
    EXPECT_EQ(c.status.ToString(), std::string(c.name) + ": a");
  }
}

TEST(StatusTest, CopyAndMovePreserveTheError) {
  Status a = Status::NotFound("file 'x' does not exist");
  Status b = a;
  EXPECT_EQ(b.code(), StatusCode::kNotFound);
  EXPECT_EQ(b.message(), a.message());
  Status c = std::move(b);
  EXPECT_EQ(c.message(), "file 'x' does not exist");
  Status d;
  d = c;
  EXPECT_EQ(d.code(), StatusCode::kNotFound);
  d = Status::OK();
  EXPECT_TRUE(d.ok());
}

TEST(StatusTest, WithContextPrefixesErrorsAndKeepsOk) {
  Status s = Status::Corruption("bad magic").WithContext("cell 'ck1-ab'");
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(), "cell 'ck1-ab': bad magic");
  EXPECT_TRUE(Status::OK().WithContext("anything").ok());
}

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("x=" + std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  KILN_ASSIGN_OR_RETURN(int h, Half(x));
  KILN_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  KILN_RETURN_IF_ERROR(Half(x).status());
  return Status::OK();
}

TEST(StatusTest, RefusedCarriesItsTokenAsData) {
  const Status s = Status::Refused(StatusCode::kInvalidArgument, "key_mismatch", "metadata says x");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.token(), "key_mismatch");
  EXPECT_EQ(s.message(), "key_mismatch: metadata says x");
  EXPECT_TRUE(s.Is("key_mismatch"));
  EXPECT_FALSE(s.Is("key"));
  // Context, copies and moves keep the token; the message gains the context only.
  Status wrapped = s.WithContext("cell 'ck1-x'");
  EXPECT_EQ(wrapped.token(), "key_mismatch");
  EXPECT_EQ(wrapped.message(), "cell 'ck1-x': key_mismatch: metadata says x");
  Status copy = wrapped;
  Status moved = std::move(wrapped);
  EXPECT_EQ(copy.token(), "key_mismatch");
  EXPECT_EQ(moved.token(), "key_mismatch");
  // A plain error has none, whatever its message says; OK has none.
  EXPECT_EQ(Status::InvalidArgument("key_mismatch: spoofed").token(), "");
  EXPECT_FALSE(Status::InvalidArgument("key_mismatch: spoofed").Is("key_mismatch"));
  EXPECT_EQ(Status::OK().token(), "");
  EXPECT_FALSE(Status::OK().Is("key_mismatch"));
}

TEST(ResultTest, HoldsValueOrError) {
  Result<int> ok = Half(8);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 4);
  EXPECT_TRUE(ok.status().ok());

  Result<int> err = Half(3);
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(err.status().message(), "x=3 is odd");
}

TEST(ResultTest, MacrosPropagateTheFirstError) {
  EXPECT_EQ(*Quarter(12), 3);
  Result<int> r = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "x=3 is odd");
  EXPECT_TRUE(CheckEven(2).ok());
  EXPECT_EQ(CheckEven(1).code(), StatusCode::kInvalidArgument);
}

TEST(ResultTest, OkStatusWithoutValueBecomesInternal) {
  Result<int> r(Status::OK());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultTest, MoveOnlyValues) {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(7));
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

TEST(ResultDeathTest, ValueOnErrorAbortsWithTheMessage) {
  Result<int> r = Status::NotFound("missing thing");
  EXPECT_DEATH((void)r.value(), "missing thing");
}

// log.h has no test file of its own yet; its level handling is checked here.
TEST(LogTest, ParsesLevelNames) {
  EXPECT_EQ(ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(ParseLogLevel("INFO"), LogLevel::kInfo);
  EXPECT_EQ(ParseLogLevel("warn"), LogLevel::kWarning);
  EXPECT_EQ(ParseLogLevel("Warning"), LogLevel::kWarning);
  EXPECT_EQ(ParseLogLevel("error"), LogLevel::kError);
  EXPECT_EQ(ParseLogLevel("off"), LogLevel::kOff);
  EXPECT_EQ(ParseLogLevel("verbose"), std::nullopt);
  EXPECT_EQ(ParseLogLevel(""), std::nullopt);
}

TEST(LogTest, ThresholdFiltersAndSkipsEvaluation) {
  const LogLevel saved = GetLogLevel();
  SetLogLevel(LogLevel::kWarning);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };

  testing::internal::CaptureStderr();
  KILN_LOG(INFO) << "hidden " << count();
  KILN_LOG(WARNING) << "shown " << count();
  LogError("plain error");
  LogInfo("plain info");
  const std::string err = testing::internal::GetCapturedStderr();
  SetLogLevel(saved);

  EXPECT_EQ(evaluated, 1);  // the INFO operands were never evaluated
  EXPECT_EQ(err.find("hidden"), std::string::npos);
  EXPECT_EQ(err.find("plain info"), std::string::npos);
  EXPECT_NE(err.find("kiln W "), std::string::npos) << err;
  EXPECT_NE(err.find("status_test.cc:"), std::string::npos) << err;
  EXPECT_NE(err.find("] shown 1\n"), std::string::npos) << err;
  EXPECT_NE(err.find("kiln E "), std::string::npos) << err;
  EXPECT_NE(err.find("] plain error\n"), std::string::npos) << err;
}

TEST(LogTest, OffSilencesEverything) {
  const LogLevel saved = GetLogLevel();
  SetLogLevel(LogLevel::kOff);
  testing::internal::CaptureStderr();
  KILN_LOG(ERROR) << "nope";
  LogError("nope");
  const std::string err = testing::internal::GetCapturedStderr();
  SetLogLevel(saved);
  EXPECT_EQ(err, "");
}

}  // namespace
}  // namespace kiln
