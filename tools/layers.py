#!/usr/bin/env python3
"""The folder graph of src/kiln/, measured from the include lines, and the rules it must keep.

Each folder under src/kiln/ is one layer (one CMake library, or the `kiln` binary for cli/). An
arrow A -> B means a file in A includes "src/kiln/B/...". This script

  * prints the graph: every folder's floor (0 for a folder that includes no other; otherwise one
    above the highest folder it includes) and the folders it includes;
  * with --check, fails (exit 1, naming each breach) when
      - the graph has a cycle,
      - an arrow points up LAYER_ORDER (a folder includes one listed after it),
      - a folder exists that LAYER_ORDER does not list, or LAYER_ORDER lists one that is gone,
      - a folder includes one its entry in FORBIDDEN names (the worker never includes the hub's
        server nor the compiler: it adopts, arms and serves, and mints only in a child process),
      - the graph written in docs/architecture.md (between the `layers:begin` and `layers:end`
        markers) is not what this script prints, so the document cannot drift from the code.

    python3 tools/layers.py            # the graph, as docs/architecture.md shows it
    python3 tools/layers.py --check    # the rules (CTest `layers`)
    python3 tools/layers.py --update   # rewrite docs/architecture.md's block with the graph
"""
import argparse
import os
import re
import sys

# docs/architecture.md walks the layers in this order; every arrow points to an earlier entry.
LAYER_ORDER = [
    "base", "abi", "tensor", "graph", "ops", "eager", "runtime", "identity", "compile", "cell",
    "arm", "manifest", "mint", "net", "receipt", "hub", "client", "worker", "cli",
]

# Folders a layer must never include, whatever the order would allow.
FORBIDDEN = {
    "worker": {"hub", "compile"},
    "hub": {"eager", "runtime", "arm", "compile", "mint", "manifest", "worker", "client"},
    "client": {"eager", "runtime", "arm", "compile", "mint", "manifest", "hub", "worker"},
    "cell": {"eager", "runtime", "arm", "compile", "mint"},
    "identity": {"tensor", "graph", "ops", "eager", "runtime", "compile"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"src/kiln/([a-z_0-9]+)/', re.M)
BEGIN, END = "<!-- layers:begin -->", "<!-- layers:end -->"


def read_graph(root):
    src = os.path.join(root, "src", "kiln")
    graph = {}
    for folder in sorted(os.listdir(src)):
        path = os.path.join(src, folder)
        if not os.path.isdir(path):
            continue
        deps = set()
        for dirpath, _, files in os.walk(path):
            for name in files:
                if name.endswith((".h", ".cc")):
                    with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                        deps.update(INCLUDE.findall(f.read()))
        deps.discard(folder)
        graph[folder] = deps
    return graph


def find_cycle(graph):
    state = {}  # 1 = on the stack, 2 = done

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep, stack)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def floors(graph):
    memo = {}

    def floor(node):
        if node not in memo:
            deps = [d for d in graph.get(node, ()) if d in graph]
            memo[node] = 0 if not deps else 1 + max(floor(d) for d in deps)
        return memo[node]

    return {node: floor(node) for node in graph}


def render(graph):
    fl = floors(graph)
    top = max(fl.values())
    order = {name: i for i, name in enumerate(LAYER_ORDER)}
    lines = ["%d floors (0 to %d); each folder, then the folders it includes:" % (top + 1, top)]
    for level in range(top, -1, -1):
        names = sorted((n for n in graph if fl[n] == level), key=lambda n: order.get(n, 99))
        cells = []
        for n in names:
            deps = sorted(graph[n], key=lambda d: order.get(d, 99))
            cells.append("%s -> %s" % (n, " ".join(deps)) if deps else n)
        lines.append("  floor %d: %s" % (level, "; ".join(cells)))
    return "\n".join(lines) + "\n"


def check(root, graph):
    problems = []
    cycle = find_cycle(graph)
    if cycle:
        problems.append("cycle: " + " -> ".join(cycle))
    for name in graph:
        if name not in LAYER_ORDER:
            problems.append("src/kiln/%s/ is not in LAYER_ORDER (tools/layers.py)" % name)
    for name in LAYER_ORDER:
        if name not in graph:
            problems.append("LAYER_ORDER names %s, which src/kiln/ does not have" % name)
    position = {name: i for i, name in enumerate(LAYER_ORDER)}
    upward = 0
    for name, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if name in position and dep in position and position[dep] > position[name]:
                upward += 1
                problems.append("upward arrow: %s includes %s, which stands above it" % (name, dep))
            if dep in FORBIDDEN.get(name, ()):
                problems.append("forbidden: %s/ includes %s/ (%s)" % (name, dep, _files_including(
                    root, name, dep)))
    doc_path = os.path.join(root, "docs", "architecture.md")
    with open(doc_path, encoding="utf-8") as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        problems.append("docs/architecture.md has no %s ... %s block" % (BEGIN, END))
    elif not cycle:  # a graph with a cycle has no floors to compare
        written = doc.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")
        written = re.sub(r"^```\w*\n|\n```$", "", written.strip())
        if written.strip("\n") != render(graph).strip("\n"):
            problems.append("docs/architecture.md's folder graph is not the measured one; "
                            "`python3 tools/layers.py --update` rewrites it:\n" + render(graph))
    return problems, upward


def _files_including(root, folder, dep):
    hits = []
    base = os.path.join(root, "src", "kiln", folder)
    pattern = re.compile(r'^\s*#\s*include\s+"src/kiln/%s/' % re.escape(dep), re.M)
    for dirpath, _, files in os.walk(base):
        for name in sorted(files):
            p = os.path.join(dirpath, name)
            with open(p, encoding="utf-8") as f:
                if pattern.search(f.read()):
                    hits.append(os.path.relpath(p, root))
    return ", ".join(hits)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--update", action="store_true")
    args = parser.parse_args()
    graph = read_graph(args.root)
    cycle = find_cycle(graph)
    if cycle and not args.check:
        print("layers: cycle: " + " -> ".join(cycle) + "; no floors to draw", file=sys.stderr)
        return 1
    if args.update:
        doc_path = os.path.join(args.root, "docs", "architecture.md")
        with open(doc_path, encoding="utf-8") as f:
            doc = f.read()
        before, rest = doc.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        with open(doc_path, "w", encoding="utf-8") as f:
            f.write(before + BEGIN + "\n```\n" + render(graph) + "```\n" + END + after)
        return 0
    if not args.check:
        sys.stdout.write(render(graph))
        return 0
    problems, upward = check(args.root, graph)
    for p in problems:
        print("layers: " + p, file=sys.stderr)
    if cycle:
        print("layers: %d folders, %d upward arrows, a cycle" % (len(graph), upward))
        return 1
    fl = floors(graph)
    print("layers: %d folders on %d floors, %d upward arrows, no cycle" %
          (len(graph), max(fl.values()) + 1, upward))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
