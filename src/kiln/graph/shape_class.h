// Shape classes and envelopes: the concrete input shapes a target is declared to serve
// (docs/design.md §1). Graph layer, so the compiler (which specializes per class) and the cell
// layer (which keys by envelope) share one definition.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "src/kiln/tensor/tensor.h"

namespace kiln {

// One shape class: a concrete shape per graph input.
using ShapeClass = std::map<std::string, Shape>;

// The declared serving region of a target: a finite list of shape classes.
struct Envelope {
  std::vector<ShapeClass> classes;
};

}  // namespace kiln
