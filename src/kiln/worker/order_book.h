// OrderBook: the operator's eager-only orders of one worker machine, kept on disk so they outlive
// the process (worker layer; docs/manifest.md "The eager-only order").
//
// An order is given by the manifest (`eager_only = true` on a target) or through the admin port
// (POST /v1/admin/eager-only). The admin's word is the newest: once it set or lifted a target's
// order, that stands at every later boot whatever the manifest says, until the admin speaks
// again. The book is one JSON file, {"<target>": {"on": bool, "reason": "…", "set_at": unix s}},
// replaced atomically and durably on every change: an order acknowledged to the admin survives a
// crash right after.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "src/kiln/base/status.h"

namespace kiln {

struct EagerOnlyOrder {
  bool on = false;
  std::string reason;
  int64_t set_at = 0;  // unix seconds; 0 for the manifest's
  std::string source;  // "admin" (the book) or "manifest"
};

class OrderBook {
 public:
  // Reads `path` if it exists ("" = keep nothing on disk). A file that is not a book is refused
  // with InvalidArgument naming it: an order silently dropped would serve compiled against the
  // operator's word.
  static Result<std::unique_ptr<OrderBook>> Open(std::string path);

  // The order for `target` at boot: the admin's last word if any, else the manifest's.
  EagerOnlyOrder AtBoot(const std::string& target, bool manifest_eager_only) const;
  // Records the admin's order for `target` (durably, before it returns).
  Status Set(const std::string& target, bool on, const std::string& reason, int64_t now);

 private:
  explicit OrderBook(std::string path) : path_(std::move(path)) {}
  Status SaveLocked() const;

  std::string path_;
  mutable std::mutex mu_;
  std::map<std::string, EagerOnlyOrder> admin_;
};

}  // namespace kiln
