// The published CPU ISA levels a cell's `sm` axis may name, lowest first (base layer, so the
// compiler that detects the level and the cell layer that admits it share one list).
#pragma once

#include <string>
#include <vector>

namespace kiln {

inline const std::vector<std::string>& KnownSmLevels() {
  static const std::vector<std::string> kLevels = {"x86-64", "x86-64-v2", "x86-64-v3",
                                                   "x86-64-v4"};
  return kLevels;
}

}  // namespace kiln
