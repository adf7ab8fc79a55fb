#!/usr/bin/env python3
"""Print the shape classes to benchmark for an example, one spec per line (`x=[4,64]`,
`latent=[1,4,64,64];timestep=[1];cond=[1,64]`).

    python3 bench/classes.py examples/mlp

Source: examples/<name>/kiln.toml when it declares classes, else the reference inputs' shapes
(inputs/*.npy headers, in the graph's input order as README.md lists them) and, for mlp, also
batch 1 and 16.

The kiln.toml reader is deliberately tolerant; it accepts, anywhere in the file, a key named
class / classes / shape_class / shape_classes / envelope whose value is
  - a spec string, or a list of spec strings ("x=[4,64]"), kept verbatim;
  - a table {input = [dims], ...}, or a list of such tables (`[[classes]]`);
  - a list of tables carrying such a table under shapes / inputs / shape, or a spec string
    under spec / class.
Plain python3 (3.11+ for tomllib); no numpy.
"""

import ast
import os
import re
import struct
import sys

CLASS_KEYS = {"class", "classes", "shape_class", "shape_classes", "envelope"}
SPEC_RE = re.compile(r"([A-Za-z_][\w.:/-]*)\s*=\s*\[([^\]]*)\]")
EXTRA_FALLBACK = {"mlp": ["x=[1,64]", "x=[16,64]"]}


def fmt(pairs):
    return ";".join("%s=[%s]" % (n, ",".join(str(int(d)) for d in dims)) for n, dims in pairs)


def is_dims(v):
    return isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool)
                                       for d in v)


def is_shape_table(v):
    return isinstance(v, dict) and v and all(is_dims(x) for x in v.values())


def from_value(v, out):
    if isinstance(v, str):
        if SPEC_RE.search(v):
            out.append(v.strip())
    elif is_shape_table(v):
        out.append(fmt(v.items()))
    elif isinstance(v, list):
        for item in v:
            from_value(item, out)
    elif isinstance(v, dict):
        for k in ("shapes", "inputs", "shape", "spec", "class", "classes"):
            if k in v:
                from_value(v[k], out)


def walk(doc, out):
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in CLASS_KEYS:
                before = len(out)
                from_value(v, out)
                if len(out) > before:
                    continue
            walk(v, out)
    elif isinstance(doc, list):
        for item in doc:
            walk(item, out)


def from_toml(path):
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        sys.stderr.write("classes.py: no tomllib (Python %s); ignoring %s\n"
                         % (sys.version.split()[0], path))
        return []
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except Exception as e:  # a file being written right now, or another format
        sys.stderr.write("classes.py: cannot read %s: %s\n" % (path, e))
        return []
    out = []
    walk(doc, out)
    return out


def npy_shape(path):
    with open(path, "rb") as f:
        head = f.read(12)
        if head[:6] != b"\x93NUMPY":
            raise ValueError("%s: not .npy" % path)
        if head[6] == 1:
            (n,) = struct.unpack("<H", head[8:10])
            f.seek(10)
        else:
            (n,) = struct.unpack("<I", head[8:12])
            f.seek(12)
        header = ast.literal_eval(f.read(n).decode("latin1"))
    return list(header["shape"])


def input_order(model_dir, names):
    """Graph input order from README.md's `- input  `name ...`` lines; else sorted."""
    order = []
    try:
        with open(os.path.join(model_dir, "README.md")) as f:
            for line in f:
                m = re.match(r"-\s+input\s+`([^ `]+)", line)
                if m and m.group(1) in names:
                    order.append(m.group(1))
    except OSError:
        pass
    return order + sorted(n for n in names if n not in order)


def fallback(model_dir):
    d = os.path.join(model_dir, "inputs")
    shapes = {f[:-4]: npy_shape(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".npy")}
    ref = fmt((n, shapes[n]) for n in input_order(model_dir, set(shapes)))
    name = os.path.basename(os.path.abspath(model_dir))
    return [ref] + EXTRA_FALLBACK.get(name, [])


def classes(model_dir):
    toml = os.path.join(model_dir, "kiln.toml")
    got = from_toml(toml) if os.path.exists(toml) else []
    source = "kiln.toml"
    if not got:
        got, source = fallback(model_dir), "reference inputs"
    seen, out = set(), []
    for s in got:
        key = tuple(sorted((m.group(1), m.group(2).replace(" ", ""))
                           for m in SPEC_RE.finditer(s)))
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out, source


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: classes.py MODEL_DIR\n")
        return 2
    out, source = classes(argv[1])
    sys.stderr.write("classes.py: %s: %d class(es) from %s\n"
                     % (os.path.basename(os.path.abspath(argv[1])), len(out), source))
    for s in out:
        print(s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
