// The SQLite HubStore (hub layer): the default, one database file under the hub's data dir, so
// `kiln hub` starts with nothing installed by hand. One connection in WAL mode behind a mutex;
// first-writer-wins per key is the PRIMARY KEY on cells.key with INSERT … ON CONFLICT DO NOTHING.
//
// Damage is a refusal, never a miss: the file is quick_checked at open and on CheckIntegrity, and
// any statement that meets a malformed page answers `store_corrupt` instead of "no such row". A
// store that once held data and now holds none (truncated, or replaced by an empty file) is told
// apart from a new one by its store id, kept both inside the database and beside it.
#include <sqlite3.h>

#include <filesystem>
#include <mutex>
#include <optional>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/hub/authz.h"
#include "src/kiln/hub/store.h"

namespace kiln {

namespace {

// Schema version 3: cells are owned per (key, family), intents per (key, digest, publisher),
// admin-revoked tokens are remembered (the tokens themselves are each hub's tokens file), and an
// event row keeps its target, ref, fn and stages as columns. Version 4: events and obligations
// carry the org of the token that wrote them (authz.h). Version 5: an obligation may carry a
// deadline. Version 6: a revocation may be lifted (reinstated), and counts its changes.
constexpr int kSchemaVersion = 6;
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS cells (
  key TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL, family TEXT NOT NULL,
  publisher TEXT NOT NULL, tier TEXT NOT NULL, release TEXT NOT NULL, receipt TEXT NOT NULL,
  created_at INTEGER NOT NULL, PRIMARY KEY (key, family));
CREATE INDEX IF NOT EXISTS cells_digest ON cells(digest);
CREATE TABLE IF NOT EXISTS intents (
  key TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL, family TEXT NOT NULL,
  release TEXT NOT NULL, target TEXT NOT NULL, publisher TEXT NOT NULL,
  created_at INTEGER NOT NULL, PRIMARY KEY (key, digest, publisher));
CREATE INDEX IF NOT EXISTS intents_digest ON intents(digest);
CREATE TABLE IF NOT EXISTS revocations (
  key TEXT NOT NULL, digest TEXT NOT NULL, reason TEXT NOT NULL, revoked_by TEXT NOT NULL,
  revoked_at INTEGER NOT NULL, revision INTEGER NOT NULL DEFAULT 1,
  lifted_at INTEGER NOT NULL DEFAULT 0, lifted_by TEXT NOT NULL DEFAULT '',
  lift_reason TEXT NOT NULL DEFAULT '', PRIMARY KEY (key, digest));
CREATE TABLE IF NOT EXISTS revoked_tokens (
  token_sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, revoked_by TEXT NOT NULL,
  revoked_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS obligations (
  release TEXT NOT NULL, target TEXT NOT NULL, sm TEXT NOT NULL, key TEXT NOT NULL,
  state TEXT NOT NULL, cell_digest TEXT NOT NULL, updated_at INTEGER NOT NULL,
  org TEXT NOT NULL DEFAULT '', deadline INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (release, target, sm));
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, worker TEXT NOT NULL, seq INTEGER NOT NULL,
  kind TEXT NOT NULL, phase TEXT NOT NULL, key TEXT NOT NULL, duration_ms REAL NOT NULL,
  detail TEXT NOT NULL, ts INTEGER NOT NULL, target TEXT NOT NULL DEFAULT '',
  ref TEXT NOT NULL DEFAULT '', fn TEXT NOT NULL DEFAULT '', stages TEXT NOT NULL DEFAULT '',
  org TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS events_ts ON events(ts);
CREATE INDEX IF NOT EXISTS events_key ON events(key);
CREATE INDEX IF NOT EXISTS events_org ON events(org);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS publish_claims (
  key TEXT NOT NULL, family TEXT NOT NULL, publisher TEXT NOT NULL, digest TEXT NOT NULL,
  expires_at INTEGER NOT NULL, PRIMARY KEY (key, family));
)sql";

// From version 1 (one owner per key, one intent per (key, digest)): the primary keys change, so
// the two tables are rebuilt; the rows are kept.
constexpr const char* kMigrateFrom1 = R"sql(
ALTER TABLE cells RENAME TO cells_v1;
CREATE TABLE cells (
  key TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL, family TEXT NOT NULL,
  publisher TEXT NOT NULL, tier TEXT NOT NULL, release TEXT NOT NULL, receipt TEXT NOT NULL,
  created_at INTEGER NOT NULL, PRIMARY KEY (key, family));
INSERT INTO cells SELECT key, digest, size, family, publisher, tier, release, receipt, created_at
  FROM cells_v1 ORDER BY rowid;
DROP TABLE cells_v1;
ALTER TABLE intents RENAME TO intents_v1;
DROP INDEX IF EXISTS intents_digest;
CREATE TABLE intents (
  key TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL, family TEXT NOT NULL,
  release TEXT NOT NULL, target TEXT NOT NULL, publisher TEXT NOT NULL,
  created_at INTEGER NOT NULL, PRIMARY KEY (key, digest, publisher));
INSERT INTO intents SELECT * FROM intents_v1;
DROP TABLE intents_v1;
DROP TABLE IF EXISTS tokens;
)sql";

// From version 2 (or 1): event rows gain their structured fields; old rows have none.
constexpr const char* kMigrateEventsTo3 = R"sql(
ALTER TABLE events ADD COLUMN target TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN ref TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN fn TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN stages TEXT NOT NULL DEFAULT '';
)sql";

// From version 3 (or older): event and obligation rows gain their org; old rows are untenanted
// (""), which an admin or a platform-tier token reads and no tenant's token does.
constexpr const char* kMigrateEventsTo4 =
    "ALTER TABLE events ADD COLUMN org TEXT NOT NULL DEFAULT '';";
constexpr const char* kMigrateObligationsTo4 =
    "ALTER TABLE obligations ADD COLUMN org TEXT NOT NULL DEFAULT '';";
// From version 4 (or older): obligations gain a deadline; old rows have none (0).
constexpr const char* kMigrateObligationsTo5 =
    "ALTER TABLE obligations ADD COLUMN deadline INTEGER NOT NULL DEFAULT 0;";
// From version 5 (or older): revocations gain their lift and their revision; old rows are first
// revocations in force.
constexpr const char* kMigrateRevocationsTo6 = R"sql(
ALTER TABLE revocations ADD COLUMN revision INTEGER NOT NULL DEFAULT 1;
ALTER TABLE revocations ADD COLUMN lifted_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE revocations ADD COLUMN lifted_by TEXT NOT NULL DEFAULT '';
ALTER TABLE revocations ADD COLUMN lift_reason TEXT NOT NULL DEFAULT '';
)sql";

// Mint leases (store.h MintLeaseRow) in a table of their own, created at every open: no rows of
// an older schema change, so it needs no version step.
constexpr const char* kMintLeaseSchema = R"sql(
CREATE TABLE IF NOT EXISTS mint_leases (
  key TEXT NOT NULL, family TEXT NOT NULL, holder TEXT NOT NULL, lease TEXT NOT NULL,
  acquired_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL, PRIMARY KEY (key, family));
CREATE TABLE IF NOT EXISTS hub_orders (
  release TEXT NOT NULL, target TEXT NOT NULL, kind TEXT NOT NULL, ref TEXT NOT NULL,
  share_ppm INTEGER NOT NULL, incarnation INTEGER NOT NULL, reason TEXT NOT NULL,
  set_by TEXT NOT NULL, set_at INTEGER NOT NULL, PRIMARY KEY (release, target));
)sql";

// SQLite's primary result codes that mean the file itself is damaged (not busy, not full).
bool IsDamage(int rc) {
  const int primary = rc & 0xff;
  return primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB;
}

Status StoreCorrupt(const std::string& path, const std::string& detail) {
  return Status::Refused(StatusCode::kCorruption, kRefusalStoreCorrupt,
                         "sqlite store '" + path + "': " + detail +
                             "; restore it from a backup (the hub will not start on it as empty)");
}

// A prepared statement with positional binds; finalized on destruction.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    path_ = sqlite3_db_filename(db, "main") ? sqlite3_db_filename(db, "main") : "";
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& Bind(const std::string& v) {
    sqlite3_bind_text(stmt_, ++n_, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int64_t v) {
    sqlite3_bind_int64(stmt_, ++n_, v);
    return *this;
  }
  Stmt& Bind(double v) {
    sqlite3_bind_double(stmt_, ++n_, v);
    return *this;
  }
  // SQLITE_ROW, SQLITE_DONE, or an error code.
  int Step() { return rc_ == SQLITE_OK ? sqlite3_step(stmt_) : rc_; }
  Status Run(const char* what) {
    const int rc = Step();
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return Error(what, rc);
    return Status::OK();
  }
  Status Error(const char* what, int rc) const {
    const std::string detail =
        std::string(what) + ": " + sqlite3_errstr(rc) + " (" + sqlite3_errmsg(db_) + ")";
    if (IsDamage(rc)) return StoreCorrupt(path_, detail);
    return Status::IOError("sqlite: " + detail);
  }
  std::string Text(int col) const {
    const auto* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
             : std::string();
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const { return sqlite3_column_double(stmt_, col); }

 private:
  sqlite3* db_;
  std::string path_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
  int n_ = 0;
};

constexpr const char* kCellCols =
    "key, digest, size, family, publisher, tier, release, receipt, created_at";
CellRow ReadCell(const Stmt& s) {
  CellRow r;
  r.key = s.Text(0);
  r.digest = s.Text(1);
  r.size = static_cast<uint64_t>(s.Int(2));
  r.family = s.Text(3);
  r.publisher = s.Text(4);
  r.tier = s.Text(5);
  r.release = s.Text(6);
  r.receipt = s.Text(7);
  r.created_at = s.Int(8);
  return r;
}
IntentRow ReadIntent(const Stmt& s) {
  IntentRow r;
  r.key = s.Text(0);
  r.digest = s.Text(1);
  r.size = static_cast<uint64_t>(s.Int(2));
  r.family = s.Text(3);
  r.release = s.Text(4);
  r.target = s.Text(5);
  r.publisher = s.Text(6);
  r.created_at = s.Int(7);
  return r;
}
constexpr const char* kOrderCols =
    "release, target, kind, ref, share_ppm, incarnation, reason, set_by, set_at";
OrderRow ReadOrder(const Stmt& s) {
  return OrderRow{s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Int(4),
                  s.Int(5),  s.Text(6), s.Text(7), s.Int(8)};
}
constexpr const char* kRevocationCols =
    "key, digest, reason, revoked_by, revoked_at, revision, lifted_at, lifted_by, lift_reason";
RevocationRow ReadRevocation(const Stmt& s) {
  return RevocationRow{s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Int(4),
                       s.Int(5),  s.Int(6),  s.Text(7), s.Text(8)};
}
ObligationRow ReadObligation(const Stmt& s) {
  ObligationRow r;
  r.release = s.Text(0);
  r.target = s.Text(1);
  r.sm = s.Text(2);
  r.key = s.Text(3);
  r.state = s.Text(4);
  r.cell_digest = s.Text(5);
  r.updated_at = s.Int(6);
  r.org = s.Text(7);
  r.deadline = s.Int(8);
  return r;
}
StoredEvent ReadEvent(const Stmt& s) {
  StoredEvent r;
  r.id = s.Int(0);
  r.worker = s.Text(1);
  r.seq = s.Int(2);
  r.kind = s.Text(3);
  r.phase = s.Text(4);
  r.key = s.Text(5);
  r.duration_ms = s.Real(6);
  r.detail = s.Text(7);
  r.ts = s.Int(8);
  r.target = s.Text(9);
  r.ref = s.Text(10);
  r.fn = s.Text(11);
  r.stages = s.Text(12);
  r.org = s.Text(13);
  return r;
}

class SqliteStore final : public HubStore {
 public:
  SqliteStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  ~SqliteStore() override { sqlite3_close(db_); }

  std::string Describe() const override { return "sqlite:" + path_; }

  Status Exec(const char* sql, const char* what) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
    if (rc != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      if (IsDamage(rc)) return StoreCorrupt(path_, std::string(what) + ": " + msg);
      return Status::IOError(std::string("sqlite: ") + what + " in '" + path_ + "': " + msg);
    }
    return Status::OK();
  }

  // PRAGMA quick_check: every page and index readable and consistent (not a full cross-check of
  // index contents, which costs a multiple of the file's size). OK, or store_corrupt naming the
  // first problems SQLite reported.
  Status CheckIntegrity() override {
    std::lock_guard<std::mutex> lock(mu_);
    return QuickCheckLocked();
  }
  Status QuickCheckLocked() {
    Stmt s(db_, "PRAGMA quick_check(5)");
    std::vector<std::string> problems;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) problems.push_back(s.Text(0));
    if (rc != SQLITE_DONE)
      return StoreCorrupt(path_, std::string("quick_check could not run: ") + sqlite3_errstr(rc));
    if (problems.size() == 1 && problems[0] == "ok") return Status::OK();
    std::string joined;
    for (const std::string& p : problems) joined += (joined.empty() ? "" : "; ") + p;
    return StoreCorrupt(path_, "quick_check found: " + joined);
  }

  // The store id binds the database to its data dir: a new store writes a fresh id into `meta` and
  // into `<path>.id`; a later open whose database lacks the id that the side file names was
  // truncated or replaced, and refuses rather than start empty.
  Status CheckStoreId() {
    const std::string side = path_ + ".id";
    std::error_code ec;
    const bool has_side = std::filesystem::exists(side, ec);
    std::optional<std::string> in_db;
    {
      Stmt s(db_, "SELECT value FROM meta WHERE name = 'store_id'");
      const int rc = s.Step();
      if (rc == SQLITE_ROW) {
        in_db = s.Text(0);
      } else if (rc != SQLITE_DONE) {
        return s.Error("read store id", rc);
      }
    }
    if (has_side) {
      KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(side));
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      if (!in_db) {
        return StoreCorrupt(path_, "it holds no store id, but '" + side + "' says it is store " +
                                       text + ": the database was truncated or replaced");
      }
      if (*in_db != text) {
        return StoreCorrupt(path_, "it is store " + *in_db + ", but '" + side + "' says " + text +
                                       ": another hub's database was put in its place");
      }
      return Status::OK();
    }
    std::string id = in_db.value_or("");
    if (id.empty()) {
      KILN_ASSIGN_OR_RETURN(std::string random, GenerateToken());
      id = Sha256Hex(random).substr(0, 32);
      Stmt s(db_, "INSERT INTO meta (name, value) VALUES ('store_id', ?)");
      s.Bind(id);
      KILN_RETURN_IF_ERROR(s.Run("write store id"));
    }
    return WriteSecretFileAtomic(side, id + "\n");
  }

  Result<CellInsert> InsertCellIfAbsent(const CellRow& row) override {
    std::lock_guard<std::mutex> lock(mu_);
    bool inserted = false;
    {
      // A live owner is never overwritten; an owner whose (key, digest) is revoked is replaced.
      Stmt s(db_,
             "INSERT INTO cells (key, digest, size, family, publisher, tier, release, receipt, "
             "created_at) VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(key, family) DO UPDATE SET "
             "digest = excluded.digest, size = excluded.size, publisher = excluded.publisher, "
             "tier = excluded.tier, release = excluded.release, receipt = excluded.receipt, "
             "created_at = excluded.created_at WHERE cells.digest <> excluded.digest AND EXISTS "
             "(SELECT 1 FROM revocations r WHERE r.key = cells.key AND r.digest = cells.digest "
             "AND r.lifted_at = 0)");
      s.Bind(row.key).Bind(row.digest).Bind(static_cast<int64_t>(row.size)).Bind(row.family);
      s.Bind(row.publisher).Bind(row.tier).Bind(row.release).Bind(row.receipt).Bind(row.created_at);
      KILN_RETURN_IF_ERROR(s.Run("insert cell"));
      // mu_ serialises every statement on this connection, so the count is this insert's.
      inserted = sqlite3_changes(db_) == 1;
    }
    KILN_ASSIGN_OR_RETURN(auto existing, GetCellLocked(row.key, row.family));
    if (!existing) return Status::Internal("sqlite: cell '" + row.key + "' vanished after insert");
    return CellInsert{*existing, inserted};
  }
  Result<std::optional<CellRow>> GetCell(const std::string& key,
                                         const std::string& family) override {
    std::lock_guard<std::mutex> lock(mu_);
    return GetCellLocked(key, family);
  }
  Result<std::vector<CellRow>> ListCellsForKey(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, (std::string("SELECT ") + kCellCols +
                 " FROM cells WHERE key = ? ORDER BY created_at, rowid")
                    .c_str());
    s.Bind(key);
    return All<CellRow>(s, ReadCell, "list cells of a key");
  }
  Result<std::vector<CellRow>> CellsWithDigest(const std::string& digest) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, (std::string("SELECT ") + kCellCols +
                 " FROM cells WHERE digest = ? ORDER BY created_at, rowid")
                    .c_str());
    s.Bind(digest);
    return All<CellRow>(s, ReadCell, "cells of a digest");
  }
  Result<std::vector<CellRow>> ListCells(int limit) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, (std::string("SELECT ") + kCellCols +
                 " FROM cells ORDER BY created_at DESC, rowid DESC LIMIT ?")
                    .c_str());
    s.Bind(static_cast<int64_t>(limit));
    std::vector<CellRow> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) out.push_back(ReadCell(s));
    if (rc != SQLITE_DONE) return s.Error("list cells", rc);
    return out;
  }

  Result<bool> UpdateReceipt(const std::string& key, const std::string& family,
                             const std::string& digest, const std::string& receipt) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "UPDATE cells SET receipt = ? WHERE key = ? AND family = ? AND digest = ?");
    s.Bind(receipt).Bind(key).Bind(family).Bind(digest);
    KILN_RETURN_IF_ERROR(s.Run("update receipt"));
    return sqlite3_changes(db_) == 1;
  }

  Status PutIntent(const IntentRow& r) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "INSERT OR REPLACE INTO intents (key, digest, size, family, release, target, publisher, "
           "created_at) VALUES (?,?,?,?,?,?,?,?)");
    s.Bind(r.key).Bind(r.digest).Bind(static_cast<int64_t>(r.size)).Bind(r.family).Bind(r.release);
    s.Bind(r.target).Bind(r.publisher).Bind(r.created_at);
    return s.Run("put intent");
  }
  Result<std::optional<IntentRow>> GetIntent(const std::string& key, const std::string& digest,
                                             const std::string& publisher) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "SELECT key, digest, size, family, release, target, publisher, created_at FROM intents "
           "WHERE key = ? AND digest = ? AND publisher = ?");
    s.Bind(key).Bind(digest).Bind(publisher);
    return One<IntentRow>(s, ReadIntent, "get intent");
  }
  Result<std::optional<IntentRow>> FindIntentByDigest(const std::string& digest,
                                                      const std::string& publisher) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "SELECT key, digest, size, family, release, target, publisher, created_at FROM intents "
           "WHERE digest = ? AND (? = '' OR publisher = ?) ORDER BY created_at DESC LIMIT 1");
    s.Bind(digest).Bind(publisher).Bind(publisher);
    return One<IntentRow>(s, ReadIntent, "find intent");
  }
  Result<PublishClaimResult> ClaimPublish(const PublishClaim& claim, int64_t now) override {
    std::lock_guard<std::mutex> lock(mu_);
    bool ours = false;
    {
      // One statement: the claim is taken, refreshed or left to its live holder atomically, even
      // against another process writing the same file.
      Stmt s(db_,
             "INSERT INTO publish_claims (key, family, publisher, digest, expires_at) VALUES "
             "(?,?,?,?,?) ON CONFLICT(key, family) DO UPDATE SET publisher = excluded.publisher, "
             "digest = excluded.digest, expires_at = excluded.expires_at WHERE "
             "publish_claims.publisher = excluded.publisher OR publish_claims.expires_at <= ?");
      s.Bind(claim.key).Bind(claim.family).Bind(claim.publisher).Bind(claim.digest);
      s.Bind(claim.expires_at).Bind(now);
      KILN_RETURN_IF_ERROR(s.Run("claim publish"));
      ours = sqlite3_changes(db_) == 1;
    }
    Stmt s(db_,
           "SELECT key, family, publisher, digest, expires_at FROM publish_claims WHERE key = ? "
           "AND family = ?");
    s.Bind(claim.key).Bind(claim.family);
    const int rc = s.Step();
    if (rc != SQLITE_ROW) {
      if (rc == SQLITE_DONE) {
        return Status::Internal("sqlite: the publish claim on '" + claim.key + "' in family '" +
                                claim.family + "' vanished after it was written");
      }
      return s.Error("read publish claim", rc);
    }
    PublishClaim holder{s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Int(4)};
    return PublishClaimResult{std::move(holder), ours};
  }
  Result<bool> ReleasePublishClaim(const std::string& key, const std::string& family,
                                   const std::string& publisher) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "DELETE FROM publish_claims WHERE key = ? AND family = ? AND publisher = ?");
    s.Bind(key).Bind(family).Bind(publisher);
    KILN_RETURN_IF_ERROR(s.Run("release publish claim"));
    return sqlite3_changes(db_) == 1;
  }
  Result<int> DeleteExpiredPublishClaims(int64_t now) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "DELETE FROM publish_claims WHERE expires_at <= ?");
    s.Bind(now);
    KILN_RETURN_IF_ERROR(s.Run("delete expired publish claims"));
    return sqlite3_changes(db_);
  }
  Result<int> DeleteIntentsBefore(int64_t before) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "DELETE FROM intents WHERE created_at < ?");
    s.Bind(before);
    KILN_RETURN_IF_ERROR(s.Run("delete old intents"));
    return sqlite3_changes(db_);
  }
  Result<PublisherUsage> GetPublisherUsage(const std::string& publisher) override {
    std::lock_guard<std::mutex> lock(mu_);
    PublisherUsage usage;
    {
      Stmt s(db_, "SELECT COALESCE(SUM(size), 0) FROM cells WHERE publisher = ?");
      s.Bind(publisher);
      const int rc = s.Step();
      if (rc != SQLITE_ROW) return s.Error("publisher usage", rc);
      usage.cell_bytes = static_cast<uint64_t>(s.Int(0));
    }
    Stmt s(db_,
           "SELECT key, digest, size, family, release, target, publisher, created_at FROM intents "
           "i WHERE publisher = ? AND NOT EXISTS (SELECT 1 FROM cells c WHERE c.key = i.key AND "
           "c.digest = i.digest)");
    s.Bind(publisher);
    KILN_ASSIGN_OR_RETURN(usage.open_intents, All<IntentRow>(s, ReadIntent, "publisher intents"));
    return usage;
  }

  Status Revoke(const RevocationRow& r) override {
    std::lock_guard<std::mutex> lock(mu_);
    // A row in force is kept; a lifted one is revoked again, one revision higher.
    Stmt s(db_,
           "INSERT INTO revocations (key, digest, reason, revoked_by, revoked_at) VALUES "
           "(?,?,?,?,?) ON CONFLICT(key, digest) DO UPDATE SET reason = excluded.reason, "
           "revoked_by = excluded.revoked_by, revoked_at = excluded.revoked_at, revision = "
           "revocations.revision + 1, lifted_at = 0, lifted_by = '', lift_reason = '' WHERE "
           "revocations.lifted_at <> 0");
    s.Bind(r.key).Bind(r.digest).Bind(r.reason).Bind(r.revoked_by).Bind(r.revoked_at);
    return s.Run("revoke");
  }
  Result<std::optional<RevocationRow>> Reinstate(const std::string& key, const std::string& digest,
                                                 const std::string& by, const std::string& reason,
                                                 int64_t at) override {
    std::lock_guard<std::mutex> lock(mu_);
    {
      Stmt s(db_,
             "UPDATE revocations SET lifted_at = ?, lifted_by = ?, lift_reason = ?, revision = "
             "revision + 1 WHERE key = ? AND digest = ? AND lifted_at = 0");
      s.Bind(std::max<int64_t>(at, 1)).Bind(by).Bind(reason).Bind(key).Bind(digest);
      KILN_RETURN_IF_ERROR(s.Run("reinstate"));
    }
    const std::string sql =
        std::string("SELECT ") + kRevocationCols + " FROM revocations WHERE key = ? AND digest = ?";
    Stmt s(db_, sql.c_str());
    s.Bind(key).Bind(digest);
    return One<RevocationRow>(s, ReadRevocation, "get revocation");
  }
  Result<std::optional<RevocationRow>> GetRevocation(const std::string& key,
                                                     const std::string& digest) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string sql = std::string("SELECT ") + kRevocationCols +
                            " FROM revocations WHERE key = ? AND digest = ? AND lifted_at = 0";
    Stmt s(db_, sql.c_str());
    s.Bind(key).Bind(digest);
    return One<RevocationRow>(s, ReadRevocation, "get revocation");
  }
  Result<std::vector<RevocationRow>> ListRevocations() override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string sql =
        std::string("SELECT ") + kRevocationCols + " FROM revocations ORDER BY revoked_at, key";
    Stmt s(db_, sql.c_str());
    return All<RevocationRow>(s, ReadRevocation, "list revocations");
  }

  Status RevokeToken(const RevokedTokenRow& r) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "INSERT INTO revoked_tokens (token_sha256, name, revoked_by, revoked_at) VALUES "
           "(?,?,?,?) ON CONFLICT(token_sha256) DO NOTHING");
    s.Bind(r.token_sha256).Bind(r.name).Bind(r.revoked_by).Bind(r.revoked_at);
    return s.Run("record revoked token");
  }
  Result<bool> IsTokenRevoked(const std::string& token_sha256) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "SELECT 1 FROM revoked_tokens WHERE token_sha256 = ?");
    s.Bind(token_sha256);
    const int rc = s.Step();
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return s.Error("check revoked token", rc);
  }
  Result<std::vector<RevokedTokenRow>> ListRevokedTokens() override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "SELECT token_sha256, name, revoked_by, revoked_at FROM revoked_tokens ORDER BY "
           "revoked_at, name");
    return All<RevokedTokenRow>(
        s,
        [](const Stmt& s) {
          return RevokedTokenRow{s.Text(0), s.Text(1), s.Text(2), s.Int(3)};
        },
        "list revoked tokens");
  }

  Result<int> AddObligations(const std::vector<ObligationRow>& rows) override {
    std::lock_guard<std::mutex> lock(mu_);
    KILN_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", "begin"));
    int created = 0;
    for (const auto& r : rows) {
      Stmt s(db_,
             "INSERT INTO obligations (release, target, sm, key, state, cell_digest, updated_at, "
             "org, deadline) VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(release, target, sm) DO "
             "NOTHING");
      s.Bind(r.release).Bind(r.target).Bind(r.sm).Bind(r.key).Bind(r.state).Bind(r.cell_digest);
      s.Bind(r.updated_at).Bind(r.org).Bind(r.deadline);
      Status st = s.Run("add obligation");
      if (!st.ok()) {
        Exec("ROLLBACK", "rollback").IgnoreError();
        return st;
      }
      created += sqlite3_changes(db_);
    }
    KILN_RETURN_IF_ERROR(Exec("COMMIT", "commit"));
    return created;
  }
  Result<std::vector<ObligationRow>> ListObligations(const std::string& release) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "SELECT release, target, sm, key, state, cell_digest, updated_at, org, deadline FROM "
           "obligations "
           "WHERE release = ? ORDER BY target, sm");
    s.Bind(release);
    return All<ObligationRow>(s, ReadObligation, "list obligations");
  }
  Result<std::vector<ObligationRow>> ListAllObligations() override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "SELECT release, target, sm, key, state, cell_digest, updated_at, org, deadline FROM "
           "obligations "
           "ORDER BY release, target, sm");
    return All<ObligationRow>(s, ReadObligation, "list obligations");
  }
  Result<int> DischargeObligations(const std::string& key, const std::string& digest,
                                   const std::string& release, const std::string& target,
                                   const std::string& sm, int64_t now,
                                   const std::string& scope) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "UPDATE obligations SET state = 'discharged', key = ?, cell_digest = ?, updated_at = ? "
           "WHERE state = 'owed' AND (? = '*' OR release = ?) AND (key = ? OR (key = '' AND "
           "? <> '' AND release = ? AND target = ? AND sm = ?))");
    s.Bind(key).Bind(digest).Bind(now).Bind(scope).Bind(scope).Bind(key).Bind(release);
    s.Bind(release).Bind(target).Bind(sm);
    KILN_RETURN_IF_ERROR(s.Run("discharge obligations"));
    return sqlite3_changes(db_);
  }
  Result<std::optional<ObligationRow>> SettleObligation(const std::string& release,
                                                        const std::string& target,
                                                        const std::string& sm,
                                                        const std::string& token,
                                                        int64_t now) override {
    std::lock_guard<std::mutex> lock(mu_);
    {
      Stmt s(db_,
             "UPDATE obligations SET state = ?, updated_at = ? WHERE release = ? AND target = ? "
             "AND sm = ? AND state = 'owed'");
      s.Bind("settled:" + token).Bind(now).Bind(release).Bind(target).Bind(sm);
      KILN_RETURN_IF_ERROR(s.Run("settle obligation"));
    }
    Stmt s(db_,
           "SELECT release, target, sm, key, state, cell_digest, updated_at, org, deadline FROM "
           "obligations "
           "WHERE release = ? AND target = ? AND sm = ?");
    s.Bind(release).Bind(target).Bind(sm);
    return One<ObligationRow>(s, ReadObligation, "get obligation");
  }

  Status InsertEvents(const std::vector<StoredEvent>& rows) override {
    std::lock_guard<std::mutex> lock(mu_);
    KILN_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", "begin"));
    for (const auto& r : rows) {
      Stmt s(db_,
             "INSERT INTO events (worker, seq, kind, phase, key, duration_ms, detail, ts, target, "
             "ref, fn, stages, org) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)");
      s.Bind(r.worker).Bind(r.seq).Bind(r.kind).Bind(r.phase).Bind(r.key).Bind(r.duration_ms);
      s.Bind(r.detail).Bind(r.ts).Bind(r.target).Bind(r.ref).Bind(r.fn).Bind(r.stages);
      s.Bind(r.org);
      Status st = s.Run("insert event");
      if (!st.ok()) {
        Exec("ROLLBACK", "rollback").IgnoreError();
        return st;
      }
    }
    return Exec("COMMIT", "commit");
  }
  Result<std::vector<StoredEvent>> QueryEvents(const EventFilter& f) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "SELECT id, worker, seq, kind, phase, key, duration_ms, detail, ts, target, ref, fn, "
           "stages, org FROM events WHERE "
           "(? = '' OR worker = ?) AND (? = '' OR kind = ?) AND (? = '' OR phase = ?) AND ts >= ? "
           "AND (? = 0 OR org = ?) ORDER BY id DESC LIMIT ?");
    s.Bind(f.worker).Bind(f.worker).Bind(f.kind).Bind(f.kind).Bind(f.phase).Bind(f.phase);
    s.Bind(f.since_ts).Bind(static_cast<int64_t>(f.org.has_value())).Bind(f.org.value_or(""));
    s.Bind(static_cast<int64_t>(f.limit));
    return All<StoredEvent>(s, ReadEvent, "query events");
  }
  Result<std::vector<WorkerSummary>> ListWorkers(const std::optional<std::string>& org) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "SELECT worker, MAX(ts), COUNT(*) FROM events WHERE (? = 0 OR org = ?) GROUP BY worker "
           "ORDER BY worker");
    s.Bind(static_cast<int64_t>(org.has_value())).Bind(org.value_or(""));
    return All<WorkerSummary>(
        s,
        [](const Stmt& s) {
          return WorkerSummary{s.Text(0), s.Int(1), s.Int(2)};
        },
        "list workers");
  }
  Result<int64_t> AdoptedCount(const std::string& key,
                               const std::optional<std::string>& org) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "SELECT COUNT(DISTINCT worker) FROM events WHERE kind = 'boot_adopt' AND phase IN "
           "('hit', 'local_hit') AND (key = ? OR key LIKE ? || '@%') AND (? = 0 OR org = ?)");
    s.Bind(key).Bind(key).Bind(static_cast<int64_t>(org.has_value())).Bind(org.value_or(""));
    const int rc = s.Step();
    if (rc != SQLITE_ROW) return s.Error("adopted count", rc);
    return s.Int(0);
  }

  Result<std::vector<std::string>> CrashReporters(const std::string& key,
                                                  const std::string& ref) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "SELECT DISTINCT worker FROM events WHERE key = ? AND kind = 'cell_crashed' AND ref = ? "
           "ORDER BY worker");
    s.Bind(key).Bind(ref);
    std::vector<std::string> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) out.push_back(s.Text(0));
    if (rc != SQLITE_DONE) return s.Error("crash reporters", rc);
    return out;
  }

  // One statement under mu_, and SQLite runs each statement in a transaction of its own that
  // holds the database's write lock, so the take-over condition and the write are one step for
  // every process sharing the file.
  Result<MintLeaseAcquire> AcquireMintLease(const MintLeaseRow& want, int64_t now_ms) override {
    std::lock_guard<std::mutex> lock(mu_);
    bool granted = false;
    {
      Stmt s(db_,
             "INSERT INTO mint_leases (key, family, holder, lease, acquired_at_ms, expires_at_ms) "
             "VALUES (?,?,?,?,?,?) ON CONFLICT(key, family) DO UPDATE SET holder = "
             "excluded.holder, lease = excluded.lease, acquired_at_ms = excluded.acquired_at_ms, "
             "expires_at_ms = excluded.expires_at_ms WHERE mint_leases.expires_at_ms <= ? OR "
             "mint_leases.holder = excluded.holder");
      s.Bind(want.key).Bind(want.family).Bind(want.holder).Bind(want.lease);
      s.Bind(want.acquired_at_ms).Bind(want.expires_at_ms).Bind(now_ms);
      KILN_RETURN_IF_ERROR(s.Run("acquire mint lease"));
      granted = sqlite3_changes(db_) == 1;
    }
    KILN_ASSIGN_OR_RETURN(auto owner, GetMintLeaseLocked(want.key, want.family));
    if (!owner) return Status::Internal("sqlite: mint lease of '" + want.key + "' vanished");
    return MintLeaseAcquire{*owner, granted && owner->lease == want.lease};
  }
  Result<bool> ExtendMintLease(const std::string& key, const std::string& family,
                               const std::string& lease, int64_t expires_at_ms) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_,
           "UPDATE mint_leases SET expires_at_ms = ? WHERE key = ? AND family = ? AND lease = ?");
    s.Bind(expires_at_ms).Bind(key).Bind(family).Bind(lease);
    KILN_RETURN_IF_ERROR(s.Run("extend mint lease"));
    return sqlite3_changes(db_) == 1;
  }
  Result<bool> ReleaseMintLease(const std::string& key, const std::string& family,
                                const std::string& lease) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "DELETE FROM mint_leases WHERE key = ? AND family = ? AND lease = ?");
    s.Bind(key).Bind(family).Bind(lease);
    KILN_RETURN_IF_ERROR(s.Run("release mint lease"));
    return sqlite3_changes(db_) == 1;
  }
  Result<std::optional<MintLeaseRow>> GetMintLease(const std::string& key,
                                                   const std::string& family) override {
    std::lock_guard<std::mutex> lock(mu_);
    return GetMintLeaseLocked(key, family);
  }

  Result<OrderRow> SetOrder(const OrderRow& r) override {
    std::lock_guard<std::mutex> lock(mu_);
    {
      // One statement: the incarnation is read and raised under SQLite's write lock.
      Stmt s(db_,
             "INSERT INTO hub_orders (release, target, kind, ref, share_ppm, incarnation, reason, "
             "set_by, set_at) VALUES (?,?,?,?,?,1,?,?,?) ON CONFLICT(release, target) DO UPDATE "
             "SET kind = excluded.kind, ref = excluded.ref, share_ppm = excluded.share_ppm, "
             "incarnation = hub_orders.incarnation + 1, reason = excluded.reason, set_by = "
             "excluded.set_by, set_at = excluded.set_at");
      s.Bind(r.release).Bind(r.target).Bind(r.kind).Bind(r.ref).Bind(r.share_ppm);
      s.Bind(r.reason).Bind(r.set_by).Bind(r.set_at);
      KILN_RETURN_IF_ERROR(s.Run("set order"));
    }
    const std::string sql =
        std::string("SELECT ") + kOrderCols + " FROM hub_orders WHERE release = ? AND target = ?";
    Stmt s(db_, sql.c_str());
    s.Bind(r.release).Bind(r.target);
    KILN_ASSIGN_OR_RETURN(auto row, One<OrderRow>(s, ReadOrder, "get order"));
    if (!row) return Status::Internal("sqlite: the order of '" + r.target + "' vanished");
    return *row;
  }
  Result<std::vector<OrderRow>> ListOrders() override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string sql =
        std::string("SELECT ") + kOrderCols + " FROM hub_orders ORDER BY release, target";
    Stmt s(db_, sql.c_str());
    return All<OrderRow>(s, ReadOrder, "list orders");
  }

 private:
  Result<std::optional<MintLeaseRow>> GetMintLeaseLocked(const std::string& key,
                                                         const std::string& family) {
    Stmt s(db_,
           "SELECT key, family, holder, lease, acquired_at_ms, expires_at_ms FROM mint_leases "
           "WHERE key = ? AND family = ?");
    s.Bind(key).Bind(family);
    return One<MintLeaseRow>(
        s,
        [](const Stmt& s) {
          return MintLeaseRow{s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Int(4), s.Int(5)};
        },
        "get mint lease");
  }
  Result<std::optional<CellRow>> GetCellLocked(const std::string& key, const std::string& family) {
    Stmt s(
        db_,
        (std::string("SELECT ") + kCellCols + " FROM cells WHERE key = ? AND family = ?").c_str());
    s.Bind(key).Bind(family);
    return One<CellRow>(s, ReadCell, "get cell");
  }

 public:
  // Creates the schema, or brings an older one to kSchemaVersion.
  Status Migrate() {
    std::lock_guard<std::mutex> lock(mu_);
    auto version_now = [&] {
      Stmt v(db_, "PRAGMA user_version");
      return v.Step() == SQLITE_ROW ? static_cast<int>(v.Int(0)) : 0;
    };
    if (version_now() >= kSchemaVersion) return Exec(kSchema, "create schema");
    // Decided inside the write transaction: another hub opening the same file migrates first or
    // after, never on the same reading of the version.
    KILN_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", "begin migration"));
    const int version = version_now();
    auto has_table = [&](const char* name) {
      Stmt t(db_, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?");
      t.Bind(std::string(name));
      return t.Step() == SQLITE_ROW;
    };
    Status st;
    if (version < kSchemaVersion) {
      if (has_table("cells") && version < 2) st = Exec(kMigrateFrom1, "migrate schema 1 to 2");
      if (st.ok() && has_table("events") && version < 3) {
        st = Exec(kMigrateEventsTo3, "migrate events to schema 3");
      }
      if (st.ok() && has_table("events") && version < 4) {
        st = Exec(kMigrateEventsTo4, "migrate events to schema 4");
      }
      if (st.ok() && has_table("obligations") && version < 4) {
        st = Exec(kMigrateObligationsTo4, "migrate obligations to schema 4");
      }
      if (st.ok() && has_table("obligations") && version < 5) {
        st = Exec(kMigrateObligationsTo5, "migrate obligations to schema 5");
      }
      if (st.ok() && has_table("revocations") && version < 6) {
        st = Exec(kMigrateRevocationsTo6, "migrate revocations to schema 6");
      }
    }
    if (st.ok()) st = Exec(kSchema, "create schema");
    if (st.ok()) {
      st = Exec(("PRAGMA user_version = " + std::to_string(kSchemaVersion)).c_str(),
                "set schema version");
    }
    if (!st.ok()) {
      Exec("ROLLBACK", "rollback").IgnoreError();
      return st;
    }
    return Exec("COMMIT", "commit migration");
  }

 private:
  template <typename T, typename F>
  Result<std::optional<T>> One(Stmt& s, F read, const char* what) {
    const int rc = s.Step();
    if (rc == SQLITE_DONE) return std::optional<T>();
    if (rc != SQLITE_ROW) return s.Error(what, rc);
    return std::optional<T>(read(s));
  }
  template <typename T, typename F>
  Result<std::vector<T>> All(Stmt& s, F read, const char* what) {
    std::vector<T> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) out.push_back(read(s));
    if (rc != SQLITE_DONE) return s.Error(what, rc);
    return out;
  }

  std::mutex mu_;
  sqlite3* db_;
  std::string path_;
};

}  // namespace

Result<std::unique_ptr<HubStore>> OpenSqliteStore(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return Status::IOError("sqlite: cannot open '" + path + "': " + msg);
  }
  auto store = std::make_unique<SqliteStore>(db, path);
  sqlite3_busy_timeout(db, 5000);
  // Checked before anything writes: creating the schema on a damaged file could bury the damage.
  KILN_RETURN_IF_ERROR(store->CheckIntegrity());
  KILN_RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL", "enable WAL"));
  KILN_RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL", "set synchronous"));
  KILN_RETURN_IF_ERROR(store->Migrate());
  KILN_RETURN_IF_ERROR(store->Exec(kMintLeaseSchema, "create mint lease table"));
  KILN_RETURN_IF_ERROR(store->CheckStoreId());
  return std::unique_ptr<HubStore>(std::move(store));
}

}  // namespace kiln
