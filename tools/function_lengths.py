#!/usr/bin/env python3
"""Function lengths in C++ sources: every function body longer than a bound, from the line its
signature starts on to its closing brace, lambdas inside it included.

    python3 tools/function_lengths.py --max 150 src/kiln/worker src/kiln/mint   # CTest function_length
    python3 tools/function_lengths.py --max 0 src/kiln/worker                  # every function's length

Exit 1, naming each one, when a function is longer than --max. A scanner, not a parser: comments,
strings and raw strings are blanked, then a `{` whose text since the last `;`, `{` or `}` ends
like a signature (`...)`, `...) const`, `... -> T`) opens a function when it stands at namespace
scope; a class body's member functions are found the same way.
"""
import argparse
import os
import re
import sys

SCOPE = re.compile(r"\b(namespace|class|struct|enum|union)\b[^()]*$|extern\s+\"\"$")
SIGNATURE = re.compile(r"\)\s*(const)?\s*(noexcept)?\s*(override|final)?\s*(->\s*[\w:<>,\s*&]+)?\s*$")


def blank(src):
    """Comments, strings and character literals blanked; newlines kept."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, j))
            i = j
            continue
        raw = re.match(r'R"([^(\s]*)\(', src[i:i + 20])
        if raw:
            end = ")" + raw.group(1) + '"'
            j = src.find(end, i + len(raw.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
            continue
        c = src[i]
        if c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    """(lines, first line, signature) of every function in the file."""
    with open(path, encoding="utf-8") as f:
        text = blank(f.read())
    found, stack, line, head = [], [], 1, ""
    for ch in text:
        if ch == "\n":
            line += 1
        if ch == "{":
            h = head.strip()
            if SCOPE.search(h):
                kind = "scope"
            elif all(k == "scope" for k, _, _ in stack) and SIGNATURE.search(h) and "=" not in h.split("(")[0]:
                kind = "function"
            else:
                kind = "block"
            stack.append((kind, line - h.count("\n"), h))
            head = ""
        elif ch == "}":
            if stack:
                kind, first, h = stack.pop()
                if kind == "function":
                    found.append((line - first + 1, first, " ".join(h.split())))
            head = ""
        elif ch == ";":
            head = ""
        else:
            head += ch
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=150)
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args()
    over = []
    for root in args.paths:
        for dirpath, _, files in os.walk(root):
            for name in sorted(files):
                if name.endswith((".cc", ".h")):
                    p = os.path.join(dirpath, name)
                    for n, first, sig in functions(p):
                        if n > args.max:
                            over.append((n, p, first, sig))
    for n, p, first, sig in sorted(over, reverse=True):
        print("%s:%d: %d lines: %s" % (p, first, n, sig[-100:]))
    if args.max > 0 and over:
        print("function_lengths: %d function(s) over %d lines" % (len(over), args.max),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
