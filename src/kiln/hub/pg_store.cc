// The PostgreSQL HubStore (hub layer): several hub processes share one database. First-writer-
// wins per key holds across processes because cells.key is the PRIMARY KEY and the insert is
// INSERT … ON CONFLICT DO NOTHING followed by a read of the row that owns the key.
//
// libpqxx throws; every call is wrapped here so that no exception leaves this file. A small pool
// of connections serves the calling threads; a connection that broke is replaced once and the
// operation retried (all operations are idempotent or conflict-safe).
#include <condition_variable>
#include <functional>
#include <mutex>
#include <pqxx/pqxx>

#include "src/kiln/base/log.h"
#include "src/kiln/hub/store.h"

namespace kiln {

namespace {

// Schema version 2 (see sqlite_store.cc): cells owned per (key, family), intents per (key,
// digest, publisher), remembered token revocations; tokens live in each hub's tokens file. The
// statements are idempotent, so a database of version 1 is brought forward by running them (the
// primary keys are replaced in place; the rows are kept). Event rows' structured fields (target,
// ref, fn, stages) are added to an older events table the same way, with "" for old rows, and so
// is the org that events and obligations carry (authz.h), with "" (untenanted) for old rows.
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS cells (
  key TEXT NOT NULL, digest TEXT NOT NULL, size BIGINT NOT NULL, family TEXT NOT NULL,
  publisher TEXT NOT NULL, tier TEXT NOT NULL, release TEXT NOT NULL, receipt TEXT NOT NULL,
  created_at BIGINT NOT NULL, seq BIGSERIAL, PRIMARY KEY (key, family));
CREATE TABLE IF NOT EXISTS intents (
  key TEXT NOT NULL, digest TEXT NOT NULL, size BIGINT NOT NULL, family TEXT NOT NULL,
  release TEXT NOT NULL, target TEXT NOT NULL, publisher TEXT NOT NULL,
  created_at BIGINT NOT NULL, PRIMARY KEY (key, digest, publisher));
CREATE TABLE IF NOT EXISTS kiln_schema (version INT NOT NULL);
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM kiln_schema WHERE version >= 2) THEN
    ALTER TABLE cells DROP CONSTRAINT IF EXISTS cells_pkey;
    ALTER TABLE cells ADD PRIMARY KEY (key, family);
    ALTER TABLE intents DROP CONSTRAINT IF EXISTS intents_pkey;
    ALTER TABLE intents ADD PRIMARY KEY (key, digest, publisher);
    DROP TABLE IF EXISTS tokens;
    DELETE FROM kiln_schema;
    INSERT INTO kiln_schema VALUES (2);
  END IF;
END $$;
CREATE INDEX IF NOT EXISTS cells_digest ON cells(digest);
CREATE INDEX IF NOT EXISTS intents_digest ON intents(digest);
CREATE TABLE IF NOT EXISTS revocations (
  key TEXT NOT NULL, digest TEXT NOT NULL, reason TEXT NOT NULL, revoked_by TEXT NOT NULL,
  revoked_at BIGINT NOT NULL, PRIMARY KEY (key, digest));
CREATE TABLE IF NOT EXISTS revoked_tokens (
  token_sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, revoked_by TEXT NOT NULL,
  revoked_at BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS obligations (
  release TEXT NOT NULL, target TEXT NOT NULL, sm TEXT NOT NULL, key TEXT NOT NULL,
  state TEXT NOT NULL, cell_digest TEXT NOT NULL, updated_at BIGINT NOT NULL,
  PRIMARY KEY (release, target, sm));
CREATE TABLE IF NOT EXISTS events (
  id BIGSERIAL PRIMARY KEY, worker TEXT NOT NULL, seq BIGINT NOT NULL,
  kind TEXT NOT NULL, phase TEXT NOT NULL, key TEXT NOT NULL, duration_ms DOUBLE PRECISION NOT NULL,
  detail TEXT NOT NULL, ts BIGINT NOT NULL);
ALTER TABLE events ADD COLUMN IF NOT EXISTS target TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN IF NOT EXISTS ref TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN IF NOT EXISTS fn TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN IF NOT EXISTS stages TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN IF NOT EXISTS org TEXT NOT NULL DEFAULT '';
ALTER TABLE obligations ADD COLUMN IF NOT EXISTS org TEXT NOT NULL DEFAULT '';
ALTER TABLE obligations ADD COLUMN IF NOT EXISTS deadline BIGINT NOT NULL DEFAULT 0;
ALTER TABLE revocations ADD COLUMN IF NOT EXISTS revision BIGINT NOT NULL DEFAULT 1;
ALTER TABLE revocations ADD COLUMN IF NOT EXISTS lifted_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE revocations ADD COLUMN IF NOT EXISTS lifted_by TEXT NOT NULL DEFAULT '';
ALTER TABLE revocations ADD COLUMN IF NOT EXISTS lift_reason TEXT NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS events_ts ON events(ts);
CREATE INDEX IF NOT EXISTS events_key ON events(key);
CREATE INDEX IF NOT EXISTS events_org ON events(org);
CREATE TABLE IF NOT EXISTS publish_claims (
  key TEXT NOT NULL, family TEXT NOT NULL, publisher TEXT NOT NULL, digest TEXT NOT NULL,
  expires_at BIGINT NOT NULL, PRIMARY KEY (key, family));
)sql";

constexpr const char* kCellCols =
    "key, digest, size, family, publisher, tier, release, receipt, created_at";
constexpr const char* kIntentCols =
    "key, digest, size, family, release, target, publisher, created_at";
constexpr const char* kObligationCols =
    "release, target, sm, key, state, cell_digest, updated_at, org, deadline";
// Resolve's hot path, prepared once per connection: the cell and its revocation in one round
// trip, planned once.
constexpr const char* kResolveStatement = "kiln_resolve";
constexpr const char* kResolveSql =
    "SELECT c.key, c.digest, c.size, c.family, c.publisher, c.tier, c.release, c.receipt, "
    "c.created_at, r.reason, r.revoked_by, r.revoked_at, r.revision FROM cells c LEFT JOIN "
    "revocations r ON r.key = c.key AND r.digest = c.digest AND r.lifted_at = 0 WHERE c.key = $1 "
    "AND c.family = $2";
constexpr const char* kRevocationCols =
    "key, digest, reason, revoked_by, revoked_at, revision, lifted_at, lifted_by, lift_reason";
constexpr const char* kEventCols =
    "id, worker, seq, kind, phase, key, duration_ms, detail, ts, target, ref, fn, stages, org";

std::string S(const pqxx::field& f) { return f.is_null() ? std::string() : f.as<std::string>(); }
int64_t I(const pqxx::field& f) { return f.is_null() ? 0 : f.as<int64_t>(); }

CellRow ReadCell(const pqxx::row& r) {
  CellRow c;
  c.key = S(r[0]);
  c.digest = S(r[1]);
  c.size = static_cast<uint64_t>(I(r[2]));
  c.family = S(r[3]);
  c.publisher = S(r[4]);
  c.tier = S(r[5]);
  c.release = S(r[6]);
  c.receipt = S(r[7]);
  c.created_at = I(r[8]);
  return c;
}
IntentRow ReadIntent(const pqxx::row& r) {
  IntentRow i;
  i.key = S(r[0]);
  i.digest = S(r[1]);
  i.size = static_cast<uint64_t>(I(r[2]));
  i.family = S(r[3]);
  i.release = S(r[4]);
  i.target = S(r[5]);
  i.publisher = S(r[6]);
  i.created_at = I(r[7]);
  return i;
}
RevocationRow ReadRevocation(const pqxx::row& r) {
  return RevocationRow{S(r[0]), S(r[1]), S(r[2]), S(r[3]), I(r[4]),
                       I(r[5]), I(r[6]), S(r[7]), S(r[8])};
}
ObligationRow ReadObligation(const pqxx::row& r) {
  ObligationRow o;
  o.release = S(r[0]);
  o.target = S(r[1]);
  o.sm = S(r[2]);
  o.key = S(r[3]);
  o.state = S(r[4]);
  o.cell_digest = S(r[5]);
  o.updated_at = I(r[6]);
  o.org = S(r[7]);
  o.deadline = I(r[8]);
  return o;
}
StoredEvent ReadEvent(const pqxx::row& r) {
  StoredEvent e;
  e.id = I(r[0]);
  e.worker = S(r[1]);
  e.seq = I(r[2]);
  e.kind = S(r[3]);
  e.phase = S(r[4]);
  e.key = S(r[5]);
  e.duration_ms = r[6].is_null() ? 0 : r[6].as<double>();
  e.detail = S(r[7]);
  e.ts = I(r[8]);
  e.target = S(r[9]);
  e.ref = S(r[10]);
  e.fn = S(r[11]);
  e.org = S(r[13]);
  e.stages = S(r[12]);
  return e;
}

// Mint leases (store.h MintLeaseRow): a table of its own, created idempotently at every start.
constexpr const char* kMintLeaseSchema = R"sql(
CREATE TABLE IF NOT EXISTS mint_leases (
  key TEXT NOT NULL, family TEXT NOT NULL, holder TEXT NOT NULL, lease TEXT NOT NULL,
  acquired_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL, PRIMARY KEY (key, family));
CREATE TABLE IF NOT EXISTS hub_orders (
  release TEXT NOT NULL, target TEXT NOT NULL, kind TEXT NOT NULL, ref TEXT NOT NULL,
  share_ppm BIGINT NOT NULL, incarnation BIGINT NOT NULL, reason TEXT NOT NULL,
  set_by TEXT NOT NULL, set_at BIGINT NOT NULL, PRIMARY KEY (release, target));
)sql";
constexpr const char* kOrderCols =
    "release, target, kind, ref, share_ppm, incarnation, reason, set_by, set_at";
OrderRow ReadOrder(const pqxx::row& r) {
  return OrderRow{S(r[0]), S(r[1]), S(r[2]), S(r[3]), I(r[4]), I(r[5]), S(r[6]), S(r[7]), I(r[8])};
}
constexpr const char* kMintLeaseCols = "key, family, holder, lease, acquired_at_ms, expires_at_ms";

MintLeaseRow ReadMintLease(const pqxx::row& r) {
  return MintLeaseRow{S(r[0]), S(r[1]), S(r[2]), S(r[3]), I(r[4]), I(r[5])};
}

class PostgresStore final : public HubStore {
 public:
  PostgresStore(std::string url, int pool_size) : url_(std::move(url)), pool_size_(pool_size) {}

  std::string Describe() const override { return "postgresql"; }

  // Reachable and answering; damage inside PostgreSQL surfaces on the statement that meets it
  // (SQLSTATE XX001/XX002, see Do).
  Status CheckIntegrity() override {
    return Do(
        "check", [](pqxx::transaction_base& w) { w.exec("SELECT 1"); }, true);
  }

  Status Init() {
    return Do("create schema", [&](pqxx::transaction_base& w) {
      w.exec("SELECT pg_advisory_xact_lock(7394001)");  // one hub creates the schema at a time
      w.exec(kSchema);
      w.exec(kMintLeaseSchema);
    });
  }

  // One INSERT … ON CONFLICT DO UPDATE … WHERE: PostgreSQL locks the conflicting row and
  // re-checks the WHERE on its newest version, so of two hubs racing for a free (key, family)
  // exactly one statement writes (RETURNING yields a row only to it).
  Result<MintLeaseAcquire> AcquireMintLease(const MintLeaseRow& want, int64_t now_ms) override {
    MintLeaseAcquire out;
    KILN_RETURN_IF_ERROR(Do("acquire mint lease", [&](pqxx::transaction_base& w) {
      auto ins = w.exec_params(
          "INSERT INTO mint_leases (key, family, holder, lease, acquired_at_ms, expires_at_ms) "
          "VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (key, family) DO UPDATE SET holder = "
          "EXCLUDED.holder, lease = EXCLUDED.lease, acquired_at_ms = EXCLUDED.acquired_at_ms, "
          "expires_at_ms = EXCLUDED.expires_at_ms WHERE mint_leases.expires_at_ms <= $7 OR "
          "mint_leases.holder = EXCLUDED.holder RETURNING lease",
          want.key, want.family, want.holder, want.lease, want.acquired_at_ms, want.expires_at_ms,
          now_ms);
      out.granted = !ins.empty();
      auto r = w.exec_params(std::string("SELECT ") + kMintLeaseCols +
                                 " FROM mint_leases WHERE key = $1 AND family = $2",
                             want.key, want.family);
      if (r.empty()) throw std::runtime_error("mint lease row vanished after acquire");
      out.owner = ReadMintLease(r[0]);
    }));
    return out;
  }
  Result<bool> ExtendMintLease(const std::string& key, const std::string& family,
                               const std::string& lease, int64_t expires_at_ms) override {
    bool changed = false;
    KILN_RETURN_IF_ERROR(Do("extend mint lease", [&](pqxx::transaction_base& w) {
      auto r = w.exec_params(
          "UPDATE mint_leases SET expires_at_ms = $4 WHERE key = $1 AND family = $2 AND lease = $3",
          key, family, lease, expires_at_ms);
      changed = r.affected_rows() == 1;
    }));
    return changed;
  }
  Result<bool> ReleaseMintLease(const std::string& key, const std::string& family,
                                const std::string& lease) override {
    bool changed = false;
    KILN_RETURN_IF_ERROR(Do("release mint lease", [&](pqxx::transaction_base& w) {
      auto r =
          w.exec_params("DELETE FROM mint_leases WHERE key = $1 AND family = $2 AND lease = $3",
                        key, family, lease);
      changed = r.affected_rows() == 1;
    }));
    return changed;
  }
  Result<std::optional<MintLeaseRow>> GetMintLease(const std::string& key,
                                                   const std::string& family) override {
    std::optional<MintLeaseRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "get mint lease",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(std::string("SELECT ") + kMintLeaseCols +
                                     " FROM mint_leases WHERE key = $1 AND family = $2",
                                 key, family);
          if (!r.empty()) out = ReadMintLease(r[0]);
        },
        true));
    return out;
  }
  // INSERT … ON CONFLICT DO UPDATE locks the pair's row, so two hubs ordering one pair at once
  // get incarnations n+1 and n+2, never the same one.
  Result<OrderRow> SetOrder(const OrderRow& o) override {
    OrderRow out;
    KILN_RETURN_IF_ERROR(Do("set order", [&](pqxx::transaction_base& w) {
      auto r = w.exec_params(
          std::string("INSERT INTO hub_orders (release, target, kind, ref, share_ppm, "
                      "incarnation, reason, set_by, set_at) VALUES ($1,$2,$3,$4,$5,1,$6,$7,$8) "
                      "ON CONFLICT (release, target) DO UPDATE SET kind = EXCLUDED.kind, ref = "
                      "EXCLUDED.ref, share_ppm = EXCLUDED.share_ppm, incarnation = "
                      "hub_orders.incarnation + 1, reason = EXCLUDED.reason, set_by = "
                      "EXCLUDED.set_by, set_at = EXCLUDED.set_at RETURNING ") +
              kOrderCols,
          o.release, o.target, o.kind, o.ref, o.share_ppm, o.reason, o.set_by, o.set_at);
      if (r.empty()) throw std::runtime_error("set order returned no row");
      out = ReadOrder(r[0]);
    }));
    return out;
  }
  Result<std::vector<OrderRow>> ListOrders() override {
    std::vector<OrderRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "list orders",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec(std::string("SELECT ") + kOrderCols +
                          " FROM hub_orders ORDER BY release, target");
          for (const auto& row : r) out.push_back(ReadOrder(row));
        },
        true));
    return out;
  }

  Result<CellInsert> InsertCellIfAbsent(const CellRow& c) override {
    CellInsert out;
    KILN_RETURN_IF_ERROR(Do("insert cell", [&](pqxx::transaction_base& w) {
      // A live owner is never overwritten; one whose (key, digest) is revoked is replaced.
      // RETURNING yields a row only when this statement wrote: the winner of a race.
      auto ins = w.exec_params(
          "INSERT INTO cells (key, digest, size, family, publisher, tier, release, receipt, "
          "created_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9) ON CONFLICT (key, family) DO UPDATE "
          "SET digest = EXCLUDED.digest, size = EXCLUDED.size, publisher = EXCLUDED.publisher, "
          "tier = EXCLUDED.tier, release = EXCLUDED.release, receipt = EXCLUDED.receipt, "
          "created_at = EXCLUDED.created_at WHERE cells.digest <> EXCLUDED.digest AND EXISTS "
          "(SELECT 1 FROM revocations r WHERE r.key = cells.key AND r.digest = cells.digest AND "
          "r.lifted_at = 0) RETURNING key",
          c.key, c.digest, static_cast<int64_t>(c.size), c.family, c.publisher, c.tier, c.release,
          c.receipt, c.created_at);
      out.inserted = !ins.empty();
      auto r = w.exec_params(
          std::string("SELECT ") + kCellCols + " FROM cells WHERE key = $1 AND family = $2", c.key,
          c.family);
      if (r.empty()) throw std::runtime_error("cell row vanished after insert");
      out.owner = ReadCell(r[0]);
    }));
    return out;
  }
  Result<std::optional<CellRow>> GetCell(const std::string& key,
                                         const std::string& family) override {
    std::optional<CellRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "get cell",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(
              std::string("SELECT ") + kCellCols + " FROM cells WHERE key = $1 AND family = $2",
              key, family);
          if (!r.empty()) out = ReadCell(r[0]);
        },
        true));
    return out;
  }
  Result<std::vector<CellRow>> ListCellsForKey(const std::string& key) override {
    return Cells(
        "list cells of a key",
        std::string("SELECT ") + kCellCols + " FROM cells WHERE key = $1 ORDER BY created_at, seq",
        key);
  }
  Result<std::vector<CellRow>> CellsWithDigest(const std::string& digest) override {
    return Cells("cells of a digest",
                 std::string("SELECT ") + kCellCols +
                     " FROM cells WHERE digest = $1 ORDER BY created_at, seq",
                 digest);
  }
  Result<std::optional<ResolvedCell>> GetCellForResolve(const std::string& key,
                                                        const std::string& family) override {
    std::optional<ResolvedCell> out;
    KILN_RETURN_IF_ERROR(Do(
        "resolve cell",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_prepared(kResolveStatement, key, family);
          if (r.empty()) return;
          out.emplace();
          out->cell = ReadCell(r[0]);
          if (!r[0][9].is_null()) {
            out->revocation = RevocationRow{out->cell.key, out->cell.digest, S(r[0][9]),
                                            S(r[0][10]),   I(r[0][11]),      I(r[0][12])};
          }
        },
        true));
    return out;
  }
  Result<std::vector<CellRow>> ListCells(int limit) override {
    std::vector<CellRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "list cells",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(std::string("SELECT ") + kCellCols +
                                     " FROM cells ORDER BY created_at DESC, seq DESC LIMIT $1",
                                 limit);
          for (const auto& row : r) out.push_back(ReadCell(row));
        },
        true));
    return out;
  }

  Result<bool> UpdateReceipt(const std::string& key, const std::string& family,
                             const std::string& digest, const std::string& receipt) override {
    bool changed = false;
    KILN_RETURN_IF_ERROR(Do("update receipt", [&](pqxx::transaction_base& w) {
      changed = w.exec_params(
                     "UPDATE cells SET receipt = $1 WHERE key = $2 AND family = $3 AND digest = $4",
                     receipt, key, family, digest)
                    .affected_rows() == 1;
    }));
    return changed;
  }

  Status PutIntent(const IntentRow& i) override {
    return Do("put intent", [&](pqxx::transaction_base& w) {
      w.exec_params(
          "INSERT INTO intents (key, digest, size, family, release, target, publisher, "
          "created_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT (key, digest, publisher) DO "
          "UPDATE SET size = EXCLUDED.size, family = EXCLUDED.family, release = "
          "EXCLUDED.release, target = EXCLUDED.target, created_at = EXCLUDED.created_at",
          i.key, i.digest, static_cast<int64_t>(i.size), i.family, i.release, i.target, i.publisher,
          i.created_at);
    });
  }
  Result<std::optional<IntentRow>> GetIntent(const std::string& key, const std::string& digest,
                                             const std::string& publisher) override {
    std::optional<IntentRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "get intent",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(std::string("SELECT ") + kIntentCols +
                                     " FROM intents WHERE key = $1 AND digest = $2 AND "
                                     "publisher = $3",
                                 key, digest, publisher);
          if (!r.empty()) out = ReadIntent(r[0]);
        },
        true));
    return out;
  }
  Result<std::optional<IntentRow>> FindIntentByDigest(const std::string& digest,
                                                      const std::string& publisher) override {
    std::optional<IntentRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "find intent",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(std::string("SELECT ") + kIntentCols +
                                     " FROM intents WHERE digest = $1 AND ($2 = '' OR "
                                     "publisher = $2) ORDER BY created_at DESC LIMIT 1",
                                 digest, publisher);
          if (!r.empty()) out = ReadIntent(r[0]);
        },
        true));
    return out;
  }
  Result<PublishClaimResult> ClaimPublish(const PublishClaim& claim, int64_t now) override {
    PublishClaimResult out;
    KILN_RETURN_IF_ERROR(Do("claim publish", [&](pqxx::transaction_base& w) {
      // The primary key serialises racing claims: the conditional upsert writes (RETURNING a row)
      // only for the first claimer, the holder itself, or over an expired claim; the others read
      // the holder. A holder released between the two statements leaves no row: claim again.
      for (int attempt = 0; attempt < 3; ++attempt) {
        auto ins = w.exec_params(
            "INSERT INTO publish_claims (key, family, publisher, digest, expires_at) VALUES "
            "($1,$2,$3,$4,$5) ON CONFLICT (key, family) DO UPDATE SET publisher = "
            "EXCLUDED.publisher, digest = EXCLUDED.digest, expires_at = EXCLUDED.expires_at "
            "WHERE publish_claims.publisher = EXCLUDED.publisher OR publish_claims.expires_at "
            "<= $6 RETURNING key",
            claim.key, claim.family, claim.publisher, claim.digest, claim.expires_at, now);
        if (!ins.empty()) {
          out = PublishClaimResult{claim, true};
          return;
        }
        auto r = w.exec_params(
            "SELECT key, family, publisher, digest, expires_at FROM publish_claims WHERE key = $1 "
            "AND family = $2",
            claim.key, claim.family);
        if (!r.empty()) {
          out = PublishClaimResult{
              PublishClaim{S(r[0][0]), S(r[0][1]), S(r[0][2]), S(r[0][3]), I(r[0][4])}, false};
          return;
        }
      }
      throw std::runtime_error("the publish claim kept vanishing between claim and read");
    }));
    return out;
  }
  Result<bool> ReleasePublishClaim(const std::string& key, const std::string& family,
                                   const std::string& publisher) override {
    bool dropped = false;
    KILN_RETURN_IF_ERROR(Do("release publish claim", [&](pqxx::transaction_base& w) {
      dropped = w.exec_params(
                     "DELETE FROM publish_claims WHERE key = $1 AND family = $2 AND publisher = $3",
                     key, family, publisher)
                    .affected_rows() == 1;
    }));
    return dropped;
  }
  Result<int> DeleteExpiredPublishClaims(int64_t now) override {
    int n = 0;
    KILN_RETURN_IF_ERROR(Do("delete expired publish claims", [&](pqxx::transaction_base& w) {
      n = static_cast<int>(
          w.exec_params("DELETE FROM publish_claims WHERE expires_at <= $1", now).affected_rows());
    }));
    return n;
  }
  Result<int> DeleteIntentsBefore(int64_t before) override {
    int n = 0;
    KILN_RETURN_IF_ERROR(Do("delete old intents", [&](pqxx::transaction_base& w) {
      n = static_cast<int>(
          w.exec_params("DELETE FROM intents WHERE created_at < $1", before).affected_rows());
    }));
    return n;
  }
  Result<PublisherUsage> GetPublisherUsage(const std::string& publisher) override {
    PublisherUsage usage;
    KILN_RETURN_IF_ERROR(Do(
        "publisher usage",
        [&](pqxx::transaction_base& w) {
          auto total = w.exec_params(
              "SELECT COALESCE(SUM(size), 0)::BIGINT FROM cells WHERE publisher = $1", publisher);
          usage.cell_bytes = static_cast<uint64_t>(I(total[0][0]));
          auto r = w.exec_params(std::string("SELECT ") + kIntentCols +
                                     " FROM intents i WHERE publisher = $1 AND NOT EXISTS "
                                     "(SELECT 1 FROM cells c WHERE c.key = i.key AND c.digest = "
                                     "i.digest)",
                                 publisher);
          for (const auto& row : r) usage.open_intents.push_back(ReadIntent(row));
        },
        true));
    return usage;
  }

  Status Revoke(const RevocationRow& v) override {
    return Do("revoke", [&](pqxx::transaction_base& w) {
      w.exec_params(
          "INSERT INTO revocations (key, digest, reason, revoked_by, revoked_at) VALUES "
          "($1,$2,$3,$4,$5) ON CONFLICT (key, digest) DO UPDATE SET reason = EXCLUDED.reason, "
          "revoked_by = EXCLUDED.revoked_by, revoked_at = EXCLUDED.revoked_at, revision = "
          "revocations.revision + 1, lifted_at = 0, lifted_by = '', lift_reason = '' WHERE "
          "revocations.lifted_at <> 0",
          v.key, v.digest, v.reason, v.revoked_by, v.revoked_at);
    });
  }
  Result<std::optional<RevocationRow>> Reinstate(const std::string& key, const std::string& digest,
                                                 const std::string& by, const std::string& reason,
                                                 int64_t at) override {
    std::optional<RevocationRow> out;
    KILN_RETURN_IF_ERROR(Do("reinstate", [&](pqxx::transaction_base& w) {
      w.exec_params(
          "UPDATE revocations SET lifted_at = $3, lifted_by = $4, lift_reason = $5, revision = "
          "revision + 1 WHERE key = $1 AND digest = $2 AND lifted_at = 0",
          key, digest, std::max<int64_t>(at, 1), by, reason);
      auto r = w.exec_params(std::string("SELECT ") + kRevocationCols +
                                 " FROM revocations WHERE key = $1 AND digest = $2",
                             key, digest);
      if (!r.empty()) out = ReadRevocation(r[0]);
    }));
    return out;
  }
  Result<std::optional<RevocationRow>> GetRevocation(const std::string& key,
                                                     const std::string& digest) override {
    std::optional<RevocationRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "get revocation",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(std::string("SELECT ") + kRevocationCols +
                                     " FROM revocations WHERE key = $1 AND digest = $2 AND "
                                     "lifted_at = 0",
                                 key, digest);
          if (!r.empty()) out = ReadRevocation(r[0]);
        },
        true));
    return out;
  }
  Result<std::vector<RevocationRow>> ListRevocations() override {
    std::vector<RevocationRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "list revocations",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec(std::string("SELECT ") + kRevocationCols +
                          " FROM revocations ORDER BY revoked_at, key");
          for (const auto& row : r) out.push_back(ReadRevocation(row));
        },
        true));
    return out;
  }

  Status RevokeToken(const RevokedTokenRow& r) override {
    return Do("record revoked token", [&](pqxx::transaction_base& w) {
      w.exec_params(
          "INSERT INTO revoked_tokens (token_sha256, name, revoked_by, revoked_at) VALUES "
          "($1,$2,$3,$4) ON CONFLICT (token_sha256) DO NOTHING",
          r.token_sha256, r.name, r.revoked_by, r.revoked_at);
    });
  }
  Result<bool> IsTokenRevoked(const std::string& token_sha256) override {
    bool revoked = false;
    KILN_RETURN_IF_ERROR(Do(
        "check revoked token",
        [&](pqxx::transaction_base& w) {
          revoked =
              !w.exec_params("SELECT 1 FROM revoked_tokens WHERE token_sha256 = $1", token_sha256)
                   .empty();
        },
        true));
    return revoked;
  }
  Result<std::vector<RevokedTokenRow>> ListRevokedTokens() override {
    std::vector<RevokedTokenRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "list revoked tokens",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec(
              "SELECT token_sha256, name, revoked_by, revoked_at FROM revoked_tokens ORDER BY "
              "revoked_at, name");
          for (const auto& row : r) out.push_back({S(row[0]), S(row[1]), S(row[2]), I(row[3])});
        },
        true));
    return out;
  }

  Result<int> AddObligations(const std::vector<ObligationRow>& rows) override {
    int created = 0;
    KILN_RETURN_IF_ERROR(Do("add obligations", [&](pqxx::transaction_base& w) {
      created = 0;
      for (const auto& o : rows) {
        auto r = w.exec_params(
            "INSERT INTO obligations (release, target, sm, key, state, cell_digest, updated_at, "
            "org, deadline) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9) ON CONFLICT (release, target, sm) "
            "DO NOTHING",
            o.release, o.target, o.sm, o.key, o.state, o.cell_digest, o.updated_at, o.org,
            o.deadline);
        created += static_cast<int>(r.affected_rows());
      }
    }));
    return created;
  }
  Result<std::vector<ObligationRow>> ListObligations(const std::string& release) override {
    std::vector<ObligationRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "list obligations",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(std::string("SELECT ") + kObligationCols +
                                     " FROM obligations WHERE release = $1 ORDER BY target, sm",
                                 release);
          for (const auto& row : r) out.push_back(ReadObligation(row));
        },
        true));
    return out;
  }
  Result<std::vector<ObligationRow>> ListAllObligations() override {
    std::vector<ObligationRow> out;
    KILN_RETURN_IF_ERROR(Do(
        "list obligations",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec(std::string("SELECT ") + kObligationCols +
                          " FROM obligations ORDER BY release, target, sm");
          for (const auto& row : r) out.push_back(ReadObligation(row));
        },
        true));
    return out;
  }
  Result<int> DischargeObligations(const std::string& key, const std::string& digest,
                                   const std::string& release, const std::string& target,
                                   const std::string& sm, int64_t now,
                                   const std::string& scope) override {
    int n = 0;
    KILN_RETURN_IF_ERROR(Do("discharge obligations", [&](pqxx::transaction_base& w) {
      auto r = w.exec_params(
          "UPDATE obligations SET state = 'discharged', key = $1, cell_digest = $2, "
          "updated_at = $3 WHERE state = 'owed' AND ($7 = '*' OR release = $7) AND (key = $1 OR "
          "(key = '' AND $4 <> '' AND release = $4 AND target = $5 AND sm = $6))",
          key, digest, now, release, target, sm, scope);
      n = static_cast<int>(r.affected_rows());
    }));
    return n;
  }
  Result<std::optional<ObligationRow>> SettleObligation(const std::string& release,
                                                        const std::string& target,
                                                        const std::string& sm,
                                                        const std::string& token,
                                                        int64_t now) override {
    std::optional<ObligationRow> out;
    KILN_RETURN_IF_ERROR(Do("settle obligation", [&](pqxx::transaction_base& w) {
      w.exec_params(
          "UPDATE obligations SET state = $1, updated_at = $2 WHERE release = $3 AND "
          "target = $4 AND sm = $5 AND state = 'owed'",
          "settled:" + token, now, release, target, sm);
      auto r = w.exec_params(std::string("SELECT ") + kObligationCols +
                                 " FROM obligations WHERE release = $1 AND target = $2 AND sm = $3",
                             release, target, sm);
      if (!r.empty()) out = ReadObligation(r[0]);
    }));
    return out;
  }

  Status InsertEvents(const std::vector<StoredEvent>& rows) override {
    return Do("insert events", [&](pqxx::transaction_base& w) {
      for (const auto& e : rows) {
        w.exec_params(
            "INSERT INTO events (worker, seq, kind, phase, key, duration_ms, detail, ts, target, "
            "ref, fn, stages, org) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)",
            e.worker, e.seq, e.kind, e.phase, e.key, e.duration_ms, e.detail, e.ts, e.target, e.ref,
            e.fn, e.stages, e.org);
      }
    });
  }
  Result<std::vector<StoredEvent>> QueryEvents(const EventFilter& f) override {
    std::vector<StoredEvent> out;
    KILN_RETURN_IF_ERROR(Do(
        "query events",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(std::string("SELECT ") + kEventCols +
                                     " FROM events WHERE ($1 = '' OR worker = $1) AND "
                                     "($2 = '' OR kind = $2) AND ($3 = '' OR phase = $3) AND "
                                     "ts >= $4 AND (NOT $6 OR org = $7) ORDER BY id DESC "
                                     "LIMIT $5",
                                 f.worker, f.kind, f.phase, f.since_ts, f.limit, f.org.has_value(),
                                 f.org.value_or(""));
          for (const auto& row : r) out.push_back(ReadEvent(row));
        },
        true));
    return out;
  }
  Result<std::vector<WorkerSummary>> ListWorkers(const std::optional<std::string>& org) override {
    std::vector<WorkerSummary> out;
    KILN_RETURN_IF_ERROR(Do(
        "list workers",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(
              "SELECT worker, MAX(ts), COUNT(*) FROM events WHERE (NOT $1 OR org = $2) GROUP BY "
              "worker ORDER BY worker",
              org.has_value(), org.value_or(""));
          for (const auto& row : r) out.push_back(WorkerSummary{S(row[0]), I(row[1]), I(row[2])});
        },
        true));
    return out;
  }
  Result<int64_t> AdoptedCount(const std::string& key,
                               const std::optional<std::string>& org) override {
    int64_t n = 0;
    KILN_RETURN_IF_ERROR(Do(
        "adopted count",
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(
              "SELECT COUNT(DISTINCT worker) FROM events WHERE kind = 'boot_adopt' AND phase IN "
              "('hit', 'local_hit') AND (key = $1 OR key LIKE $1 || '@%') AND (NOT $2 OR org = $3)",
              key, org.has_value(), org.value_or(""));
          n = I(r[0][0]);
        },
        true));
    return n;
  }
  Result<std::vector<std::string>> CrashReporters(const std::string& key,
                                                  const std::string& ref) override {
    std::vector<std::string> out;
    KILN_RETURN_IF_ERROR(Do(
        "crash reporters",
        [&](pqxx::transaction_base& w) {
          out.clear();
          auto r = w.exec_params(
              "SELECT DISTINCT worker FROM events WHERE key = $1 AND kind = 'cell_crashed' AND "
              "ref = $2 ORDER BY worker",
              key, ref);
          for (const auto& row : r) out.push_back(S(row[0]));
        },
        true));
    return out;
  }

 private:
  Result<std::vector<CellRow>> Cells(const char* what, const std::string& sql,
                                     const std::string& arg) {
    std::vector<CellRow> out;
    KILN_RETURN_IF_ERROR(Do(
        what,
        [&](pqxx::transaction_base& w) {
          auto r = w.exec_params(sql, arg);
          for (const auto& row : r) out.push_back(ReadCell(row));
        },
        true));
    return out;
  }
  // Runs `body` in one transaction on a pooled connection; translates every exception.
  Status Do(const char* what, const std::function<void(pqxx::transaction_base&)>& body,
            bool read_only = false) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::unique_ptr<pqxx::connection> conn;
      try {
        conn = Acquire();
        if (read_only) {
          // One round trip: no BEGIN/COMMIT around a single-statement read.
          pqxx::nontransaction w(*conn);
          body(w);
        } else {
          pqxx::work w(*conn);
          body(w);
          w.commit();
        }
        Release(std::move(conn));
        return Status::OK();
      } catch (const pqxx::broken_connection& e) {
        // Dropped (server restart, idle kill) or never made: discard it; retry once.
        if (conn) Release(nullptr);
        if (attempt == 1) {
          return Status::IOError(std::string("postgresql: ") + what +
                                 ": connection broken: " + e.what());
        }
      } catch (const pqxx::sql_error& e) {
        if (conn) Release(conn->is_open() ? std::move(conn) : nullptr);
        // data_corrupted / index_corrupted: the server read damaged pages. A refusal, so that no
        // caller mistakes the failed lookup for an absent row.
        if (e.sqlstate() == "XX001" || e.sqlstate() == "XX002") {
          return Status::Refused(StatusCode::kCorruption, kRefusalStoreCorrupt,
                                 std::string("postgresql: ") + what + ": " + e.what());
        }
        return Status::IOError(std::string("postgresql: ") + what + ": " + e.what());
      } catch (const std::exception& e) {
        if (conn) Release(conn->is_open() ? std::move(conn) : nullptr);
        return Status::IOError(std::string("postgresql: ") + what + ": " + e.what());
      }
    }
    return Status::IOError(std::string("postgresql: ") + what + ": retries exhausted");
  }

  PoolStats Pool() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return PoolStats{pool_size_, open_, open_ - static_cast<int>(idle_.size())};
  }

  // Throws (inside Do) when a new connection cannot be made.
  std::unique_ptr<pqxx::connection> Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !idle_.empty() || open_ < pool_size_; });
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
    ++open_;
    lock.unlock();
    try {
      auto c = std::make_unique<pqxx::connection>(url_);
      c->prepare(kResolveStatement, kResolveSql);
      return c;
    } catch (...) {
      std::lock_guard<std::mutex> relock(mu_);
      --open_;
      cv_.notify_one();
      throw;
    }
  }
  void Release(std::unique_ptr<pqxx::connection> c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (c) {
      idle_.push_back(std::move(c));
    } else {
      --open_;
    }
    cv_.notify_one();
  }

  std::string url_;
  int pool_size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_;
  int open_ = 0;
};

}  // namespace

Result<std::unique_ptr<HubStore>> OpenPostgresStore(const std::string& url, int pool_size) {
  auto store = std::make_unique<PostgresStore>(url, pool_size < 1 ? 1 : pool_size);
  KILN_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<HubStore>(std::move(store));
}

}  // namespace kiln
