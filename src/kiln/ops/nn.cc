// (being written) nn op family
#include "src/kiln/ops/registry.h"
namespace kiln { void RegisterNnOps(OpRegistry&) {} }
