// The graph verifier (ops layer): structural checks every consumer of a Graph may rely on
// afterwards. Sits right above the op registry (it asks each op's check()), below the interpreter
// and compiler; run after import and after every compiler pass.
//
// Checks, each failure naming the node and the problem: every op is known at the graph's opset
// for its domain; each op's attribute/arity check passes; every node input is defined before use
// (graph input, initializer, outer scope or an earlier node's output); every value is defined
// once; every graph output is produced; graph inputs do not shadow initializers.
#pragma once

#include <set>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"

namespace kiln {

Status VerifyGraph(const Graph& graph, const std::set<std::string>& outer_scope = {});

}  // namespace kiln
