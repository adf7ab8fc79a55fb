// OrderBook: the eager-only orders on disk (see order_book.h).
#include "src/kiln/worker/order_book.h"

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "src/kiln/base/file.h"

namespace kiln {

Result<std::unique_ptr<OrderBook>> OrderBook::Open(std::string path) {
  std::unique_ptr<OrderBook> book(new OrderBook(std::move(path)));
  std::error_code ec;
  if (book->path_.empty() || !std::filesystem::exists(book->path_, ec)) return book;
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(book->path_));
  auto j = nlohmann::json::parse(text, nullptr, false);
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("eager-only order book " + book->path_ + ": " + why +
                                   "; expected {\"<target>\": {\"on\": bool, \"reason\": string, "
                                   "\"set_at\": integer}}");
  };
  if (!j.is_object()) return bad("not a JSON object");
  for (const auto& [target, v] : j.items()) {
    if (!v.is_object() || !v.contains("on") || !v["on"].is_boolean() ||
        !v.value("reason", nlohmann::json("")).is_string() ||
        !v.value("set_at", nlohmann::json(0)).is_number_integer()) {
      return bad("the order of target '" + target + "' is malformed");
    }
    book->admin_[target] = EagerOnlyOrder{v["on"].get<bool>(), v.value("reason", std::string()),
                                          v.value("set_at", int64_t{0}), "admin"};
  }
  return book;
}

EagerOnlyOrder OrderBook::AtBoot(const std::string& target, bool manifest_eager_only) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = admin_.find(target); it != admin_.end()) return it->second;
  EagerOnlyOrder o;
  o.on = manifest_eager_only;
  o.reason = manifest_eager_only ? "the manifest's eager_only" : "";
  o.source = "manifest";
  return o;
}

Status OrderBook::Set(const std::string& target, bool on, const std::string& reason, int64_t now) {
  std::lock_guard<std::mutex> lock(mu_);
  admin_[target] = EagerOnlyOrder{on, reason, now, "admin"};
  return SaveLocked();
}

Status OrderBook::SaveLocked() const {
  if (path_.empty()) return Status::OK();
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [target, o] : admin_) {
    j[target] = {{"on", o.on}, {"reason", o.reason}, {"set_at", o.set_at}};
  }
  // The store root may not exist yet: a worker that has adopted nothing made no directory.
  KILN_RETURN_IF_ERROR(MakeDirs(std::filesystem::path(path_).parent_path().string()));
  return WriteFileAtomic(path_, j.dump(2) + "\n", Durability::kDurable);
}

}  // namespace kiln
