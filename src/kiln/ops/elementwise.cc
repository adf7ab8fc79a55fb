// (being written) elementwise op family
#include "src/kiln/ops/registry.h"
namespace kiln { void RegisterElementwiseOps(OpRegistry&) {} }
