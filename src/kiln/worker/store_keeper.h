// StoreKeeper: the worker's bound on its local store (worker layer; docs/manifest.md "Local
// store").
//
// Every cell this process arms (adopted at boot from the local store or the hub, or minted and
// installed here) is reported with Armed: the entry is marked adopted now (the eviction order)
// and then, when the store holds more than the bound, the least recently adopted entries are
// removed until it fits, one `local_cell_evicted` row each. An entry this process has armed is
// never removed by it: the armed cells are a subset of those, so a serving target never loses
// the bytes a restart would adopt. The bound is a target, not a wall: when only such entries are
// left the store stays over it (said in the row's detail of the last eviction, if any).
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "src/kiln/cell/store.h"
#include "src/kiln/worker/events.h"

namespace kiln {

class StoreKeeper {
 public:
  // `store` and `events` (may be null) are not owned. max_bytes 0 = no bound (only the
  // adoption marks are kept).
  StoreKeeper(LocalStore* store, uint64_t max_bytes, EventLog* events);

  // `key` was armed by this process: marks it adopted and evicts down to the bound.
  void Armed(const std::string& key);

  uint64_t max_bytes() const { return max_bytes_; }

 private:
  LocalStore* const store_;
  const uint64_t max_bytes_;
  EventLog* const events_;
  std::mutex mu_;
  std::set<std::string> armed_;  // every key this process armed
};

}  // namespace kiln
