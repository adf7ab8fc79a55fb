// A PostgreSQL database of its own for one test (tests of the hub layer that run hub processes
// on PostgreSQL). The cluster tools/pg.sh starts holds one database, kiln_test, that outlives a
// run; what replicas share through it (the signing keyring, the token set) would then carry from
// one test to the next. A test that needs a clean slate creates a database named after it and
// drops it when done.
#pragma once

#include <pqxx/pqxx>
#include <string>

#include "src/kiln/base/sha256.h"
#include "src/kiln/base/status.h"

namespace kiln::hub_testing {

// `url` with its database name replaced by `db`.
inline std::string WithDatabase(const std::string& url, const std::string& db) {
  const size_t query = url.find('?');
  const std::string base = url.substr(0, query);
  const size_t slash = base.rfind('/');
  const std::string rest = query == std::string::npos ? "" : url.substr(query);
  return base.substr(0, slash + 1) + db + rest;
}

// Creates an empty database for `tag` (any text: it is hashed into the name) on the cluster of
// `url` and returns its URL; `name_out` gets its name for DropDatabase.
inline Result<std::string> CreateFreshDatabase(const std::string& url, const std::string& tag,
                                               std::string* name_out) {
  const std::string name = "kiln_t_" + Sha256Hex(tag).substr(0, 24);
  try {
    pqxx::connection c(url);
    pqxx::nontransaction w(c);
    w.exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)");
    w.exec("CREATE DATABASE " + name);
  } catch (const std::exception& e) {
    return Status::IOError("creating database " + name + " on " + url + ": " + e.what());
  }
  *name_out = name;
  return WithDatabase(url, name);
}

// Drops a database CreateFreshDatabase made (sessions still connected are ended).
inline void DropDatabase(const std::string& url, const std::string& name) {
  if (name.empty()) return;
  try {
    pqxx::connection c(url);
    pqxx::nontransaction w(c);
    w.exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)");
  } catch (const std::exception&) {
    // Left behind: the next CreateFreshDatabase of the same tag drops it first.
  }
}

}  // namespace kiln::hub_testing
