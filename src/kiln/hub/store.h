// HubStore: the hub's rows — cells, publish intents, revocations, tokens, releases and their
// obligations, worker events (hub layer; docs/design.md §9). Blob bytes live in a BlobStore, not
// here.
//
// Implementations: SQLite (the default, one file under the data dir), PostgreSQL (several hub
// processes share one database; first-writer-wins is a UNIQUE key + INSERT … ON CONFLICT DO
// NOTHING, so it holds across processes), and an in-memory one for unit tests.
//
// Contracts common to every method:
//   - Any thread may call any method concurrently; implementations synchronize internally.
//   - Success returns OK / a value; a backend failure returns IOError naming the backend and the
//     operation (never an exception). "Not there" is a value (std::nullopt / false), not an error.
//   - Results are returned by value; the caller owns them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln {

// One stored cell: the first publisher's bytes for a key within one scope (family). At most one
// row per (key, family); a row whose (key, digest) was revoked may be replaced by another digest.
struct CellRow {
  std::string key;
  std::string digest;  // "sha256:<hex>"
  uint64_t size = 0;
  std::string family;
  std::string publisher;   // token name
  std::string tier;        // "platform" | "org"
  std::string release;     // may be empty
  std::string receipt;     // JWS
  int64_t created_at = 0;  // unix seconds
};

// The outcome of a first-writer-wins insert: the row that owns the key, and whether it is ours.
struct CellInsert {
  CellRow owner;
  bool inserted = false;
};

// A publisher's declared upload: PUT /v1/blobs/<digest> is accepted only against that
// publisher's intent. One row per (key, digest, publisher): a publisher's intent is its own, and
// no other publisher's intent for the same digest changes it.
struct IntentRow {
  std::string key;
  std::string digest;
  uint64_t size = 0;
  std::string family;
  std::string release;
  std::string target;  // optional: the release target this cell is for
  std::string publisher;
  int64_t created_at = 0;
};

// A publisher's claim on (key, family) from its intent until its complete: while it is live (not
// expired) no other publisher gets an intent for that scope, so racing publishers upload one blob
// between them, not one each. It expires on its own (a publisher that died frees the scope), and
// its holder refreshes it at each step of its publish.
struct PublishClaim {
  std::string key;
  std::string family;
  std::string publisher;   // token name
  std::string digest;      // what the holder declared it would upload
  int64_t expires_at = 0;  // unix seconds; the claim is live while now < expires_at
};

// The outcome of ClaimPublish: the claim that holds (key, family) afterwards, and whether it is
// the caller's.
struct PublishClaimResult {
  PublishClaim holder;
  bool ours = false;
};

// A revocation of (key, digest), or one an admin lifted (reinstated). `revision` counts the
// row's changes (1 = revoked, 2 = lifted, 3 = revoked again, ...) and travels in the signed list,
// where it orders an adopter's view of the digest (receipt.h RevocationEntry).
struct RevocationRow {
  std::string key;
  std::string digest;
  std::string reason;
  std::string revoked_by;
  int64_t revoked_at = 0;
  int64_t revision = 1;
  int64_t lifted_at = 0;  // 0 = in force
  std::string lifted_by{};
  std::string lift_reason{};
  bool in_force() const { return lifted_at == 0; }
};

// The hub's order for one (release, target) (receipt.h HubOrder; docs/fleet.md "Hub orders").
// `incarnation` is one more than the pair's previous order: the fence every adopter keeps.
struct OrderRow {
  std::string release;
  std::string target;
  std::string kind;  // auto | eager | pin | canary
  std::string ref;
  int64_t share_ppm = 0;  // canary share in parts per million
  int64_t incarnation = 0;
  std::string reason;
  std::string set_by;
  int64_t set_at = 0;
};

// A bearer token, known by the SHA-256 of its text (the text itself is never stored), as the
// tokens file lists it.
struct TokenRow {
  std::string token_sha256;  // 64 hex
  std::string name;
  std::string role;  // "publisher" | "worker" | "admin"
  std::string tier;  // publishers: "platform" | "org"; empty otherwise
  std::string org;   // tier org: the org name; families "<org>/…" only; workers: the org whose
                     // cells (and the platform's) they may read; "" = every family
  // Releases whose obligations this token may settle or discharge; "*" = every release. Admins
  // hold every release whatever this says.
  std::vector<std::string> releases;
  // The exact families this token may write; empty = every family its tier allows. A platform
  // family ("root/…") listed here is an explicit grant to write it as tier platform.
  std::vector<std::string> families = {};
  // Publishers: the most bytes of cells this token may keep on the hub (stored and being
  // uploaded); -1 = the hub's default for its tier (HubServiceOptions), 0 = no limit.
  int64_t quota_bytes = -1;
};

// A token revoked by an admin: dead at once and at every later start, even if the tokens file
// still lists it.
struct RevokedTokenRow {
  std::string token_sha256;
  std::string name;
  std::string revoked_by;
  int64_t revoked_at = 0;
};

// A cell owed per (release, target, sm). state: "owed", "discharged", or "settled:<token>".
struct ObligationRow {
  std::string release;
  std::string target;
  std::string sm;
  std::string key;  // expected key if declared, or the discharging cell's key; may be empty
  std::string state = "owed";
  std::string cell_digest;  // set when discharged
  int64_t updated_at = 0;
  std::string org = {};  // the tenant the release was declared for ("" = the platform's)
  // Unix seconds by which the cell is owed; 0 = no deadline. An owed obligation past it is
  // overdue (shown on the dashboard and in the obligation's JSON); nothing else changes.
  int64_t deadline = 0;
};

// A worker's event row as the hub keeps it. Not the worker's EventRow (worker/events.h): the
// two once shared a name in namespace kiln, and since `kiln` links both layers, the linker kept
// one instantiation of std::vector<EventRow>::push_back for both layouts (an ODR violation that
// ASan caught as a stack-buffer-overflow in PostEvents).
struct StoredEvent {
  int64_t id = 0;  // assigned by the store, increasing in insertion order
  std::string worker;
  int64_t seq = 0;  // the worker's process-monotonic sequence number
  std::string kind;
  std::string phase;
  std::string key;
  double duration_ms = 0;
  std::string detail;
  int64_t ts = 0;      // unix milliseconds, as the worker reported it
  std::string target;  // the worker's target the row is about ("" when none)
  std::string ref;     // key@digest of the cell it is about ("" when none)
  std::string fn;      // the model name a request asked for ("" when none)
  // Named stages of duration_ms in order, as canonical JSON [{"stage":..,"ms":..},..] ("[]" or
  // "" when none); the service checked its shape before it stored it.
  std::string stages;
  std::string org = {};  // the org of the token that posted it ("" = platform or unscoped)
};

struct EventFilter {
  std::string worker;  // empty: any
  std::string kind;
  std::string phase;
  int64_t since_ts = 0;  // ts >= since_ts
  int limit = 100;
  std::optional<std::string> org = {};  // rows of exactly this org; nullopt: every org
};

// A cell row and its revocation, if any: everything a resolve reads.
struct ResolvedCell {
  CellRow cell;
  std::optional<RevocationRow> revocation;
};

struct WorkerSummary {
  std::string worker;
  int64_t last_ts = 0;
  int64_t events = 0;
};

// A mint lease (docs/fleet.md "One mint per cold key"): the one worker allowed to mint the cell
// of (key, family) while no cell is published there. At most one row per (key, family); a row
// whose expires_at_ms has passed is free for anyone to take over. Times are the calling hub's
// clock in unix milliseconds (the store never reads its own clock), so hubs sharing a database
// must keep their clocks within a small fraction of the lease TTL of each other (NTP does).
struct MintLeaseRow {
  std::string key;
  std::string family;
  std::string holder;  // who minted: the worker's name as it asked
  std::string lease;   // the lease id: random, names this grant (a takeover gets a new one)
  int64_t acquired_at_ms = 0;
  int64_t expires_at_ms = 0;
};

// The outcome of an acquire: the row that holds (key, family) afterwards, and whether it is the
// one this call asked for.
struct MintLeaseAcquire {
  MintLeaseRow owner;
  bool granted = false;
};

// The refusal token of a store whose bytes are damaged (a malformed page, a truncated or replaced
// database). Never answered as a miss.
inline constexpr const char* kRefusalStoreCorrupt = "store_corrupt";

class HubStore {
 public:
  HubStore() = default;
  virtual ~HubStore() = default;
  HubStore(const HubStore&) = delete;
  HubStore& operator=(const HubStore&) = delete;

  // A short name for logs: "sqlite:<path>", "postgresql", "memory".
  virtual std::string Describe() const = 0;

  // Whether the store is reachable and its data readable: OK, `store_corrupt` (damage found), or
  // IOError (unreachable). Cheap enough for a readiness probe on small stores; SQLite's runs a
  // quick_check over the whole file. Any thread.
  virtual Status CheckIntegrity() { return Status::OK(); }

  // Its connections, for the hub's /metrics: how many it may hold, how many are open, and how
  // many a call is using now. A store with no pool (memory; SQLite's one connection, whose
  // statements take turns) reports size 1, open 1 and in_use 0 (not measured). Any thread.
  struct PoolStats {
    int size = 1;
    int open = 1;
    int in_use = 0;
  };
  virtual PoolStats Pool() const { return {}; }

  // --- cells --------------------------------------------------------------------------------
  // Inserts `row` unless a live row owns its (key, family): a row with no revocation is never
  // overwritten, one whose (key, digest) is revoked is replaced (revoking frees the key for its
  // scope). Returns the row that owns (key, family) afterwards (`row` itself if this call wrote
  // it, else the existing first writer's row) and whether this call wrote it. Two publishers of
  // identical bytes in the same second sign byte-identical receipts, so only `inserted` tells the
  // winner from the others. Atomic across hub processes sharing a database.
  virtual Result<CellInsert> InsertCellIfAbsent(const CellRow& row) = 0;
  virtual Result<std::optional<CellRow>> GetCell(const std::string& key,
                                                 const std::string& family) = 0;
  // Every family's row for `key`, oldest first.
  virtual Result<std::vector<CellRow>> ListCellsForKey(const std::string& key) = 0;
  // Every row whose bytes are `digest` (a blob may back one key in several families).
  virtual Result<std::vector<CellRow>> CellsWithDigest(const std::string& digest) = 0;
  // The row of (key, family) with its revocation (resolve's hot path). The default reads GetCell
  // then GetRevocation; a store over the network answers it in one round trip.
  virtual Result<std::optional<ResolvedCell>> GetCellForResolve(const std::string& key,
                                                                const std::string& family) {
    KILN_ASSIGN_OR_RETURN(auto cell, GetCell(key, family));
    if (!cell.has_value()) return std::optional<ResolvedCell>();
    KILN_ASSIGN_OR_RETURN(auto revoked, GetRevocation(cell->key, cell->digest));  // in force
    return std::optional<ResolvedCell>(ResolvedCell{std::move(*cell), std::move(revoked)});
  }
  // Newest first.
  virtual Result<std::vector<CellRow>> ListCells(int limit) = 0;
  // Replaces the receipt of the row (key, family) if its bytes are still `digest` (re-signing
  // after a key rotation). Returns whether a row changed.
  virtual Result<bool> UpdateReceipt(const std::string& key, const std::string& family,
                                     const std::string& digest, const std::string& receipt) = 0;

  // --- intents ------------------------------------------------------------------------------
  // Records or replaces row.publisher's intent for (key, digest); other publishers' intents for
  // the same pair are untouched.
  virtual Status PutIntent(const IntentRow& row) = 0;
  virtual Result<std::optional<IntentRow>> GetIntent(const std::string& key,
                                                     const std::string& digest,
                                                     const std::string& publisher) = 0;
  // `publisher`'s intent for `digest` (uploads are addressed by digest only); "" = anyone's.
  virtual Result<std::optional<IntentRow>> FindIntentByDigest(const std::string& digest,
                                                              const std::string& publisher) = 0;
  // Deletes intents created before `before` (unix seconds): abandoned publishes. Returns how
  // many.
  virtual Result<int> DeleteIntentsBefore(int64_t before) = 0;
  // What `publisher` keeps on the hub, for its storage quota: the bytes of every cell row it
  // wrote (revoked ones too: their bytes stay), and its intents that no cell row of the same
  // (key, digest) completes yet.
  struct PublisherUsage {
    uint64_t cell_bytes = 0;
    std::vector<IntentRow> open_intents;
  };
  virtual Result<PublisherUsage> GetPublisherUsage(const std::string& publisher) = 0;

  // --- publish claims ------------------------------------------------------------------------
  // Claims (key, family) for claim.publisher until claim.expires_at, unless another publisher's
  // claim live at `now` (expires_at > now) holds it. The holder's own claim is refreshed (digest
  // and expiry replaced); an expired one is taken over. Returns the claim that holds afterwards
  // and whether it is the caller's. Atomic across hub processes sharing a database: of racing
  // callers exactly one gets `ours`.
  virtual Result<PublishClaimResult> ClaimPublish(const PublishClaim& claim, int64_t now) = 0;
  // Drops `publisher`'s claim on (key, family); another publisher's claim is untouched. Returns
  // whether a claim was dropped.
  virtual Result<bool> ReleasePublishClaim(const std::string& key, const std::string& family,
                                           const std::string& publisher) = 0;
  // Deletes claims expired at `now` (expires_at <= now). Returns how many.
  virtual Result<int> DeleteExpiredPublishClaims(int64_t now) = 0;

  // --- revocations --------------------------------------------------------------------------
  // Idempotent: a second revocation of (key, digest) in force keeps the first row. A lifted row is
  // revoked again: `row`'s reason, author and time, the lift cleared, the revision one higher.
  virtual Status Revoke(const RevocationRow& row) = 0;
  // Lifts the revocation of (key, digest): the row stays, with the lift and its revision one
  // higher. nullopt when (key, digest) was never revoked; a row already lifted is returned as it
  // is (idempotent).
  virtual Result<std::optional<RevocationRow>> Reinstate(const std::string& key,
                                                         const std::string& digest,
                                                         const std::string& by,
                                                         const std::string& reason, int64_t at) = 0;
  // The revocation of (key, digest) in force, if any (a lifted row is none).
  virtual Result<std::optional<RevocationRow>> GetRevocation(const std::string& key,
                                                             const std::string& digest) = 0;
  // Every row, lifted ones too: the signed list carries lifts so a replayed older list loses.
  virtual Result<std::vector<RevocationRow>> ListRevocations() = 0;

  // --- token revocations --------------------------------------------------------------------
  // Tokens themselves live in each hub process's tokens file (the truth at every start, so hubs
  // sharing a database never overwrite each other's); what the store shares is which tokens an
  // admin revoked. Records `row`; a second revocation of one hash keeps the first row.
  virtual Status RevokeToken(const RevokedTokenRow& row) = 0;
  virtual Result<bool> IsTokenRevoked(const std::string& token_sha256) = 0;
  virtual Result<std::vector<RevokedTokenRow>> ListRevokedTokens() = 0;

  // --- releases and obligations -------------------------------------------------------------
  // Creates one obligation per row that does not exist yet (same release, target, sm); existing
  // ones keep their state. Returns how many were created.
  virtual Result<int> AddObligations(const std::vector<ObligationRow>& rows) = 0;
  virtual Result<std::vector<ObligationRow>> ListObligations(const std::string& release) = 0;
  // Every obligation of every release, release then target then sm.
  virtual Result<std::vector<ObligationRow>> ListAllObligations() = 0;
  // Discharges owed obligations by a stored cell: those whose key equals `key`, and those of
  // (release, target, sm) with no key declared (then their key becomes `key`); only obligations
  // of release `scope` when `scope` is not "*" (the releases the publishing token holds). Returns
  // how many.
  virtual Result<int> DischargeObligations(const std::string& key, const std::string& digest,
                                           const std::string& release, const std::string& target,
                                           const std::string& sm, int64_t now,
                                           const std::string& scope = "*") = 0;
  // Sets state "settled:<token>" on an owed obligation. Returns the row afterwards (its state
  // says whether this call settled it), or nullopt if there is no such obligation.
  virtual Result<std::optional<ObligationRow>> SettleObligation(const std::string& release,
                                                                const std::string& target,
                                                                const std::string& sm,
                                                                const std::string& token,
                                                                int64_t now) = 0;

  // --- events -------------------------------------------------------------------------------
  virtual Status InsertEvents(const std::vector<StoredEvent>& rows) = 0;
  // Newest first, at most filter.limit rows.
  virtual Result<std::vector<StoredEvent>> QueryEvents(const EventFilter& filter) = 0;
  // Workers that posted rows of `org` (nullopt: of every org).
  virtual Result<std::vector<WorkerSummary>> ListWorkers(const std::optional<std::string>& org) = 0;
  // How many distinct workers of `org` (nullopt: of every org) reported adopting `key` (kind
  // boot_adopt, phase hit|local_hit).
  virtual Result<int64_t> AdoptedCount(const std::string& key,
                                       const std::optional<std::string>& org) = 0;
  // The distinct `worker` names of every org that reported `ref` (key@digest of a cell of `key`)
  // crashing a worker process (kind cell_crashed), sorted.
  virtual Result<std::vector<std::string>> CrashReporters(const std::string& key,
                                                          const std::string& ref) = 0;

  // --- mint leases --------------------------------------------------------------------------
  // Writes `want` as the lease of (want.key, want.family) unless another lease there is live:
  // no row, a row with expires_at_ms <= now_ms (its holder stopped heartbeating), or a row of the
  // same holder (a restarted worker takes its own lease back at once) is replaced. Returns the
  // row that holds the pair afterwards. Atomic across hub processes sharing a database: of two
  // acquires racing for a free pair exactly one is granted.
  virtual Result<MintLeaseAcquire> AcquireMintLease(const MintLeaseRow& want, int64_t now_ms) = 0;
  // Moves the expiry of lease `lease` of (key, family) to expires_at_ms if that lease still
  // holds the pair (even past its expiry, as long as nobody took it over). Returns whether it
  // did; false means the lease was released or taken over.
  virtual Result<bool> ExtendMintLease(const std::string& key, const std::string& family,
                                       const std::string& lease, int64_t expires_at_ms) = 0;
  // Deletes lease `lease` of (key, family) if it still holds the pair; another's lease is
  // untouched. Returns whether a row went.
  virtual Result<bool> ReleaseMintLease(const std::string& key, const std::string& family,
                                        const std::string& lease) = 0;
  virtual Result<std::optional<MintLeaseRow>> GetMintLease(const std::string& key,
                                                           const std::string& family) = 0;

  // --- hub orders ---------------------------------------------------------------------------
  // Writes `row` as the order of (row.release, row.target) with incarnation one above the
  // pair's last (1 for the first), atomically across hubs sharing the database; returns the
  // stored row (row.incarnation is ignored).
  virtual Result<OrderRow> SetOrder(const OrderRow& row) = 0;
  virtual Result<std::vector<OrderRow>> ListOrders() = 0;
};

// Opens (creating the schema if needed) the SQLite store at `path`.
Result<std::unique_ptr<HubStore>> OpenSqliteStore(const std::string& path);
// Connects to PostgreSQL ("postgresql://…"), creating the schema if needed; `pool_size`
// connections are shared by the calling threads.
Result<std::unique_ptr<HubStore>> OpenPostgresStore(const std::string& url, int pool_size = 8);
std::unique_ptr<HubStore> NewMemoryStore();

}  // namespace kiln
