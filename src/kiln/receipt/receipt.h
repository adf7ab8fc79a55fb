// Receipts: the hub's Ed25519-signed statement that binds a cell key to the bytes it stored
// (receipt layer; docs/design.md §9, §12 "Receipt checks"). A small library of its own,
// `kiln_receipt`, so the client and the worker verify receipts without linking the hub server.
//
// Wire format: JWS compact serialization, three base64url (no padding) parts joined by '.':
//   header  {"alg":"EdDSA","kid":"<16 hex>","typ":"kiln-receipt"}   (canonical JSON)
//   claims  {"builder":"<who rebuilt cell.so>","digest":"sha256:<hex>","family":"root/…",
//            "iat":<unix s>,"key":"ck1-…","org":"<org or empty>","publisher":"<token name>",
//            "release":"<name or empty>","size":<bytes>,"so_digest":"sha256:<hex>",
//            "source_digest":"sha256:<hex>","tier":"platform"|"org"}   (canonical JSON)
//   signature  Ed25519 over ASCII(header_b64 + "." + claims_b64)
// `builder` names the builder that rebuilt cell.so from source/cell.cc with the pinned toolchain
// and found the bytes equal; empty means no rebuild was attested, and a worker adopts such a cell
// only if it minted it itself (docs/trust.md). Receipts signed before these claims existed parse
// with them empty.
//
// The revocation list travels the same way, header typ "kiln-revocations", claims
//   {"iat":<unix s>,"max_age_s":<s>,"revocations":[{"digest","key","reason","revoked_at"}…]}
// so an adopter can tell a list the hub signed a moment ago from a stripped or replayed one.
// Key id: the first 16 hex of SHA-256 of the raw 32-byte public key. A JWKS lists every public
// key the hub ever signed with, as {"kty":"OKP","crv":"Ed25519","x":<base64url raw key>,"kid":…,
// "alg":"EdDSA","use":"sig"}, and a retired key also with "not_after":<unix s>: rotation retires
// the key it replaces at that instant, so a receipt or a revocation list whose iat is later than
// its key's not_after is refused (`<kind>_key_retired`) even though its signature verifies. A
// leaked key can still sign statements dated before its retirement; re-signing every stored
// receipt with the new key (docs/trust.md) lets an operator pull not_after back to the leak, or
// to 0, without leaving a genuine cell unverifiable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln {

// base64url without padding (RFC 4648 §5). Decode refuses padding, whitespace and any character
// outside the alphabet, and non-canonical trailing bits.
std::string Base64UrlEncode(std::string_view bytes);
Result<std::string> Base64UrlDecode(std::string_view text, const std::string& what);

struct ReceiptClaims {
  std::string key;
  std::string digest;  // "sha256:<64 hex>"
  uint64_t size = 0;
  std::string family;
  std::string publisher;
  std::string tier;  // "platform" | "org"
  std::string release;
  int64_t iat = 0;            // issued-at, unix seconds
  std::string org;            // tier org: the publisher's org; "" for platform
  std::string source_digest;  // "sha256:<hex>" of source/cell.cc ("" when not attested)
  std::string so_digest;      // "sha256:<hex>" of cell.so ("" when not attested)
  std::string builder;        // who rebuilt cell.so from the source byte-equal; "" = nobody
  bool operator==(const ReceiptClaims&) const = default;
};

// "sha256:<64 hex>" of a member's bytes, as receipts state source_digest and so_digest.
std::string MemberDigest(std::string_view bytes);

// Families are "<namespace>/<name>" with lowercase [a-z0-9._-] segments.
bool IsWellFormedFamily(const std::string& family);

// The publisher rule (docs/design.md "Receipt checks"): a `platform` publisher may write any
// family; an `org` publisher only families "<org>/…", never the platform's "root/…". OK or
// InvalidArgument naming the publisher, its tier and org, and the family. The hub applies it to
// a publish, a worker to a receipt, with the same function.
Status CheckTierWrites(const std::string& publisher, const std::string& tier,
                       const std::string& org, const std::string& family);

nlohmann::json ClaimsToJson(const ReceiptClaims& c);
// Refuses a missing or mistyped field by name; unknown fields are refused too (a verifier must
// never skip a claim it does not understand).
Result<ReceiptClaims> ClaimsFromJson(const nlohmann::json& j);

// An Ed25519 private key. Immutable after creation; any thread may sign concurrently.
class SigningKey {
 public:
  static Result<SigningKey> Generate();
  // From the 32-byte raw private key (seed).
  static Result<SigningKey> FromRawPrivate(std::string_view raw);

  const std::string& kid() const { return kid_; }
  const std::string& raw_public() const { return raw_public_; }
  const std::string& raw_private() const { return raw_private_; }
  // The 64-byte Ed25519 signature of `message`.
  Result<std::string> Sign(std::string_view message) const;

 private:
  std::string raw_private_;
  std::string raw_public_;
  std::string kid_;
};

// "first 16 hex of SHA-256(raw public key)".
std::string KeyIdOf(std::string_view raw_public);

// Public keys trusted to verify receipts, by key id, each with its retirement instant if it has
// one.
class PublicKeySet {
 public:
  // Adds a raw 32-byte Ed25519 public key; its kid is computed.
  Status AddRaw(std::string_view raw_public);
  // Retires `kid` at `not_after` (unix seconds): statements it signed with a later iat are
  // refused. Retirement only tightens: an earlier instant already known is kept. A kid not in the
  // set is remembered too, so a key added later arrives retired.
  void Retire(const std::string& kid, int64_t not_after);
  // The instant `kid` was retired at, or nullopt while it is live.
  std::optional<int64_t> NotAfter(const std::string& kid) const;
  // Adds every key of `other` and takes its retirements.
  Status AddAll(const PublicKeySet& other);
  // Takes the retirements of `other` without adding any key: how a verifier with fixed anchors
  // learns that a hub retired one of them (it can only lose trust this way, never gain it).
  // Returns how many retirements were new or earlier than what this set knew.
  int TightenFrom(const PublicKeySet& other);
  const std::map<std::string, int64_t>& retired() const { return not_after_; }
  // Parses a JWKS document ({"keys":[…]}); every key must be OKP/Ed25519 and its kid must equal
  // KeyIdOf(x) (a kid that lies about its key is refused).
  static Result<PublicKeySet> FromJwks(const nlohmann::json& jwks);
  // Accepts a JWKS document, or a single JWK object, or a base64url raw key, or 64 hex chars.
  static Result<PublicKeySet> FromText(std::string_view text, const std::string& what);

  bool Has(const std::string& kid) const { return keys_.count(kid) != 0; }
  const std::string* Find(const std::string& kid) const;
  size_t size() const { return keys_.size(); }
  nlohmann::json ToJwks() const;
  const std::map<std::string, std::string>& keys() const { return keys_; }

 private:
  std::map<std::string, std::string> keys_;   // kid -> raw public key
  std::map<std::string, int64_t> not_after_;  // kid -> retirement instant (unix s)
};

// The JWS compact serialization of `claims` signed by `key`.
Result<std::string> SignReceipt(const ReceiptClaims& claims, const SigningKey& key);

// What a verifier expects a receipt to say; empty / nullopt fields are not compared.
struct ExpectedClaims {
  std::string key;
  std::string digest;
  std::optional<uint64_t> size;
  std::string family;
};

// The outcome of an offline receipt check. `token` is empty when the receipt verified; otherwise
// one of (checked in this order):
//   receipt_malformed      not three base64url parts, header/claims not JSON objects, bad claims
//   receipt_alg_refused    header alg is not "EdDSA" (e.g. "none", "HS256")
//   receipt_unknown_kid    no trusted key has the header's kid
//   receipt_bad_signature  the Ed25519 signature does not verify (bytes altered or foreign key)
//   receipt_key_retired    the signing key was retired before the receipt's iat
//   receipt_claim_mismatch a claim differs from `expected` (message names claim and both values)
inline constexpr const char* kRefusalReceiptClaimMismatch = "receipt_claim_mismatch";
struct ReceiptVerdict {
  std::string token;
  std::string message;
  std::string kid;
  ReceiptClaims claims;
  bool ok() const { return token.empty(); }
};

ReceiptVerdict VerifyReceipt(std::string_view jws, const PublicKeySet& trusted,
                             const ExpectedClaims& expected);

// One revoked cell as the signed list carries it, or one whose revocation an admin lifted.
// `revision` counts the changes of this (key, digest) at the hub (1 = revoked, 2 = lifted,
// 3 = revoked again, ...): an adopter applies an entry only when its revision is newer than the
// one it already holds for the digest, so a replayed older list can neither resurrect a cell
// revoked again nor re-kill one reinstated since. A lift stays in the list (signed like any
// entry) for that reason: dropping it would let a replayed pre-lift list win.
struct RevocationEntry {
  std::string key;
  std::string digest;
  std::string reason;
  int64_t revoked_at = 0;
  int64_t revision = 1;
  int64_t lifted_at = 0;      // 0 = the revocation holds
  std::string lift_reason{};  // why an admin lifted it ("" while it holds)
  bool lifted() const { return lifted_at > 0; }
  bool operator==(const RevocationEntry&) const = default;
};

// The hub's order for one (release, target) as the signed list carries it (docs/fleet.md "Hub
// orders"): `auto` (serve the cell the worker's own key resolves to), `eager` (serve eager, arm
// nothing), `pin` (serve exactly `ref`), `canary` (workers whose id falls in `share` serve `ref`,
// the others auto). `incarnation` is the dispatch fence: it grows with every order the hub takes
// for the pair, and an adopter applies an order only when it is newer than the one it holds.
struct HubOrder {
  std::string release;
  std::string target;
  std::string kind;  // auto | eager | pin | canary
  std::string ref;   // key@digest for pin and canary; "" otherwise
  double share = 0;  // canary only: (0, 1]
  int64_t incarnation = 0;
  std::string reason;
  bool operator==(const HubOrder&) const = default;
};

struct RevocationList {
  int64_t iat = 0;        // when the hub signed it, unix seconds
  int64_t max_age_s = 0;  // how long after iat an adopter may rely on it
  std::vector<RevocationEntry> entries;
  std::vector<HubOrder> orders;  // the claim "orders"; absent from lists of older hubs
  std::string kid;               // set by VerifyRevocationList
};

// Refusal tokens of VerifyRevocationList (Status::token()).
inline constexpr const char* kRevocationsMalformed = "revocations_malformed";
inline constexpr const char* kRevocationsUnsigned = "revocations_unsigned";
inline constexpr const char* kRevocationsAlgRefused = "revocations_alg_refused";
inline constexpr const char* kRevocationsUnknownKid = "revocations_unknown_kid";
inline constexpr const char* kRevocationsBadSignature = "revocations_bad_signature";
inline constexpr const char* kRevocationsStale = "revocations_stale";
inline constexpr const char* kRevocationsKeyRetired = "revocations_key_retired";
inline constexpr const char* kReceiptKeyRetired = "receipt_key_retired";

// Clock skew tolerated between a hub and an adopter when judging iat (seconds).
inline constexpr int64_t kRevocationClockSkewS = 300;

// OK when `order` is well formed: a known kind, a target, incarnation >= 1, a key@digest ref
// exactly for pin and canary, a share in (0, 1] exactly for canary. InvalidArgument naming the
// field.
Status CheckHubOrder(const HubOrder& order);

Result<std::string> SignRevocationList(const RevocationList& list, const SigningKey& key);

// Verifies a signed list: JWS shape, typ "kiln-revocations", EdDSA, a trusted kid, the signature,
// the claims, a signing key not retired before the list's iat; then freshness at `now`: iat no more
// than kRevocationClockSkewS in the future, and now - iat within min(list max_age_s, max_age_cap_s)
// (cap 0 = the list's own). Refusals carry the tokens above; an empty `jws` is
// revocations_unsigned.
Result<RevocationList> VerifyRevocationList(std::string_view jws, const PublicKeySet& trusted,
                                            int64_t now, int64_t max_age_cap_s = 0);

// A hub's signing keys as the routes use them: the key that signs now and every public key it
// ever signed with (retired ones with their not_after). Two implementations: SigningKeyRing below
// (files under the hub's data dir, one hub) and the PostgreSQL keyring of hub replicas sharing one
// database (src/kiln/hub/pg_keyring.h). Thread-safe: any method from any thread.
class KeyRing {
 public:
  KeyRing() = default;
  virtual ~KeyRing() = default;
  KeyRing(const KeyRing&) = delete;
  KeyRing& operator=(const KeyRing&) = delete;

  // The key new receipts are signed with; never null.
  virtual std::shared_ptr<const SigningKey> Current() const = 0;
  // Every public key, current and retired.
  virtual PublicKeySet PublicKeys() const = 0;
  nlohmann::json Jwks() const { return PublicKeys().ToJwks(); }
  // Generates a new key, persists it, makes it current, and retires the key it replaces at
  // `now` (unix seconds; a shared ring may retire it a little later, see its header). Returns the
  // new kid.
  virtual Result<std::string> Rotate(int64_t now) = 0;
  // Retires `kid` at `not_after` (only ever earlier than a retirement already recorded). The
  // current key cannot be retired: rotate first (InvalidArgument). NotFound for a kid this ring
  // never held.
  virtual Status Retire(const std::string& kid, int64_t not_after) = 0;
};

// The hub's signing keys, persisted under `dir`:
//   dir/signing/current          the kid of the active key
//   dir/signing/<kid>.key        raw 32-byte private key (mode 0600; refused at open otherwise)
//   dir/signing/<kid>.pub        raw 32-byte public key (kept forever: old receipts stay
//   verifiable)
//   dir/signing/<kid>.not_after  the retirement instant of a key that is no longer current
// Thread-safe: Current() and Jwks() may be called from any thread while Rotate() runs.
class SigningKeyRing final : public KeyRing {
 public:
  // Loads the ring from `dir`, generating and persisting a first key if there is none.
  static Result<std::unique_ptr<SigningKeyRing>> OpenOrCreate(const std::string& dir);
  ~SigningKeyRing() override;

  std::shared_ptr<const SigningKey> Current() const override;
  PublicKeySet PublicKeys() const override;
  Result<std::string> Rotate(int64_t now) override;
  Status Retire(const std::string& kid, int64_t not_after) override;

 private:
  SigningKeyRing() = default;
  struct State;
  std::unique_ptr<State> state_;
  std::string dir_;
};

}  // namespace kiln
