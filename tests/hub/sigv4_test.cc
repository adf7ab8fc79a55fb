// Tests of SigV4 request signing (src/kiln/hub/sigv4.h) against the worked examples AWS
// publishes for S3 (the "Signature Calculations for the Authorization Header" examples, with the
// documentation's example credentials). An S3 server recomputes exactly these strings; any
// difference in canonicalization is a 403 there and a failure here.
#include "src/kiln/hub/sigv4.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

const char kEmptySha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

SigV4Credentials Example() {
  SigV4Credentials k;
  k.access_key = "AKIAIOSFODNN7EXAMPLE";
  k.secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
  k.region = "us-east-1";
  return k;
}

TEST(SigV4, GetObjectExampleMatchesThePublishedSignature) {
  SigV4Request r;
  r.method = "GET";
  r.path = "/test.txt";
  // Names in mixed case and a value with stray blanks: both are canonicalized before signing.
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"Range", " bytes=0-9 "},
               {"x-amz-content-sha256", kEmptySha},
               {"X-Amz-Date", "20130524T000000Z"}};
  r.payload_sha256 = kEmptySha;
  EXPECT_EQ(SigV4CanonicalRequest(r),
            "GET\n/test.txt\n\n"
            "host:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:" +
                std::string(kEmptySha) +
                "\nx-amz-date:20130524T000000Z\n\n"
                "host;range;x-amz-content-sha256;x-amz-date\n" +
                kEmptySha);
  EXPECT_EQ(SigV4StringToSign(r, Example(), "20130524T000000Z"),
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(SigV4Authorization(r, Example(), "20130524T000000Z"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

// The example of "Authenticating Requests: Using Query Parameters": the whole URL, byte for byte,
// with the published signature.
TEST(SigV4, PresignedUrlExampleMatchesThePublishedSignature) {
  const std::string url = SigV4PresignUrl("GET", "https://examplebucket.s3.amazonaws.com/",
                                          "/test.txt", {}, Example(), "20130524T000000Z", 86400);
  EXPECT_EQ(url,
            "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
            "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
            "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404");
  // The expiry, the host and the path are signed: changing any changes the signature.
  auto signature = [](const std::string& u) { return u.substr(u.rfind('=') + 1); };
  const std::string sig = signature(url);
  EXPECT_NE(signature(SigV4PresignUrl("GET", "https://examplebucket.s3.amazonaws.com", "/test.txt",
                                      {}, Example(), "20130524T000000Z", 86401)),
            sig);
  EXPECT_NE(signature(SigV4PresignUrl("GET", "https://otherbucket.s3.amazonaws.com", "/test.txt",
                                      {}, Example(), "20130524T000000Z", 86400)),
            sig);
  EXPECT_NE(signature(SigV4PresignUrl("GET", "https://examplebucket.s3.amazonaws.com", "/test2.txt",
                                      {}, Example(), "20130524T000000Z", 86400)),
            sig);
  // A session token is a signed query parameter.
  SigV4Credentials session = Example();
  session.session_token = "tok/en+1";
  const std::string with_token =
      SigV4PresignUrl("GET", "https://examplebucket.s3.amazonaws.com", "/test.txt", {}, session,
                      "20130524T000000Z", 86400);
  EXPECT_NE(with_token.find("&X-Amz-Security-Token=tok%2Fen%2B1&"), std::string::npos)
      << with_token;
  EXPECT_NE(signature(with_token), sig);
}

TEST(SigV4, ListObjectsExampleSignsItsSortedQuery) {
  SigV4Request r;
  r.method = "GET";
  r.path = "/";
  r.query = {{"prefix", "J"}, {"max-keys", "2"}};  // out of order on purpose
  r.headers = {{"host", "examplebucket.s3.amazonaws.com"},
               {"x-amz-content-sha256", kEmptySha},
               {"x-amz-date", "20130524T000000Z"}};
  r.payload_sha256 = kEmptySha;
  EXPECT_EQ(SigV4CanonicalQuery(r.query), "max-keys=2&prefix=J");
  const std::string auth = SigV4Authorization(r, Example(), "20130524T000000Z");
  EXPECT_NE(auth.find("Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
            std::string::npos)
      << auth;
}

TEST(SigV4, EncodingKeepsOnlyUnreservedCharacters) {
  EXPECT_EQ(SigV4UriEncode("a b/c~d_e.f-g+h=", false), "a%20b%2Fc~d_e.f-g%2Bh%3D");
  EXPECT_EQ(SigV4UriEncode("pre fix/sha256/ab", true), "pre%20fix/sha256/ab");
  // A flag parameter signs as "name=" and values are encoded.
  EXPECT_EQ(SigV4CanonicalQuery({{"uploadId", "2~a/b+c"}, {"uploads", ""}}),
            "uploadId=2~a%2Fb%2Bc&uploads=");
}

TEST(SigV4, AnyChangeToTheRequestChangesTheSignature) {
  SigV4Request r;
  r.method = "PUT";
  r.path = "/kiln/sha256/ab";
  r.headers = {{"host", "127.0.0.1:8000"}, {"x-amz-date", "20261202T000000Z"}};
  r.payload_sha256 = kEmptySha;
  const std::string base = SigV4Authorization(r, Example(), "20261202T000000Z");
  SigV4Request other = r;
  other.payload_sha256[0] = 'f';
  EXPECT_NE(SigV4Authorization(other, Example(), "20261202T000000Z"), base);
  other = r;
  other.path = "/kiln/sha256/ac";
  EXPECT_NE(SigV4Authorization(other, Example(), "20261202T000000Z"), base);
  SigV4Credentials wrong = Example();
  wrong.secret_key += "x";
  EXPECT_NE(SigV4Authorization(r, wrong, "20261202T000000Z"), base);
}

}  // namespace
}  // namespace kiln
