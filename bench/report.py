#!/usr/bin/env python3
"""Turn benchmark JSON lines into markdown tables.

    python3 bench/report.py bench/results/20260101-120000.jsonl [more.jsonl ...]

Reads every line with an "engine" key (other lines, such as run.sh's {"meta": ...} line, are
shown as a header). Rows: (model, class, threads). Columns: median ms per engine, then

  compiled/eager  kiln_eager / kiln_compiled           (> 1: compiling paid off)
  vs ORT          onnxruntime / kiln_compiled          (> 1: kiln compiled is faster than ORT)
  vs torch.jit    torch_jit_frozen / kiln_compiled     (> 1: kiln compiled is faster)

and a second table of peak RSS (MiB, with the delta over the process's pre-model baseline in
parentheses; `act N` where an engine reports only "activation_mb", as kiln bench does). Geometric means over the rows that have the value close each column. A repeated
(engine, model, class, threads) keeps the last line. Plain python3, no numpy.
"""

import json
import math
import re
import sys

ENGINES = ["kiln_eager", "kiln_compiled", "onnxruntime", "torch_eager", "torch_jit_frozen"]
SHORT = {"kiln_eager": "kiln eager", "kiln_compiled": "kiln compiled",
         "onnxruntime": "ORT", "torch_eager": "torch eager",
         "torch_jit_frozen": "torch.jit frozen"}
RATIOS = [("compiled/eager", "kiln_eager", "kiln_compiled"),
          ("vs ORT", "onnxruntime", "kiln_compiled"),
          ("vs torch.jit", "torch_jit_frozen", "kiln_compiled")]
SPEC_RE = re.compile(r"([A-Za-z_][\w.:/-]*)\s*=\s*\[([^\]]*)\]")


def class_key(spec):
    """Order- and spacing-independent key of a shape class string."""
    pairs = sorted((m.group(1), m.group(2).replace(" ", "")) for m in SPEC_RE.finditer(spec))
    return ";".join("%s=[%s]" % p for p in pairs) if pairs else spec


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def f_ms(x):
    if x is None:
        return "–"
    if x >= 100:
        return "%.0f" % x
    if x >= 10:
        return "%.1f" % x
    if x >= 1:
        return "%.2f" % x
    return "%.3f" % x


def f_ratio(x):
    return "–" if x is None else "%.2fx" % x


def load(paths):
    rows, metas, order = {}, [], []
    for p in paths:
        with open(p) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line or not line.startswith("{"):
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    sys.stderr.write("report.py: %s:%d: not JSON, skipped\n" % (p, n))
                    continue
                if "meta" in r:
                    metas.append(r["meta"])
                    continue
                if "engine" not in r or "median_ms" not in r:
                    continue
                key = (r.get("model", "?"), class_key(r.get("class", "")),
                       int(r.get("threads", 0)))
                if key not in rows:
                    rows[key] = {"class": r.get("class", ""), "e": {}}
                    order.append(key)
                rows[key]["e"][r["engine"]] = r
    return rows, order, metas


def main(argv):
    if len(argv) < 2:
        sys.stderr.write("usage: report.py RESULTS.jsonl ...\n")
        return 2
    rows, order, metas = load(argv[1:])
    engines = [e for e in ENGINES if any(e in rows[k]["e"] for k in order)]
    engines += sorted({e for k in order for e in rows[k]["e"]} - set(engines))
    ratios = [r for r in RATIOS if r[1] in engines and r[2] in engines]
    out = []
    for m in metas:
        out.append("_" + ", ".join("%s: %s" % (k, v) for k, v in m.items()) + "_")
        out.append("")
    if not order:
        out.append("(no results)")
        print("\n".join(out))
        return 1
    order.sort(key=lambda k: k[2])  # stable: run order within a thread count

    # Latency.
    head = ["model", "class", "T"] + ["%s ms" % SHORT.get(e, e) for e in engines] + \
        [r[0] for r in ratios]
    out.append("Median latency (ms; lower is better). Ratios > 1 favour kiln compiled.")
    out.append("")
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join(["---"] * 2 + ["--:"] * (len(head) - 2)) + "|")
    cols = {e: [] for e in engines}
    rcols = {r[0]: [] for r in ratios}
    errs = []
    for k in order:
        row = rows[k]
        cells = [k[0], "`%s`" % row["class"], str(k[2])]
        for e in engines:
            r = row["e"].get(e)
            v = r["median_ms"] if r else None
            cols[e].append(v)
            cells.append(f_ms(v))
            if r and r.get("max_abs_err") is not None and r["max_abs_err"] > 1e-3:
                errs.append("%s %s T=%d %s: max_abs_err %g"
                            % (k[0], row["class"], k[2], e, r["max_abs_err"]))
        for name, num, den in ratios:
            a, b = row["e"].get(num), row["e"].get(den)
            v = a["median_ms"] / b["median_ms"] if a and b and b["median_ms"] > 0 else None
            rcols[name].append(v)
            cells.append(f_ratio(v))
        out.append("| " + " | ".join(cells) + " |")
    cells = ["**geomean**", "", ""] + ["**%s**" % f_ms(geomean(cols[e])) for e in engines] + \
        ["**%s**" % f_ratio(geomean(rcols[r[0]])) for r in ratios]
    out.append("| " + " | ".join(cells) + " |")

    # Memory.
    out.append("")
    out.append("Peak RSS MiB (delta over the process's baseline before the model was loaded); "
               "one process per engine and (model, class). `act N`: the engine reports only "
               "its activation memory (MiB), not RSS.")
    out.append("")
    head = ["model", "class", "T"] + [SHORT.get(e, e) for e in engines]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join(["---"] * 2 + ["--:"] * (len(head) - 2)) + "|")
    peak = {e: [] for e in engines}
    delta = {e: [] for e in engines}
    for k in order:
        row = rows[k]
        cells = [k[0], "`%s`" % row["class"], str(k[2])]
        for e in engines:
            r = row["e"].get(e)
            if r and r.get("peak_rss_mb") is not None:
                p, d = r["peak_rss_mb"], r.get("rss_delta_mb")
                peak[e].append(p)
                delta[e].append(d)
                cells.append("%.0f (%s)" % (p, "?" if d is None else "%+.0f" % d))
            elif r and r.get("activation_mb") is not None:
                cells.append("act %.1f" % r["activation_mb"])
            else:
                cells.append("–")
        out.append("| " + " | ".join(cells) + " |")
    cells = ["**geomean**", "", ""]
    for e in engines:
        gp, gd = geomean(peak[e]), geomean(delta[e])
        cells.append("–" if gp is None else "**%.0f (%s)**" % (gp, "?" if gd is None
                                                              else "+%.0f" % gd))
    out.append("| " + " | ".join(cells) + " |")

    missing = [e for e in ENGINES if e not in engines]
    if missing:
        out.append("")
        out.append("No results for: %s." % ", ".join(missing))
    if errs:
        out.append("")
        out.append("Output mismatches against the reference outputs (> 1e-3):")
        out.extend("- " + s for s in errs)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
