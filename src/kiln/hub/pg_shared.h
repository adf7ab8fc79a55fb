// What hub replicas sharing one PostgreSQL database agree on beyond the store's rows: the signing
// keyring and the token set (hub layer; docs/fleet.md "Replicas behind a load balancer").
//
// With these, replicas started from different `--data` directories behind a load balancer sign
// with one key, publish one JWKS, and know one set of tokens, without copying a file between
// them. The tables live next to the store's (pg_store.cc) and are created the same way: idempotent
// statements under an advisory lock, so replicas starting together create them once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/hub/store.h"
#include "src/kiln/receipt/receipt.h"

namespace kiln {

struct SharedKeyRingOptions {
  // How often a replica asks the database for the keyring's generation (one small row); a
  // rotation or retirement through another replica is taken within this, plus one query.
  int poll_ms = 1000;
  // A rotation retires the key it replaces this many seconds after `now`, not at `now`: another
  // replica signs with the old key until its next poll sees the rotation, and a receipt it signs
  // then must stay valid. Must exceed poll_ms with room for a slow poll.
  int64_t retire_grace_s = 5;
  // A hub data dir whose `signing/` keys (SigningKeyRing's files) are carried into the database:
  // the first replica to create the shared keyring makes its file key current; every other file
  // key is kept for verification and retired at once (it no longer signs). Empty: none.
  std::string import_dir;
};

// The signing keyring kept in PostgreSQL at `url`. The first replica to open an empty keyring
// creates its first key; replicas opening together end with one current key (the creation runs
// under an advisory transaction lock and the state row has a single-row primary key). Every
// replica signs with the current key and publishes every key the table holds (retired ones with
// their not_after). Rotate and Retire change the rows in one transaction that bumps the keyring's
// generation; every replica polls that generation (SharedKeyRingOptions::poll_ms) and reloads the
// rows when it moved.
Result<std::unique_ptr<KeyRing>> OpenPostgresKeyRing(const std::string& url,
                                                     const SharedKeyRingOptions& options);

// The tokens of every replica sharing one database, by the SHA-256 of their text (the text is
// never stored). Revocation stays in the HubStore (revoked_tokens); this only says what a hash
// names.
class SharedTokens {
 public:
  SharedTokens() = default;
  virtual ~SharedTokens() = default;
  SharedTokens(const SharedTokens&) = delete;
  SharedTokens& operator=(const SharedTokens&) = delete;

  // Inserts each row, or replaces the row of the same hash (its name, role and scope change to
  // the new ones). Never deletes: another replica's tokens file may still list a token this one
  // dropped; a token is ended by revoking it.
  virtual Status Upsert(const std::vector<TokenRow>& rows, int64_t now) = 0;
  // The token whose hash is `token_sha256`, or nullopt.
  virtual Result<std::optional<TokenRow>> Find(const std::string& token_sha256) = 0;
  // Every token named `name` (names need not be unique), revoked ones included.
  virtual Result<std::vector<TokenRow>> FindByName(const std::string& name) = 0;
};

Result<std::unique_ptr<SharedTokens>> OpenPostgresTokens(const std::string& url);

}  // namespace kiln
