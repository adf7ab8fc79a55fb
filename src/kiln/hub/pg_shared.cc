// The PostgreSQL keyring and token set of hub replicas (hub layer; see pg_shared.h).
//
// libpqxx throws; every call goes through PgConnection::Do so that no exception leaves this file.
// Each object holds one connection of its own, apart from the store's pool: the keyring is read
// once per poll and on a change, and a token is read once per cache miss of Authenticate, so one
// connection serves either, and neither waits behind a slow store query.
#include "src/kiln/hub/pg_shared.h"

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <thread>

#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/hub/authz.h"

namespace kiln {

namespace {

constexpr const char* kSharedSchema = R"sql(
CREATE TABLE IF NOT EXISTS signing_keys (
  kid TEXT PRIMARY KEY, public_key BYTEA NOT NULL, private_key BYTEA, created_at BIGINT NOT NULL,
  not_after BIGINT);
CREATE TABLE IF NOT EXISTS signing_state (
  id INT PRIMARY KEY CHECK (id = 1), current_kid TEXT NOT NULL REFERENCES signing_keys(kid),
  generation BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS hub_tokens (
  token_sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, entry TEXT NOT NULL,
  updated_at BIGINT NOT NULL);
)sql";

// Advisory lock ids (pg_store.cc holds 7394001 for its schema).
constexpr int64_t kSchemaLock = 7394002;
constexpr int64_t kKeyringCreateLock = 7394003;

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Hex(const std::string& raw) {
  return HexEncode(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
}

Result<std::string> Unhex(const std::string& hex, const std::string& what) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return Status::Corruption(what + " is not hex (odd length)");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Status::Corruption(what + " is not hex");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

// One connection, made on first use and again after it broke; calls are serialized.
class PgConnection {
 public:
  explicit PgConnection(std::string url) : url_(std::move(url)) {}

  // Runs `body` in one transaction; a broken connection is replaced and the body run once more
  // (every caller's body is idempotent or conflict-safe).
  Status Do(const std::string& what, const std::function<void(pqxx::work&)>& body) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        if (!conn_ || !conn_->is_open()) conn_ = std::make_unique<pqxx::connection>(url_);
        pqxx::work w(*conn_);
        body(w);
        w.commit();
        return Status::OK();
      } catch (const pqxx::broken_connection& e) {
        conn_.reset();
        if (attempt == 1) {
          return Status::IOError("postgresql: " + what + ": connection broken: " + e.what());
        }
      } catch (const StatusError& e) {
        return e.status;
      } catch (const std::exception& e) {
        return Status::IOError("postgresql: " + what + ": " + e.what());
      }
    }
    return Status::IOError("postgresql: " + what + ": retries exhausted");
  }

  // A Status thrown from inside a body: the transaction rolls back and Do returns it as is.
  struct StatusError {
    Status status;
  };

 private:
  std::string url_;
  std::mutex mu_;
  std::unique_ptr<pqxx::connection> conn_;
};

Status CreateSchema(PgConnection& db) {
  return db.Do("create replica tables", [](pqxx::work& w) {
    w.exec_params("SELECT pg_advisory_xact_lock($1)", kSchemaLock);
    w.exec(kSharedSchema);
  });
}

// --- keyring ------------------------------------------------------------------------------

// What one read of the keyring's rows yields.
struct KeySnapshot {
  std::shared_ptr<const SigningKey> current;
  PublicKeySet all;
  int64_t generation = 0;
};

// The keys of a file keyring (SigningKeyRing) to carry into the database.
struct FileKeys {
  std::optional<SigningKey> current;
  PublicKeySet all;
};

Result<FileKeys> ReadFileKeys(const std::string& dir) {
  FileKeys out;
  if (dir.empty()) return out;
  std::error_code ec;
  if (!std::filesystem::exists(dir + "/signing/current", ec)) return out;
  KILN_ASSIGN_OR_RETURN(auto ring, SigningKeyRing::OpenOrCreate(dir));
  KILN_ASSIGN_OR_RETURN(SigningKey key, SigningKey::FromRawPrivate(ring->Current()->raw_private()));
  out.current = std::move(key);
  out.all = ring->PublicKeys();
  return out;
}

class PostgresKeyRing final : public KeyRing {
 public:
  PostgresKeyRing(const std::string& url, SharedKeyRingOptions options)
      : db_(url), options_(std::move(options)) {}

  ~PostgresKeyRing() override {
    {
      std::lock_guard<std::mutex> lock(poll_mu_);
      stopping_ = true;
    }
    poll_cv_.notify_all();
    if (poller_.joinable()) poller_.join();
  }

  Status Open() {
    KILN_RETURN_IF_ERROR(CreateSchema(db_));
    KILN_ASSIGN_OR_RETURN(FileKeys file, ReadFileKeys(options_.import_dir));
    KILN_RETURN_IF_ERROR(CreateOrImport(file));
    KILN_RETURN_IF_ERROR(Reload());
    poller_ = std::thread([this] { Poll(); });
    return Status::OK();
  }

  std::shared_ptr<const SigningKey> Current() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return snapshot_.current;
  }
  PublicKeySet PublicKeys() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return snapshot_.all;
  }

  Result<std::string> Rotate(int64_t now) override {
    KILN_ASSIGN_OR_RETURN(SigningKey key, SigningKey::Generate());
    const int64_t at = now + options_.retire_grace_s;
    KILN_RETURN_IF_ERROR(db_.Do("rotate signing key", [&](pqxx::work& w) {
      // The state row's lock orders rotations and retirements across replicas.
      auto cur = w.exec("SELECT current_kid FROM signing_state WHERE id = 1 FOR UPDATE");
      if (cur.empty()) throw PgConnection::StatusError{Status::Corruption("no current key")};
      const std::string old_kid = cur[0][0].as<std::string>();
      w.exec_params(
          "INSERT INTO signing_keys (kid, public_key, private_key, created_at) VALUES "
          "($1, decode($2, 'hex'), decode($3, 'hex'), $4)",
          key.kid(), Hex(key.raw_public()), Hex(key.raw_private()), now);
      w.exec_params(
          "UPDATE signing_keys SET not_after = LEAST(COALESCE(not_after, $2), $2) WHERE kid = $1",
          old_kid, at);
      w.exec_params(
          "UPDATE signing_state SET current_kid = $1, generation = generation + 1 WHERE id = 1",
          key.kid());
    }));
    KILN_RETURN_IF_ERROR(Reload());
    return key.kid();
  }

  Status Retire(const std::string& kid, int64_t not_after) override {
    KILN_RETURN_IF_ERROR(db_.Do("retire signing key", [&](pqxx::work& w) {
      auto cur = w.exec("SELECT current_kid FROM signing_state WHERE id = 1 FOR UPDATE");
      if (!cur.empty() && cur[0][0].as<std::string>() == kid) {
        throw PgConnection::StatusError{Status::InvalidArgument(
            "signing key '" + kid + "' is current; rotate to a new key before retiring it")};
      }
      auto changed = w.exec_params(
          "UPDATE signing_keys SET not_after = LEAST(COALESCE(not_after, $2), $2) WHERE kid = $1 "
          "RETURNING kid",
          kid, not_after);
      if (changed.empty()) {
        throw PgConnection::StatusError{
            Status::NotFound("signing key '" + kid + "' was never this hub's")};
      }
      w.exec("UPDATE signing_state SET generation = generation + 1 WHERE id = 1");
    }));
    return Reload();
  }

 private:
  // First start of an empty keyring: the import dir's current key, or a new one, becomes
  // current. Every later start only adds the import dir's keys the table lacks, retired.
  Status CreateOrImport(const FileKeys& file) {
    std::optional<SigningKey> fresh;
    if (!file.current) {
      KILN_ASSIGN_OR_RETURN(SigningKey k, SigningKey::Generate());
      fresh = std::move(k);
    }
    const SigningKey& first = file.current ? *file.current : *fresh;
    const int64_t now = UnixNow();
    return db_.Do("create signing keyring", [&](pqxx::work& w) {
      // Replicas starting together queue here; the first creates, the others see its row.
      w.exec_params("SELECT pg_advisory_xact_lock($1)", kKeyringCreateLock);
      const bool empty = w.exec("SELECT 1 FROM signing_state WHERE id = 1").empty();
      if (empty) {
        w.exec_params(
            "INSERT INTO signing_keys (kid, public_key, private_key, created_at) VALUES "
            "($1, decode($2, 'hex'), decode($3, 'hex'), $4) ON CONFLICT (kid) DO NOTHING",
            first.kid(), Hex(first.raw_public()), Hex(first.raw_private()), now);
        w.exec_params("INSERT INTO signing_state (id, current_kid, generation) VALUES (1, $1, 1)",
                      first.kid());
      }
      bool added = false;
      for (const auto& [kid, raw] : file.all.keys()) {
        if (empty && kid == first.kid()) continue;
        // Another hub's file key: verifiable still, signing no more.
        int64_t at = now;
        if (const auto na = file.all.NotAfter(kid)) at = std::min(at, *na);
        auto ins = w.exec_params(
            "INSERT INTO signing_keys (kid, public_key, created_at, not_after) VALUES "
            "($1, decode($2, 'hex'), $3, $4) ON CONFLICT (kid) DO NOTHING RETURNING kid",
            kid, Hex(raw), now, at);
        added = added || !ins.empty();
      }
      if (added) w.exec("UPDATE signing_state SET generation = generation + 1 WHERE id = 1");
    });
  }

  Result<KeySnapshot> Read() {
    KeySnapshot snap;
    std::string current_kid, current_private;
    KILN_RETURN_IF_ERROR(db_.Do("read signing keyring", [&](pqxx::work& w) {
      auto st = w.exec("SELECT current_kid, generation FROM signing_state WHERE id = 1");
      if (st.empty()) {
        throw PgConnection::StatusError{
            Status::Corruption("postgresql: signing_state holds no current key")};
      }
      current_kid = st[0][0].as<std::string>();
      snap.generation = st[0][1].as<int64_t>();
      auto rows = w.exec(
          "SELECT kid, encode(public_key, 'hex'), encode(private_key, 'hex'), not_after FROM "
          "signing_keys");
      for (const auto& r : rows) {
        const std::string kid = r[0].as<std::string>();
        auto raw = Unhex(r[1].as<std::string>(), "signing_keys.public_key of " + kid);
        if (!raw.ok()) throw PgConnection::StatusError{raw.status()};
        Status added = snap.all.AddRaw(*raw);
        if (!added.ok()) throw PgConnection::StatusError{added.WithContext("signing_keys " + kid)};
        if (!snap.all.Has(kid)) {
          throw PgConnection::StatusError{Status::Corruption(
              "postgresql: signing_keys row '" + kid + "' holds another key's public key")};
        }
        if (!r[3].is_null()) snap.all.Retire(kid, r[3].as<int64_t>());
        if (kid == current_kid && !r[2].is_null()) current_private = r[2].as<std::string>();
      }
    }));
    if (current_private.empty()) {
      return Status::Corruption("postgresql: the current signing key '" + current_kid +
                                "' has no private key in signing_keys");
    }
    KILN_ASSIGN_OR_RETURN(std::string raw, Unhex(current_private, "private key of " + current_kid));
    KILN_ASSIGN_OR_RETURN(SigningKey key, SigningKey::FromRawPrivate(raw));
    if (key.kid() != current_kid) {
      return Status::Corruption("postgresql: the private key of signing key '" + current_kid +
                                "' has key id '" + key.kid() + "'");
    }
    snap.current = std::make_shared<const SigningKey>(std::move(key));
    return snap;
  }

  Status Reload() {
    KILN_ASSIGN_OR_RETURN(KeySnapshot snap, Read());
    std::lock_guard<std::mutex> lock(mu_);
    // Two reloads may race (a poll and a local rotation); the newer generation wins.
    if (snap.generation >= snapshot_.generation) snapshot_ = std::move(snap);
    return Status::OK();
  }

  Result<int64_t> Generation() {
    int64_t g = 0;
    KILN_RETURN_IF_ERROR(db_.Do("read signing keyring generation", [&](pqxx::work& w) {
      auto st = w.exec("SELECT generation FROM signing_state WHERE id = 1");
      if (!st.empty()) g = st[0][0].as<int64_t>();
    }));
    return g;
  }

  // Polling, not LISTEN/NOTIFY: a notification sent while this replica's connection was down is
  // lost, and a poll of one row is cheap; the generation read every poll_ms bounds how long a
  // change through another replica takes to arrive, whatever happened to the connection.
  void Poll() {
    bool failing = false;
    std::unique_lock<std::mutex> lock(poll_mu_);
    while (!poll_cv_.wait_for(lock, std::chrono::milliseconds(options_.poll_ms),
                              [&] { return stopping_; })) {
      lock.unlock();
      Status s;
      auto g = Generation();
      if (g.ok()) {
        int64_t known;
        {
          std::lock_guard<std::mutex> snap_lock(mu_);
          known = snapshot_.generation;
        }
        if (*g != known) s = Reload();
      } else {
        s = g.status();
      }
      if (!s.ok() && !failing) {
        KILN_LOG(WARNING) << "hub: cannot refresh the shared signing keyring: " << s.ToString();
      } else if (s.ok() && failing) {
        KILN_LOG(INFO) << "hub: the shared signing keyring is readable again";
      }
      failing = !s.ok();
      lock.lock();
    }
  }

  PgConnection db_;
  SharedKeyRingOptions options_;
  mutable std::mutex mu_;
  KeySnapshot snapshot_;
  std::mutex poll_mu_;
  std::condition_variable poll_cv_;
  bool stopping_ = false;
  std::thread poller_;
};

// --- tokens -------------------------------------------------------------------------------

class PostgresTokens final : public SharedTokens {
 public:
  explicit PostgresTokens(const std::string& url) : db_(url) {}
  Status Open() { return CreateSchema(db_); }

  Status Upsert(const std::vector<TokenRow>& rows, int64_t now) override {
    return db_.Do("upsert tokens", [&](pqxx::work& w) {
      for (const TokenRow& t : rows) {
        // The row in the tokens file's own form, so one parser reads both.
        const auto file = nlohmann::json::parse(TokensFileText({t}));
        w.exec_params(
            "INSERT INTO hub_tokens (token_sha256, name, entry, updated_at) VALUES ($1,$2,$3,$4) "
            "ON CONFLICT (token_sha256) DO UPDATE SET name = EXCLUDED.name, entry = "
            "EXCLUDED.entry, updated_at = EXCLUDED.updated_at",
            t.token_sha256, t.name, file.at("tokens").at(0).dump(), now);
      }
    });
  }

  Result<std::optional<TokenRow>> Find(const std::string& token_sha256) override {
    KILN_ASSIGN_OR_RETURN(auto rows, Select("token_sha256", token_sha256));
    if (rows.empty()) return std::optional<TokenRow>();
    return std::optional<TokenRow>(std::move(rows[0]));
  }

  Result<std::vector<TokenRow>> FindByName(const std::string& name) override {
    return Select("name", name);
  }

 private:
  // The rows whose `column` equals `value`, each checked against the columns it was found by.
  Result<std::vector<TokenRow>> Select(const std::string& column, const std::string& value) {
    std::vector<std::pair<std::string, std::string>> found;  // (hash, entry)
    KILN_RETURN_IF_ERROR(db_.Do("find token", [&](pqxx::work& w) {
      auto r = w.exec_params("SELECT token_sha256, entry FROM hub_tokens WHERE " + column + " = $1",
                             value);
      for (const auto& row : r)
        found.emplace_back(row[0].as<std::string>(), row[1].as<std::string>());
    }));
    std::vector<TokenRow> out;
    for (const auto& [hash, entry] : found) {
      KILN_ASSIGN_OR_RETURN(auto rows, ParseTokensFile("{\"tokens\":[" + entry + "]}",
                                                       "postgresql hub_tokens row " + hash));
      if (rows.size() != 1 || rows[0].token_sha256 != hash) {
        return Status::Corruption("postgresql: hub_tokens row " + hash + " names another token");
      }
      out.push_back(std::move(rows[0]));
    }
    return out;
  }

  PgConnection db_;
};

}  // namespace

Result<std::unique_ptr<KeyRing>> OpenPostgresKeyRing(const std::string& url,
                                                     const SharedKeyRingOptions& options) {
  if (options.poll_ms <= 0 || options.retire_grace_s * 1000 <= options.poll_ms) {
    return Status::InvalidArgument(
        "shared keyring: retire_grace_s (" + std::to_string(options.retire_grace_s) +
        " s) must exceed poll_ms (" + std::to_string(options.poll_ms) + " ms), which must be > 0");
  }
  auto ring = std::make_unique<PostgresKeyRing>(url, options);
  KILN_RETURN_IF_ERROR(ring->Open());
  return std::unique_ptr<KeyRing>(std::move(ring));
}

Result<std::unique_ptr<SharedTokens>> OpenPostgresTokens(const std::string& url) {
  auto tokens = std::make_unique<PostgresTokens>(url);
  KILN_RETURN_IF_ERROR(tokens->Open());
  return std::unique_ptr<SharedTokens>(std::move(tokens));
}

}  // namespace kiln
