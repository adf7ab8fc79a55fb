// Tests of receipts (src/kiln/receipt/receipt.h): base64url, JWS EdDSA sign/verify, every refusal
// token of the offline check, JWKS parsing, and the persisted key ring with rotation.
#include "src/kiln/receipt/receipt.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"

namespace kiln {
namespace {

ReceiptClaims SampleClaims() {
  ReceiptClaims c;
  c.key = "ck1-" + std::string(56, 'a');
  c.digest = "sha256:" + std::string(64, 'b');
  c.size = 4096;
  c.family = "root/micro-mlp";
  c.publisher = "ci";
  c.tier = "platform";
  c.release = "r1";
  c.iat = 1700000000;
  return c;
}

ExpectedClaims ExpectedOf(const ReceiptClaims& c) {
  return ExpectedClaims{c.key, c.digest, c.size, c.family};
}

PublicKeySet Trust(const SigningKey& k) {
  PublicKeySet s;
  EXPECT_TRUE(s.AddRaw(k.raw_public()).ok());
  return s;
}

// Splits a JWS into its three parts.
std::vector<std::string> Parts(const std::string& jws) {
  const size_t a = jws.find('.'), b = jws.find('.', a + 1);
  return {jws.substr(0, a), jws.substr(a + 1, b - a - 1), jws.substr(b + 1)};
}

TEST(Base64Url, RoundTripsAllLengthsWithoutPadding) {
  std::string bytes;
  for (int i = 0; i < 70; ++i) {
    const std::string enc = Base64UrlEncode(bytes);
    EXPECT_EQ(enc.find('='), std::string::npos);
    auto dec = Base64UrlDecode(enc, "t");
    ASSERT_TRUE(dec.ok()) << dec.status().ToString();
    EXPECT_EQ(*dec, bytes);
    bytes.push_back(static_cast<char>(i * 37 + 251));
  }
  EXPECT_EQ(Base64UrlEncode("\xfb\xff"), "-_8");
}

TEST(Base64Url, RefusesPaddingAndForeignCharacters) {
  EXPECT_FALSE(Base64UrlDecode("YQ==", "t").ok());
  EXPECT_FALSE(Base64UrlDecode("a+b/", "t").ok());
  EXPECT_FALSE(Base64UrlDecode("a", "t").ok());
  EXPECT_FALSE(Base64UrlDecode("YR", "t").ok());  // non-zero trailing bits
}

TEST(Receipt, SignedReceiptVerifiesAndCarriesItsClaims) {
  auto key = SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  const ReceiptClaims c = SampleClaims();
  auto jws = SignReceipt(c, *key);
  ASSERT_TRUE(jws.ok());
  auto header = ParseJson(Base64UrlDecode(Parts(*jws)[0], "h").value(), "h").value();
  EXPECT_EQ(header["alg"], "EdDSA");
  EXPECT_EQ(header["typ"], "kiln-receipt");
  EXPECT_EQ(header["kid"], key->kid());
  ReceiptVerdict v = VerifyReceipt(*jws, Trust(*key), ExpectedOf(c));
  ASSERT_TRUE(v.ok()) << v.token << ": " << v.message;
  EXPECT_EQ(v.claims, c);
  EXPECT_EQ(v.kid, key->kid());
  EXPECT_EQ(key->kid().size(), 16u);
}

TEST(Receipt, AlteredClaimIsRefusedAsBadSignature) {
  auto key = SigningKey::Generate().value();
  const ReceiptClaims c = SampleClaims();
  auto parts = Parts(SignReceipt(c, key).value());
  ReceiptClaims altered = c;
  altered.size = 1;  // a publisher lying about the size after the fact
  const std::string forged = parts[0] + "." +
                             Base64UrlEncode(CanonicalJson(ClaimsToJson(altered)).value()) + "." +
                             parts[2];
  ReceiptVerdict v = VerifyReceipt(forged, Trust(key), ExpectedClaims{});
  EXPECT_EQ(v.token, "receipt_bad_signature") << v.message;
}

TEST(Receipt, ForeignSignatureIsRefused) {
  auto hub = SigningKey::Generate().value();
  auto foreign = SigningKey::Generate().value();
  const ReceiptClaims c = SampleClaims();
  // Signed by an untrusted key: unknown kid.
  ReceiptVerdict v = VerifyReceipt(SignReceipt(c, foreign).value(), Trust(hub), ExpectedOf(c));
  EXPECT_EQ(v.token, "receipt_unknown_kid") << v.message;
  // Signed by an untrusted key that claims the trusted kid: bad signature.
  auto parts = Parts(SignReceipt(c, foreign).value());
  const std::string header = Base64UrlEncode(
      CanonicalJson({{"alg", "EdDSA"}, {"kid", hub.kid()}, {"typ", "kiln-receipt"}}).value());
  const std::string input = header + "." + parts[1];
  const std::string jws = input + "." + Base64UrlEncode(foreign.Sign(input).value());
  v = VerifyReceipt(jws, Trust(hub), ExpectedOf(c));
  EXPECT_EQ(v.token, "receipt_bad_signature") << v.message;
}

TEST(Receipt, AlgNoneAndOtherAlgorithmsAreRefused) {
  auto key = SigningKey::Generate().value();
  const ReceiptClaims c = SampleClaims();
  auto parts = Parts(SignReceipt(c, key).value());
  for (const char* alg : {"none", "HS256", "ES256"}) {
    const std::string header = Base64UrlEncode(
        CanonicalJson({{"alg", alg}, {"kid", key.kid()}, {"typ", "kiln-receipt"}}).value());
    ReceiptVerdict v =
        VerifyReceipt(header + "." + parts[1] + "." + (std::string(alg) == "none" ? "" : parts[2]),
                      Trust(key), ExpectedOf(c));
    EXPECT_EQ(v.token, "receipt_alg_refused") << alg << ": " << v.message;
  }
}

TEST(Receipt, ClaimMismatchNamesTheClaim) {
  auto key = SigningKey::Generate().value();
  const ReceiptClaims c = SampleClaims();
  const std::string jws = SignReceipt(c, key).value();
  ExpectedClaims e = ExpectedOf(c);
  e.digest = "sha256:" + std::string(64, 'c');
  ReceiptVerdict v = VerifyReceipt(jws, Trust(key), e);
  EXPECT_EQ(v.token, "receipt_claim_mismatch");
  EXPECT_NE(v.message.find("'digest'"), std::string::npos) << v.message;
  e = ExpectedOf(c);
  e.family = "acme/other";
  EXPECT_EQ(VerifyReceipt(jws, Trust(key), e).token, "receipt_claim_mismatch");
  e = ExpectedOf(c);
  e.size = 4097;
  EXPECT_EQ(VerifyReceipt(jws, Trust(key), e).token, "receipt_claim_mismatch");
  e = ExpectedOf(c);
  e.key = "ck1-" + std::string(56, 'f');
  EXPECT_EQ(VerifyReceipt(jws, Trust(key), e).token, "receipt_claim_mismatch");
}

TEST(Receipt, MalformedReceiptsAreRefusedAsSuch) {
  auto key = SigningKey::Generate().value();
  for (const char* bad : {"", "a.b", "a.b.c.d", "!!.!!.!!", "e30.e30.AAAA"}) {
    ReceiptVerdict v = VerifyReceipt(bad, Trust(key), ExpectedClaims{});
    EXPECT_FALSE(v.ok()) << bad;
    EXPECT_TRUE(v.token == "receipt_malformed" || v.token == "receipt_alg_refused") << bad;
  }
}

TEST(PublicKeySet, JwksRoundTripAndLyingKidRefused) {
  auto a = SigningKey::Generate().value();
  auto b = SigningKey::Generate().value();
  PublicKeySet s;
  ASSERT_TRUE(s.AddRaw(a.raw_public()).ok());
  ASSERT_TRUE(s.AddRaw(b.raw_public()).ok());
  auto back = PublicKeySet::FromJwks(s.ToJwks());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->Has(a.kid()));
  EXPECT_TRUE(back->Has(b.kid()));
  nlohmann::json jwks = s.ToJwks();
  jwks["keys"][0]["kid"] = "0000000000000000";
  EXPECT_FALSE(PublicKeySet::FromJwks(jwks).ok());
  // Text forms: JWKS, one JWK, base64url raw key.
  EXPECT_TRUE(PublicKeySet::FromText(s.ToJwks().dump(), "t")->Has(a.kid()));
  EXPECT_TRUE(PublicKeySet::FromText(s.ToJwks()["keys"][0].dump(), "t").ok());
  EXPECT_TRUE(PublicKeySet::FromText(Base64UrlEncode(a.raw_public()), "t")->Has(a.kid()));
}

// A lift travels signed beside the revocations, with its revision; a list from a hub that
// predates lifts (no revision) reads as first revocations; a half-given lift is malformed.
TEST(RevocationList, LiftsAndRevisionsRoundTripAndHalfALiftIsMalformed) {
  auto key = SigningKey::Generate().value();
  PublicKeySet keys;
  ASSERT_TRUE(keys.AddRaw(key.raw_public()).ok());
  RevocationList list;
  list.iat = 1000;
  list.max_age_s = 60;
  RevocationEntry revoked{"ck1-a", "sha256:a", "bad", 900};
  RevocationEntry lifted{"ck1-b", "sha256:b", "precaution", 800, 2, 950, "false alarm"};
  list.entries = {revoked, lifted};
  auto back = VerifyRevocationList(SignRevocationList(list, key).value(), keys, 1001);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->entries.size(), 2u);
  EXPECT_EQ(back->entries[0], revoked);
  EXPECT_FALSE(back->entries[0].lifted());
  EXPECT_EQ(back->entries[1], lifted);
  EXPECT_TRUE(back->entries[1].lifted());

  // A list signed as the hub signs one, with a row the hub would never write.
  auto sign_claims = [&](const nlohmann::json& row) {
    const std::string header =
        CanonicalJson({{"alg", "EdDSA"}, {"kid", key.kid()}, {"typ", "kiln-revocations"}}).value();
    const std::string body =
        CanonicalJson(
            {{"iat", 1000}, {"max_age_s", 60}, {"revocations", nlohmann::json::array({row})}})
            .value();
    const std::string input = Base64UrlEncode(header) + "." + Base64UrlEncode(body);
    return input + "." + Base64UrlEncode(key.Sign(input).value());
  };
  nlohmann::json old_row = {
      {"key", "ck1-c"}, {"digest", "sha256:c"}, {"reason", "r"}, {"revoked_at", 5}};
  auto old = VerifyRevocationList(sign_claims(old_row), keys, 1001);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->entries[0].revision, 1);
  nlohmann::json half = old_row;
  half["lifted_at"] = 7;
  auto refused = VerifyRevocationList(sign_claims(half), keys, 1001);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().Is(kRevocationsMalformed)) << refused.status().ToString();
  nlohmann::json zero = old_row;
  zero["revision"] = 0;
  EXPECT_TRUE(
      VerifyRevocationList(sign_claims(zero), keys, 1001).status().Is(kRevocationsMalformed));
}

// The hub's orders travel signed in the same list; an order no adopter could obey is malformed.
TEST(RevocationList, OrdersRoundTripAndAMalformedOrderRefusesTheList) {
  auto key = SigningKey::Generate().value();
  PublicKeySet keys;
  ASSERT_TRUE(keys.AddRaw(key.raw_public()).ok());
  RevocationList list;
  list.iat = 1000;
  list.max_age_s = 60;
  list.orders = {{"r1", "mlp", "canary", "ck1-a@sha256:b", 0.25, 3, "half"},
                 {"r1", "vae", "eager", "", 0, 1, "incident"}};
  auto back = VerifyRevocationList(SignRevocationList(list, key).value(), keys, 1001);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->orders, list.orders);
  for (const HubOrder& bad : {HubOrder{"r1", "mlp", "pin", "", 0, 1, "no ref"},
                              HubOrder{"r1", "mlp", "canary", "k@d", 1.5, 1, "share"},
                              HubOrder{"r1", "mlp", "auto", "", 0, 0, "incarnation"},
                              HubOrder{"r1", "mlp", "drain", "", 0, 1, "kind"}}) {
    RevocationList one = list;
    one.orders = {bad};
    auto refused = VerifyRevocationList(SignRevocationList(one, key).value(), keys, 1001);
    ASSERT_FALSE(refused.ok()) << bad.reason;
    EXPECT_TRUE(refused.status().Is(kRevocationsMalformed)) << refused.status().ToString();
  }
}

TEST(SigningKeyRing, PersistsAndRotationKeepsOldReceiptsVerifiable) {
  const std::string dir = ::testing::TempDir() + "/kiln_keyring_test";
  std::filesystem::remove_all(dir);
  auto ring = SigningKeyRing::OpenOrCreate(dir);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  const std::string kid1 = (*ring)->Current()->kid();
  const ReceiptClaims c = SampleClaims();
  const std::string old_receipt = SignReceipt(c, *(*ring)->Current()).value();

  auto kid2 = (*ring)->Rotate(1800000000);
  ASSERT_TRUE(kid2.ok());
  EXPECT_NE(*kid2, kid1);
  EXPECT_EQ((*ring)->Current()->kid(), *kid2);
  auto jwks = PublicKeySet::FromJwks((*ring)->Jwks()).value();
  EXPECT_EQ(jwks.size(), 2u);
  EXPECT_TRUE(VerifyReceipt(old_receipt, jwks, ExpectedOf(c)).ok());

  // Reopened: the same current key and both public keys.
  ring->reset();
  auto again = SigningKeyRing::OpenOrCreate(dir);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->Current()->kid(), *kid2);
  EXPECT_EQ((*again)->PublicKeys().size(), 2u);
  EXPECT_TRUE(VerifyReceipt(old_receipt, (*again)->PublicKeys(), ExpectedOf(c)).ok());
  std::filesystem::remove_all(dir);
}

// Rotation retires the key it replaces: what that key signed before the instant still verifies,
// what it signs after is refused (a leaked key cannot issue fresh receipts or lists), on every
// verifier that reads the hub's key set, and across a restart of the ring.
TEST(SigningKeyRing, RotationRetiresTheOldKeyForWhatItSignsLater) {
  const std::string dir = ::testing::TempDir() + "/kiln_keyring_retire_test";
  std::filesystem::remove_all(dir);
  auto ring = SigningKeyRing::OpenOrCreate(dir);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  const auto old_key = (*ring)->Current();
  constexpr int64_t kRotatedAt = 1800000000;
  ASSERT_TRUE((*ring)->Rotate(kRotatedAt).ok());

  ReceiptClaims before = SampleClaims();
  before.iat = kRotatedAt - 10;
  ReceiptClaims after = SampleClaims();
  after.iat = kRotatedAt + 1;
  const PublicKeySet keys = PublicKeySet::FromJwks((*ring)->Jwks()).value();
  ASSERT_EQ(keys.NotAfter(old_key->kid()), kRotatedAt);
  EXPECT_FALSE(keys.NotAfter((*ring)->Current()->kid()).has_value());
  EXPECT_TRUE(VerifyReceipt(SignReceipt(before, *old_key).value(), keys, ExpectedOf(before)).ok());
  const ReceiptVerdict forged =
      VerifyReceipt(SignReceipt(after, *old_key).value(), keys, ExpectedOf(after));
  EXPECT_EQ(forged.token, kReceiptKeyRetired) << forged.message;
  // The new key signs after the instant as it likes.
  EXPECT_TRUE(
      VerifyReceipt(SignReceipt(after, *(*ring)->Current()).value(), keys, ExpectedOf(after)).ok());

  // Revocation lists: a fresh list from the old key is refused; one it signed in time is not.
  RevocationList list;
  list.max_age_s = 300;
  list.iat = kRotatedAt + 5;
  auto late =
      VerifyRevocationList(SignRevocationList(list, *old_key).value(), keys, kRotatedAt + 6);
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(late.status().Is(kRevocationsKeyRetired)) << late.status().ToString();
  list.iat = kRotatedAt - 5;
  EXPECT_TRUE(
      VerifyRevocationList(SignRevocationList(list, *old_key).value(), keys, kRotatedAt).ok());

  // Pulled back to the leak: only ever earlier. The current key cannot be retired; an unknown
  // one is not found.
  ASSERT_TRUE((*ring)->Retire(old_key->kid(), kRotatedAt - 100).ok());
  ASSERT_TRUE((*ring)->Retire(old_key->kid(), kRotatedAt + 100).ok());
  EXPECT_EQ((*ring)->PublicKeys().NotAfter(old_key->kid()), kRotatedAt - 100);
  EXPECT_FALSE((*ring)->Retire((*ring)->Current()->kid(), 1).ok());
  EXPECT_EQ((*ring)->Retire("0123456789abcdef", 1).code(), StatusCode::kNotFound);

  // Persisted: a restarted ring knows.
  ring->reset();
  auto again = SigningKeyRing::OpenOrCreate(dir);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->PublicKeys().NotAfter(old_key->kid()), kRotatedAt - 100);
  std::filesystem::remove_all(dir);
}

// A verifier with fixed anchors takes a hub's retirements (trust can only shrink that way) but
// never its keys; one that trusts the hub's set takes both.
TEST(PublicKeySet, TighteningTakesRetirementsOnlyAndOnlyEarlier) {
  const SigningKey a = SigningKey::Generate().value();
  const SigningKey b = SigningKey::Generate().value();
  PublicKeySet anchors = Trust(a);
  PublicKeySet hub;
  ASSERT_TRUE(hub.AddRaw(a.raw_public()).ok());
  ASSERT_TRUE(hub.AddRaw(b.raw_public()).ok());
  hub.Retire(a.kid(), 500);
  EXPECT_EQ(anchors.TightenFrom(hub), 1);
  EXPECT_FALSE(anchors.Has(b.kid()));
  EXPECT_EQ(anchors.NotAfter(a.kid()), 500);
  PublicKeySet later;
  ASSERT_TRUE(later.AddRaw(a.raw_public()).ok());
  later.Retire(a.kid(), 900);
  EXPECT_EQ(anchors.TightenFrom(later), 0);
  EXPECT_EQ(anchors.NotAfter(a.kid()), 500);
  PublicKeySet all;
  ASSERT_TRUE(all.AddAll(hub).ok());
  EXPECT_TRUE(all.Has(b.kid()));
  EXPECT_EQ(all.NotAfter(a.kid()), 500);
}

// A private key others may read is a key that may have leaked: the ring will not sign with it.
TEST(SigningKeyRing, ARingWhosePrivateKeyOthersCanReadIsRefused) {
  const std::string dir = ::testing::TempDir() + "/kiln_keyring_mode_test";
  std::filesystem::remove_all(dir);
  auto ring = SigningKeyRing::OpenOrCreate(dir);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  const std::string key = dir + "/signing/" + (*ring)->Current()->kid() + ".key";
  struct stat st {};
  ASSERT_EQ(::stat(key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ring->reset();
  ASSERT_EQ(::chmod(key.c_str(), 0644), 0);
  auto refused = SigningKeyRing::OpenOrCreate(dir);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().Is(kRefusalInsecurePermissions)) << refused.status().ToString();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
