// StoreKeeper: the local store's size bound, least recently adopted first (see store_keeper.h).
#include "src/kiln/worker/store_keeper.h"

#include "src/kiln/base/log.h"

namespace kiln {

StoreKeeper::StoreKeeper(LocalStore* store, uint64_t max_bytes, EventLog* events)
    : store_(store), max_bytes_(max_bytes), events_(events) {}

void StoreKeeper::Armed(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  armed_.insert(key);
  if (Status s = store_->Touch(key); !s.ok()) {
    KILN_LOG(WARNING) << "local store: cannot mark " << key << " adopted: " << s.ToString();
  }
  if (max_bytes_ == 0) return;
  for (const LocalStore::Evicted& e : store_->Evict(max_bytes_, armed_)) {
    KILN_LOG(INFO) << "local store: evicted " << e.key << " (" << e.bytes
                   << " bytes, last adopted at " << e.last_adopted_ms << " ms) to stay within "
                   << max_bytes_ << " bytes";
    if (events_ == nullptr) continue;
    EventRow row;
    row.kind = event_kind::kLocalCellEvicted;
    row.phase = "evicted";
    row.key = e.key;
    row.detail = "key=" + e.key + " bytes=" + std::to_string(e.bytes) +
                 " last_adopted_ms=" + std::to_string(e.last_adopted_ms) +
                 " bound=" + std::to_string(max_bytes_) + " armed_by=" + key;
    events_->Append(std::move(row));
  }
}

}  // namespace kiln
