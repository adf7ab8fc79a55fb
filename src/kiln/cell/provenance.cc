// Code provenance without a compiler: the byte comparison of a rebuild (see provenance.h).
#include "src/kiln/cell/provenance.h"

#include <algorithm>

#include "src/kiln/base/sha256.h"

namespace kiln {

Status CompareRebuild(const std::string& published, const std::string& rebuilt) {
  if (published == rebuilt) return Status::OK();
  const size_t at = static_cast<size_t>(
      std::mismatch(published.begin(), published.end(), rebuilt.begin(), rebuilt.end()).first -
      published.begin());
  return Status::Refused(
      StatusCode::kInvalidArgument, kRefusalRebuildMismatch,
      "the published cell.so (" + std::to_string(published.size()) + " bytes, " +
          "sha256:" + Sha256Hex(published) + ") is not what its source builds to (" +
          std::to_string(rebuilt.size()) + " bytes, " + "sha256:" + Sha256Hex(rebuilt) +
          "); first difference at byte " + std::to_string(at));
}

}  // namespace kiln
