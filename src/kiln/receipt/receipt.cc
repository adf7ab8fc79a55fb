// Receipts: JWS/EdDSA signing and offline verification, and the hub's persisted key ring (receipt
// layer, `kiln_receipt` library). See receipt.h for the wire format.
#include "src/kiln/receipt/receipt.h"

#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <variant>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"

namespace kiln {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

struct PkeyDeleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;

Result<std::string> RawPublicOf(EVP_PKEY* pkey) {
  std::string out(32, '\0');
  size_t len = out.size();
  if (EVP_PKEY_get_raw_public_key(pkey, reinterpret_cast<unsigned char*>(out.data()), &len) != 1 ||
      len != 32) {
    return Status::Internal("Ed25519: cannot read the raw public key");
  }
  return out;
}

bool Ed25519Verify(std::string_view raw_public, std::string_view message,
                   std::string_view signature) {
  if (raw_public.size() != 32 || signature.size() != 64) return false;
  PkeyPtr pkey(EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(raw_public.data()), 32));
  if (!pkey) return false;
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey.get()) != 1) {
    return false;
  }
  return EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1;
}

bool IsHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Result<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0 || !IsHex(hex)) return Status::InvalidArgument("not lowercase hex");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(std::stoi(std::string(hex.substr(2 * i, 2)), nullptr, 16));
  }
  return out;
}

ReceiptVerdict Refuse(std::string token, std::string message) {
  ReceiptVerdict v;
  v.token = std::move(token);
  v.message = std::move(message);
  return v;
}

}  // namespace

// --- base64url ------------------------------------------------------------------------------

std::string Base64UrlEncode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (b[i] << 16) | (b[i + 1] << 8) | b[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest == 1) {
    const uint32_t v = b[i] << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
  } else if (rest == 2) {
    const uint32_t v = (b[i] << 16) | (b[i + 1] << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
  }
  return out;
}

Result<std::string> Base64UrlDecode(std::string_view text, const std::string& what) {
  auto value_of = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '-') return 62;
    if (c == '_') return 63;
    return -1;
  };
  if (text.size() % 4 == 1) {
    return Status::InvalidArgument(what + ": base64url length " + std::to_string(text.size()) +
                                   " is impossible (length mod 4 == 1)");
  }
  std::string out;
  out.reserve(text.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const int v = value_of(text[i]);
    if (v < 0) {
      return Status::InvalidArgument(what + ": byte " + std::to_string(i) +
                                     " is not in the base64url alphabet (no padding allowed)");
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) {
    return Status::InvalidArgument(what + ": base64url has non-zero trailing bits");
  }
  return out;
}

// --- claims ---------------------------------------------------------------------------------

nlohmann::json ClaimsToJson(const ReceiptClaims& c) {
  return nlohmann::json{{"key", c.key},
                        {"digest", c.digest},
                        {"size", c.size},
                        {"family", c.family},
                        {"publisher", c.publisher},
                        {"tier", c.tier},
                        {"release", c.release},
                        {"iat", c.iat},
                        {"org", c.org},
                        {"source_digest", c.source_digest},
                        {"so_digest", c.so_digest},
                        {"builder", c.builder}};
}

std::string MemberDigest(std::string_view bytes) { return "sha256:" + Sha256Hex(bytes); }

bool IsWellFormedFamily(const std::string& family) {
  const size_t slash = family.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 >= family.size()) return false;
  if (family.size() > 200) return false;
  for (char c : family) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                    c == '-' || c == '/';
    if (!ok) return false;
  }
  return family.find("//") == std::string::npos && family.find("..") == std::string::npos &&
         family.back() != '/';
}

Status CheckTierWrites(const std::string& publisher, const std::string& tier,
                       const std::string& org, const std::string& family) {
  if (!IsWellFormedFamily(family)) {
    return Status::InvalidArgument("family '" + family +
                                   "' is not '<namespace>/<name>' in lowercase [a-z0-9._-]");
  }
  const std::string ns = family.substr(0, family.find('/'));
  if (tier == "platform") return Status::OK();
  if (tier == "org") {
    if (ns == "root") {
      return Status::InvalidArgument("publisher '" + publisher + "' (tier org '" + org +
                                     "') may not write platform family '" + family + "'");
    }
    if (org.empty() || ns != org) {
      return Status::InvalidArgument("publisher '" + publisher + "' (tier org '" + org +
                                     "') may write only families '" + org + "/…', not '" + family +
                                     "'");
    }
    return Status::OK();
  }
  return Status::InvalidArgument("publisher '" + publisher + "' has tier '" + tier +
                                 "', neither platform nor org, and may not write '" + family + "'");
}

Result<ReceiptClaims> ClaimsFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return Status::InvalidArgument("receipt claims: not a JSON object");
  static const char* kKnown[] = {"key",       "digest",        "size",      "family",
                                 "publisher", "tier",          "release",   "iat",
                                 "org",       "source_digest", "so_digest", "builder"};
  for (const auto& [name, _] : j.items()) {
    if (std::find_if(std::begin(kKnown), std::end(kKnown),
                     // Captured by name: clang before 16 cannot capture a structured binding.
                     [&name = name](const char* k) { return name == k; }) == std::end(kKnown)) {
      return Status::InvalidArgument("receipt claims: unknown claim '" + name + "'");
    }
  }
  ReceiptClaims c;
  auto str = [&](const char* name, std::string* out) -> Status {
    auto it = j.find(name);
    if (it == j.end() || !it->is_string()) {
      return Status::InvalidArgument(std::string("receipt claims: '") + name +
                                     "' is missing or not a string");
    }
    *out = it->get<std::string>();
    return Status::OK();
  };
  KILN_RETURN_IF_ERROR(str("key", &c.key));
  KILN_RETURN_IF_ERROR(str("digest", &c.digest));
  KILN_RETURN_IF_ERROR(str("family", &c.family));
  KILN_RETURN_IF_ERROR(str("publisher", &c.publisher));
  KILN_RETURN_IF_ERROR(str("tier", &c.tier));
  KILN_RETURN_IF_ERROR(str("release", &c.release));
  // Claims added later: absent in receipts signed before them, never of another type.
  for (auto [name, out] : {std::pair<const char*, std::string*>{"org", &c.org},
                           {"source_digest", &c.source_digest},
                           {"so_digest", &c.so_digest},
                           {"builder", &c.builder}}) {
    if (j.contains(name)) KILN_RETURN_IF_ERROR(str(name, out));
  }
  auto size = j.find("size");
  if (size == j.end() || !size->is_number_unsigned()) {
    return Status::InvalidArgument("receipt claims: 'size' is missing or not an unsigned integer");
  }
  c.size = size->get<uint64_t>();
  auto iat = j.find("iat");
  if (iat == j.end() || !iat->is_number_integer()) {
    return Status::InvalidArgument("receipt claims: 'iat' is missing or not an integer");
  }
  c.iat = iat->get<int64_t>();
  if (c.tier != "platform" && c.tier != "org") {
    return Status::InvalidArgument("receipt claims: tier '" + c.tier +
                                   "' is not 'platform' or 'org'");
  }
  return c;
}

// --- keys -----------------------------------------------------------------------------------

std::string KeyIdOf(std::string_view raw_public) { return Sha256Hex(raw_public).substr(0, 16); }

Result<SigningKey> SigningKey::Generate() {
  EVP_PKEY* raw = nullptr;
  std::unique_ptr<EVP_PKEY_CTX, void (*)(EVP_PKEY_CTX*)> ctx(
      EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr), EVP_PKEY_CTX_free);
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &raw) != 1) {
    return Status::Internal("Ed25519: key generation failed");
  }
  PkeyPtr pkey(raw);
  std::string priv(32, '\0');
  size_t len = priv.size();
  if (EVP_PKEY_get_raw_private_key(pkey.get(), reinterpret_cast<unsigned char*>(priv.data()),
                                   &len) != 1 ||
      len != 32) {
    return Status::Internal("Ed25519: cannot read the generated private key");
  }
  return FromRawPrivate(priv);
}

Result<SigningKey> SigningKey::FromRawPrivate(std::string_view raw) {
  if (raw.size() != 32) {
    return Status::InvalidArgument("Ed25519 private key: " + std::to_string(raw.size()) +
                                   " bytes, expected 32");
  }
  PkeyPtr pkey(EVP_PKEY_new_raw_private_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(raw.data()), 32));
  if (!pkey) return Status::InvalidArgument("Ed25519 private key: OpenSSL refused the bytes");
  SigningKey key;
  key.raw_private_ = std::string(raw);
  KILN_ASSIGN_OR_RETURN(key.raw_public_, RawPublicOf(pkey.get()));
  key.kid_ = KeyIdOf(key.raw_public_);
  return key;
}

Result<std::string> SigningKey::Sign(std::string_view message) const {
  PkeyPtr pkey(EVP_PKEY_new_raw_private_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(raw_private_.data()),
      raw_private_.size()));
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!pkey || !ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, pkey.get()) != 1) {
    return Status::Internal("Ed25519: cannot initialize signing with key " + kid_);
  }
  std::string sig(64, '\0');
  size_t len = sig.size();
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      len != 64) {
    return Status::Internal("Ed25519: signing with key " + kid_ + " failed");
  }
  return sig;
}

Status PublicKeySet::AddRaw(std::string_view raw_public) {
  if (raw_public.size() != 32) {
    return Status::InvalidArgument("Ed25519 public key: " + std::to_string(raw_public.size()) +
                                   " bytes, expected 32");
  }
  keys_[KeyIdOf(raw_public)] = std::string(raw_public);
  return Status::OK();
}

const std::string* PublicKeySet::Find(const std::string& kid) const {
  auto it = keys_.find(kid);
  return it == keys_.end() ? nullptr : &it->second;
}

void PublicKeySet::Retire(const std::string& kid, int64_t not_after) {
  auto [it, inserted] = not_after_.emplace(kid, not_after);
  if (!inserted) it->second = std::min(it->second, not_after);
}

std::optional<int64_t> PublicKeySet::NotAfter(const std::string& kid) const {
  auto it = not_after_.find(kid);
  if (it == not_after_.end()) return std::nullopt;
  return it->second;
}

Status PublicKeySet::AddAll(const PublicKeySet& other) {
  for (const auto& [kid, raw] : other.keys_) {
    if (!Has(kid)) KILN_RETURN_IF_ERROR(AddRaw(raw));
  }
  TightenFrom(other);
  return Status::OK();
}

int PublicKeySet::TightenFrom(const PublicKeySet& other) {
  int tightened = 0;
  for (const auto& [kid, not_after] : other.not_after_) {
    const std::optional<int64_t> known = NotAfter(kid);
    if (!known || not_after < *known) ++tightened;
    Retire(kid, not_after);
  }
  return tightened;
}

namespace {

Status AddJwk(const nlohmann::json& jwk, PublicKeySet* set) {
  if (!jwk.is_object()) return Status::InvalidArgument("JWK: not a JSON object");
  auto get = [&](const char* name) -> std::string {
    auto it = jwk.find(name);
    return it != jwk.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (get("kty") != "OKP" || get("crv") != "Ed25519") {
    return Status::InvalidArgument("JWK '" + get("kid") + "': kty '" + get("kty") + "' crv '" +
                                   get("crv") + "', expected OKP Ed25519");
  }
  KILN_ASSIGN_OR_RETURN(std::string raw, Base64UrlDecode(get("x"), "JWK '" + get("kid") + "' x"));
  if (raw.size() != 32) {
    return Status::InvalidArgument("JWK '" + get("kid") + "': x holds " +
                                   std::to_string(raw.size()) + " bytes, expected 32");
  }
  const std::string kid = get("kid");
  if (!kid.empty() && kid != KeyIdOf(raw)) {
    return Status::InvalidArgument("JWK: kid '" + kid + "' does not name its key (expected '" +
                                   KeyIdOf(raw) + "')");
  }
  if (auto na = jwk.find("not_after"); na != jwk.end()) {
    if (!na->is_number_integer() || na->get<int64_t>() < 0) {
      return Status::InvalidArgument("JWK '" + KeyIdOf(raw) +
                                     "': not_after must be a non-negative integer (unix seconds)");
    }
    set->Retire(KeyIdOf(raw), na->get<int64_t>());
  }
  return set->AddRaw(raw);
}

}  // namespace

Result<PublicKeySet> PublicKeySet::FromJwks(const nlohmann::json& jwks) {
  if (!jwks.is_object() || !jwks.contains("keys") || !jwks["keys"].is_array()) {
    return Status::InvalidArgument("JWKS: expected an object with a 'keys' array");
  }
  PublicKeySet set;
  for (const auto& jwk : jwks["keys"]) KILN_RETURN_IF_ERROR(AddJwk(jwk, &set));
  return set;
}

Result<PublicKeySet> PublicKeySet::FromText(std::string_view text, const std::string& what) {
  std::string t(text);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.erase(0, 1);
  if (!t.empty() && t.front() == '{') {
    KILN_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(t, what));
    if (j.contains("keys")) {
      auto set = FromJwks(j);
      if (!set.ok()) return set.status().WithContext(what);
      return set;
    }
    PublicKeySet set;
    KILN_RETURN_IF_ERROR(AddJwk(j, &set).WithContext(what));
    return set;
  }
  PublicKeySet set;
  if (t.size() == 64 && IsHex(t)) {
    KILN_ASSIGN_OR_RETURN(std::string raw, HexDecode(t));
    KILN_RETURN_IF_ERROR(set.AddRaw(raw));
    return set;
  }
  KILN_ASSIGN_OR_RETURN(std::string raw, Base64UrlDecode(t, what));
  KILN_RETURN_IF_ERROR(set.AddRaw(raw).WithContext(what));
  return set;
}

nlohmann::json PublicKeySet::ToJwks() const {
  nlohmann::json keys = nlohmann::json::array();
  for (const auto& [kid, raw] : keys_) {
    nlohmann::json jwk{{"kty", "OKP"}, {"crv", "Ed25519"}, {"x", Base64UrlEncode(raw)},
                       {"kid", kid},   {"alg", "EdDSA"},   {"use", "sig"}};
    if (const auto na = NotAfter(kid)) jwk["not_after"] = *na;
    keys.push_back(std::move(jwk));
  }
  return nlohmann::json{{"keys", keys}};
}

// --- JWS ------------------------------------------------------------------------------------

namespace {

// A compact JWS whose signature verified under a trusted key, with its header typ checked.
struct VerifiedJws {
  std::string kid;
  nlohmann::json payload;
};

Result<std::string> SignJws(const char* typ, const nlohmann::json& payload, const SigningKey& key) {
  KILN_ASSIGN_OR_RETURN(std::string header,
                        CanonicalJson({{"alg", "EdDSA"}, {"kid", key.kid()}, {"typ", typ}}));
  KILN_ASSIGN_OR_RETURN(std::string body, CanonicalJson(payload));
  std::string signing_input = Base64UrlEncode(header) + "." + Base64UrlEncode(body);
  KILN_ASSIGN_OR_RETURN(std::string sig, key.Sign(signing_input));
  return signing_input + "." + Base64UrlEncode(sig);
}

// Shape, typ, alg, kid, signature, payload JSON, in that order; refusals are `<prefix>_malformed`,
// `<prefix>_alg_refused`, `<prefix>_unknown_kid`, `<prefix>_bad_signature`. `what` names the
// object in messages ("receipt", "revocation list"). The typ check keeps one kind of signed
// statement from being replayed as another.
std::variant<VerifiedJws, ReceiptVerdict> VerifyJws(std::string_view jws,
                                                    const PublicKeySet& trusted,
                                                    const std::string& typ,
                                                    const std::string& prefix,
                                                    const std::string& what) {
  const size_t d1 = jws.find('.');
  const size_t d2 = d1 == std::string_view::npos ? d1 : jws.find('.', d1 + 1);
  if (d1 == std::string_view::npos || d2 == std::string_view::npos ||
      jws.find('.', d2 + 1) != std::string_view::npos) {
    return Refuse(prefix + "_malformed", what + ": expected three '.'-separated parts");
  }
  auto header_bytes = Base64UrlDecode(jws.substr(0, d1), what + " header");
  auto claims_bytes = Base64UrlDecode(jws.substr(d1 + 1, d2 - d1 - 1), what + " claims");
  auto sig = Base64UrlDecode(jws.substr(d2 + 1), what + " signature");
  if (!header_bytes.ok()) return Refuse(prefix + "_malformed", header_bytes.status().message());
  if (!claims_bytes.ok()) return Refuse(prefix + "_malformed", claims_bytes.status().message());
  if (!sig.ok()) return Refuse(prefix + "_malformed", sig.status().message());
  auto header = ParseJson(*header_bytes, what + " header");
  if (!header.ok()) return Refuse(prefix + "_malformed", header.status().message());
  if (!header->is_object()) return Refuse(prefix + "_malformed", what + " header: not an object");
  const auto typ_it = header->find("typ");
  const std::string typ_text =
      typ_it != header->end() && typ_it->is_string() ? typ_it->get<std::string>() : "(missing)";
  if (typ_text != typ) {
    return Refuse(prefix + "_malformed",
                  what + " header typ '" + typ_text + "', expected '" + typ + "'");
  }
  // Algorithm: only EdDSA; "none" and every other value refused.
  const auto alg = header->find("alg");
  const std::string alg_text =
      alg != header->end() && alg->is_string() ? alg->get<std::string>() : "(missing)";
  if (alg_text != "EdDSA") {
    return Refuse(prefix + "_alg_refused",
                  what + " header alg '" + alg_text + "' refused, expected 'EdDSA'");
  }
  const auto kid_it = header->find("kid");
  const std::string kid =
      kid_it != header->end() && kid_it->is_string() ? kid_it->get<std::string>() : "";
  const std::string* raw_public = trusted.Find(kid);
  if (raw_public == nullptr) {
    return Refuse(prefix + "_unknown_kid", what + " kid '" + kid + "' is not among " +
                                               std::to_string(trusted.size()) + " trusted keys");
  }
  // The signature over the signing input exactly as received.
  if (!Ed25519Verify(*raw_public, jws.substr(0, d2), *sig)) {
    return Refuse(prefix + "_bad_signature",
                  what + " signature does not verify under key '" + kid + "'");
  }
  auto payload = ParseJson(*claims_bytes, what + " claims");
  if (!payload.ok()) return Refuse(prefix + "_malformed", payload.status().message());
  return VerifiedJws{kid, std::move(payload).value()};
}

}  // namespace

Result<std::string> SignReceipt(const ReceiptClaims& claims, const SigningKey& key) {
  return SignJws("kiln-receipt", ClaimsToJson(claims), key);
}

ReceiptVerdict VerifyReceipt(std::string_view jws, const PublicKeySet& trusted,
                             const ExpectedClaims& expected) {
  auto verified = VerifyJws(jws, trusted, "kiln-receipt", "receipt", "receipt");
  if (auto* refused = std::get_if<ReceiptVerdict>(&verified)) return *refused;
  VerifiedJws& v = std::get<VerifiedJws>(verified);
  auto claims = ClaimsFromJson(v.payload);
  if (!claims.ok()) return Refuse("receipt_malformed", claims.status().message());
  if (const auto not_after = trusted.NotAfter(v.kid); not_after && claims->iat > *not_after) {
    return Refuse(kReceiptKeyRetired, "receipt issued at " + std::to_string(claims->iat) +
                                          " is signed by key '" + v.kid +
                                          "', which was retired at " + std::to_string(*not_after));
  }
  auto mismatch = [&](const char* name, const std::string& got, const std::string& want) {
    return Refuse("receipt_claim_mismatch", std::string("receipt claim '") + name + "' is '" + got +
                                                "', expected '" + want + "'");
  };
  if (!expected.key.empty() && claims->key != expected.key) {
    return mismatch("key", claims->key, expected.key);
  }
  if (!expected.digest.empty() && claims->digest != expected.digest) {
    return mismatch("digest", claims->digest, expected.digest);
  }
  if (expected.size && claims->size != *expected.size) {
    return mismatch("size", std::to_string(claims->size), std::to_string(*expected.size));
  }
  if (!expected.family.empty() && claims->family != expected.family) {
    return mismatch("family", claims->family, expected.family);
  }
  ReceiptVerdict ok;
  ok.kid = v.kid;
  ok.claims = std::move(claims).value();
  return ok;
}

// --- revocation list --------------------------------------------------------------------------

Result<std::string> SignRevocationList(const RevocationList& list, const SigningKey& key) {
  nlohmann::json rows = nlohmann::json::array();
  for (const RevocationEntry& e : list.entries) {
    nlohmann::json row = {{"key", e.key},
                          {"digest", e.digest},
                          {"reason", e.reason},
                          {"revoked_at", e.revoked_at},
                          {"revision", e.revision}};
    if (e.lifted()) {
      row["lifted_at"] = e.lifted_at;
      row["lift_reason"] = e.lift_reason;
    }
    rows.push_back(std::move(row));
  }
  nlohmann::json claims = {{"iat", list.iat}, {"max_age_s", list.max_age_s}, {"revocations", rows}};
  if (!list.orders.empty()) {
    nlohmann::json orders = nlohmann::json::array();
    for (const HubOrder& o : list.orders) {
      orders.push_back({{"release", o.release},
                        {"target", o.target},
                        {"kind", o.kind},
                        {"ref", o.ref},
                        // Parts per million: canonical JSON signs integers, never floats.
                        {"share_ppm", static_cast<int64_t>(o.share * 1e6 + 0.5)},
                        {"incarnation", o.incarnation},
                        {"reason", o.reason}});
    }
    claims["orders"] = std::move(orders);
  }
  return SignJws("kiln-revocations", claims, key);
}

Status CheckHubOrder(const HubOrder& o) {
  const bool wants_ref = o.kind == "pin" || o.kind == "canary";
  if (!wants_ref && o.kind != "auto" && o.kind != "eager") {
    return Status::InvalidArgument("order kind '" + o.kind +
                                   "' is not one of auto, eager, pin, canary");
  }
  if (o.target.empty()) return Status::InvalidArgument("an order names a target");
  if (o.incarnation < 1) {
    return Status::InvalidArgument("order incarnation " + std::to_string(o.incarnation) +
                                   " is not >= 1");
  }
  const size_t at = o.ref.find('@');
  if (wants_ref && (at == std::string::npos || at == 0 || at + 1 == o.ref.size())) {
    return Status::InvalidArgument("a " + o.kind + " order needs ref key@digest, got '" + o.ref +
                                   "'");
  }
  if (!wants_ref && !o.ref.empty()) {
    return Status::InvalidArgument("an " + o.kind + " order names no ref, got '" + o.ref + "'");
  }
  if (o.kind == "canary" ? !(o.share > 0 && o.share <= 1) : o.share != 0) {
    return Status::InvalidArgument(
        "order share " + std::to_string(o.share) +
        (o.kind == "canary" ? " is not in (0, 1]" : " is given for a non-canary order"));
  }
  return Status::OK();
}

Result<RevocationList> VerifyRevocationList(std::string_view jws, const PublicKeySet& trusted,
                                            int64_t now, int64_t max_age_cap_s) {
  if (jws.empty()) {
    return Status::Refused(StatusCode::kInvalidArgument, kRevocationsUnsigned,
                           "the revocation list carries no signature (no 'list' JWS); an "
                           "unsigned list is never trusted");
  }
  auto verified = VerifyJws(jws, trusted, "kiln-revocations", "revocations", "revocation list");
  if (auto* refused = std::get_if<ReceiptVerdict>(&verified)) {
    return Status::Refused(StatusCode::kInvalidArgument, refused->token, refused->message);
  }
  const VerifiedJws& v = std::get<VerifiedJws>(verified);
  auto malformed = [](const std::string& why) {
    return Status::Refused(StatusCode::kInvalidArgument, kRevocationsMalformed,
                           "revocation list claims: " + why);
  };
  const nlohmann::json& p = v.payload;
  if (!p.is_object()) return malformed("not a JSON object");
  for (const auto& [name, _] : p.items()) {
    if (name != "iat" && name != "max_age_s" && name != "revocations" && name != "orders") {
      return malformed("unknown claim '" + name + "'");
    }
  }
  RevocationList list;
  list.kid = v.kid;
  if (!p.contains("iat") || !p["iat"].is_number_integer()) {
    return malformed("'iat' is missing or not an integer");
  }
  if (!p.contains("max_age_s") || !p["max_age_s"].is_number_integer() ||
      p["max_age_s"].get<int64_t>() <= 0) {
    return malformed("'max_age_s' is missing or not a positive integer");
  }
  if (!p.contains("revocations") || !p["revocations"].is_array()) {
    return malformed("'revocations' is missing or not an array");
  }
  list.iat = p["iat"].get<int64_t>();
  list.max_age_s = p["max_age_s"].get<int64_t>();
  if (const auto not_after = trusted.NotAfter(v.kid); not_after && list.iat > *not_after) {
    return Status::Refused(StatusCode::kInvalidArgument, kRevocationsKeyRetired,
                           "revocation list issued at " + std::to_string(list.iat) +
                               " is signed by key '" + v.kid + "', which was retired at " +
                               std::to_string(*not_after));
  }
  for (size_t i = 0; i < p["revocations"].size(); ++i) {
    const nlohmann::json& r = p["revocations"][i];
    const std::string where = "revocations[" + std::to_string(i) + "]";
    if (!r.is_object() || !r.contains("key") || !r["key"].is_string() || !r.contains("digest") ||
        !r["digest"].is_string() || !r.contains("reason") || !r["reason"].is_string() ||
        !r.contains("revoked_at") || !r["revoked_at"].is_number_integer()) {
      return malformed(where + " needs key, digest, reason (strings) and revoked_at (integer)");
    }
    RevocationEntry e{r["key"].get<std::string>(), r["digest"].get<std::string>(),
                      r["reason"].get<std::string>(), r["revoked_at"].get<int64_t>()};
    // A list from a hub that predates lifts carries no revision: its entries are first
    // revocations.
    if (r.contains("revision")) {
      if (!r["revision"].is_number_integer() || r["revision"].get<int64_t>() < 1) {
        return malformed(where + ".revision must be an integer >= 1");
      }
      e.revision = r["revision"].get<int64_t>();
    }
    if (r.contains("lifted_at") || r.contains("lift_reason")) {
      if (!r.contains("lifted_at") || !r["lifted_at"].is_number_integer() ||
          r["lifted_at"].get<int64_t>() <= 0 || !r.contains("lift_reason") ||
          !r["lift_reason"].is_string()) {
        return malformed(where +
                         " lifts need lifted_at (a positive integer) and lift_reason "
                         "(a string) together");
      }
      e.lifted_at = r["lifted_at"].get<int64_t>();
      e.lift_reason = r["lift_reason"].get<std::string>();
    }
    list.entries.push_back(std::move(e));
  }
  if (p.contains("orders")) {
    if (!p["orders"].is_array()) return malformed("'orders' is not an array");
    for (size_t i = 0; i < p["orders"].size(); ++i) {
      const nlohmann::json& o = p["orders"][i];
      const std::string where = "orders[" + std::to_string(i) + "]";
      auto str = [&](const char* f) { return o.contains(f) && o[f].is_string(); };
      auto num = [&](const char* f) { return o.contains(f) && o[f].is_number_integer(); };
      if (!o.is_object() || !str("release") || !str("target") || !str("kind") || !str("ref") ||
          !num("share_ppm") || !num("incarnation") || !str("reason")) {
        return malformed(where +
                         " needs release, target, kind, ref, reason (strings) and "
                         "share_ppm, incarnation (integers)");
      }
      HubOrder order{o["release"].get<std::string>(),     o["target"].get<std::string>(),
                     o["kind"].get<std::string>(),        o["ref"].get<std::string>(),
                     o["share_ppm"].get<int64_t>() / 1e6, o["incarnation"].get<int64_t>(),
                     o["reason"].get<std::string>()};
      if (Status bad = CheckHubOrder(order); !bad.ok())
        return malformed(where + ": " + bad.message());
      list.orders.push_back(std::move(order));
    }
  }
  if (list.iat > now + kRevocationClockSkewS) {
    return Status::Refused(StatusCode::kInvalidArgument, kRevocationsStale,
                           "revocation list issued at " + std::to_string(list.iat) + ", " +
                               std::to_string(list.iat - now) +
                               " s in the future of this machine's clock");
  }
  const int64_t max_age =
      max_age_cap_s > 0 ? std::min(list.max_age_s, max_age_cap_s) : list.max_age_s;
  if (now - list.iat > max_age) {
    return Status::Refused(StatusCode::kInvalidArgument, kRevocationsStale,
                           "revocation list issued at " + std::to_string(list.iat) + " is " +
                               std::to_string(now - list.iat) + " s old, over its maximum age of " +
                               std::to_string(max_age) + " s");
  }
  return list;
}

// --- key ring -------------------------------------------------------------------------------

struct SigningKeyRing::State {
  mutable std::mutex mu;
  std::shared_ptr<const SigningKey> current;
  PublicKeySet all;
};

SigningKeyRing::~SigningKeyRing() = default;

namespace {

Status PersistKey(const std::string& signing_dir, const SigningKey& key) {
  KILN_RETURN_IF_ERROR(
      WriteSecretFileAtomic(signing_dir + "/" + key.kid() + ".key", key.raw_private()));
  return WriteFileAtomic(signing_dir + "/" + key.kid() + ".pub", key.raw_public());
}

Status PersistCurrent(const std::string& signing_dir, const std::string& kid) {
  return WriteFileAtomic(signing_dir + "/current", kid + "\n");
}

Status PersistRetirement(const std::string& signing_dir, const std::string& kid,
                         int64_t not_after) {
  return WriteFileAtomic(signing_dir + "/" + kid + ".not_after", std::to_string(not_after) + "\n");
}

}  // namespace

Result<std::unique_ptr<SigningKeyRing>> SigningKeyRing::OpenOrCreate(const std::string& dir) {
  const std::string signing_dir = dir + "/signing";
  KILN_RETURN_IF_ERROR(MakeDirs(signing_dir));
  std::unique_ptr<SigningKeyRing> ring(new SigningKeyRing());
  ring->dir_ = signing_dir;
  ring->state_ = std::make_unique<State>();
  if (::chmod(signing_dir.c_str(), 0700) != 0) {
    return Status::IOError("chmod 0700 '" + signing_dir + "' failed");
  }
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(signing_dir, ec)) {
    const std::string path = entry.path().string();
    if (entry.path().extension() == ".key") {
      // A private key others can read is a key that may have leaked: refuse to sign with any.
      KILN_RETURN_IF_ERROR(CheckSecretFile(path));
    } else if (entry.path().extension() == ".pub") {
      KILN_ASSIGN_OR_RETURN(std::string raw, ReadFile(path));
      KILN_RETURN_IF_ERROR(ring->state_->all.AddRaw(raw).WithContext(path));
    } else if (entry.path().extension() == ".not_after") {
      KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
      char* end = nullptr;
      const long long not_after = std::strtoll(text.c_str(), &end, 10);
      if (end == text.c_str() || not_after < 0) {
        return Status::Corruption("'" + path + "' does not hold a retirement instant");
      }
      ring->state_->all.Retire(entry.path().stem().string(), not_after);
    }
  }
  if (ec) return Status::IOError("listing '" + signing_dir + "': " + ec.message());
  auto current = ReadFile(signing_dir + "/current");
  if (current.ok()) {
    std::string kid = *current;
    while (!kid.empty() && (kid.back() == '\n' || kid.back() == ' ')) kid.pop_back();
    if (const auto retired = ring->state_->all.NotAfter(kid)) {
      // A rotation that stopped between retiring this key and naming its successor: finish it.
      KILN_LOG(WARNING) << "hub: signing key " << kid << " is named current but was retired at "
                        << *retired << "; rotating to a new key";
      KILN_ASSIGN_OR_RETURN(std::string fresh, ring->Rotate(*retired));
      (void)fresh;
      return ring;
    }
    KILN_ASSIGN_OR_RETURN(std::string priv, ReadFile(signing_dir + "/" + kid + ".key"));
    KILN_ASSIGN_OR_RETURN(SigningKey key, SigningKey::FromRawPrivate(priv));
    if (key.kid() != kid) {
      return Status::Corruption("signing key '" + signing_dir + "/" + kid + ".key' has key id '" +
                                key.kid() + "', expected '" + kid + "'");
    }
    KILN_RETURN_IF_ERROR(ring->state_->all.AddRaw(key.raw_public()));
    ring->state_->current = std::make_shared<const SigningKey>(std::move(key));
    return ring;
  }
  KILN_ASSIGN_OR_RETURN(std::string kid, ring->Rotate(0));
  (void)kid;
  return ring;
}

std::shared_ptr<const SigningKey> SigningKeyRing::Current() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->current;
}

PublicKeySet SigningKeyRing::PublicKeys() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->all;
}

Result<std::string> SigningKeyRing::Rotate(int64_t now) {
  KILN_ASSIGN_OR_RETURN(SigningKey key, SigningKey::Generate());
  std::lock_guard<std::mutex> lock(state_->mu);
  // On disk in this order: the new key, the old key's retirement, `current` naming the new key.
  // A crash in between leaves either the old key current and live, or it current but retired,
  // which OpenOrCreate finishes by rotating; never a retired key signing.
  KILN_RETURN_IF_ERROR(PersistKey(dir_, key));
  if (state_->current) {
    const std::string& old_kid = state_->current->kid();
    const int64_t at = std::min(now, state_->all.NotAfter(old_kid).value_or(now));
    KILN_RETURN_IF_ERROR(PersistRetirement(dir_, old_kid, at));
    state_->all.Retire(old_kid, at);
  }
  KILN_RETURN_IF_ERROR(PersistCurrent(dir_, key.kid()));
  KILN_RETURN_IF_ERROR(state_->all.AddRaw(key.raw_public()));
  const std::string kid = key.kid();
  state_->current = std::make_shared<const SigningKey>(std::move(key));
  return kid;
}

Status SigningKeyRing::Retire(const std::string& kid, int64_t not_after) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->all.Has(kid)) {
    return Status::NotFound("signing key '" + kid + "' was never this hub's");
  }
  if (state_->current && state_->current->kid() == kid) {
    return Status::InvalidArgument("signing key '" + kid +
                                   "' is current; rotate to a new key before retiring it");
  }
  const int64_t at = std::min(not_after, state_->all.NotAfter(kid).value_or(not_after));
  KILN_RETURN_IF_ERROR(PersistRetirement(dir_, kid, at));
  state_->all.Retire(kid, at);
  return Status::OK();
}

}  // namespace kiln
