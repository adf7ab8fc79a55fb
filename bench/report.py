#!/usr/bin/env python3
"""Turn benchmark JSON lines into markdown tables.

    python3 bench/report.py bench/results/20260101-120000.jsonl [more.jsonl ...]
    python3 bench/report.py --jobs MODELS_DIR [NAME ...]   (run.sh: the realistic set's jobs)

Reads every line with an "engine" key; {"meta": ...} lines are shown as a header,
{"model_info": ...} lines (the realistic set) give each (model, class) its multiply-adds and
what the goals check, and "onednn_sgemm_peak" lines the kernel library's SGEMM peak per thread
count. Rows: (model, class, threads). Tables:

1. median latency (ms) per engine, then
     compiled/eager  kiln_eager / kiln_compiled       (> 1: compiling paid off)
     kiln/ORT        kiln_compiled / onnxruntime      (< 1: kiln compiled is faster than ORT)
     kiln/torch.jit  kiln_compiled / torch_jit_frozen (< 1: kiln compiled is faster)
2. with model_info: achieved GFLOP/s (2 x multiply-adds / median) per engine, and kiln
   compiled's share of the SGEMM peak measured at the same T;
3. peak RSS MiB per process (delta over its baseline before the model was loaded), and kiln's
   activation memory (eager: peak live intermediates; compiled: the cell's workspace);
4. kiln compiled's first run after bind against its median;
5. with model_info: the goals (docs/benchmarks.md) met or missed, with the numbers.

Geometric means over the rows that have the value close each column. A repeated
(engine, model, class, threads) keeps the last line. Plain python3, no numpy.
"""

import json
import math
import os
import re
import sys

ENGINES = ["kiln_eager", "kiln_compiled", "kiln_compiled_v4", "onnxruntime", "torch_eager",
           "torch_jit_frozen"]
SHORT = {"kiln_eager": "kiln eager", "kiln_compiled": "kiln compiled",
         "kiln_compiled_v4": "kiln compiled v4", "onnxruntime": "ORT",
         "torch_eager": "torch eager", "torch_jit_frozen": "torch.jit frozen"}
# (name, numerator, denominator)
RATIOS = [("compiled/eager", "kiln_eager", "kiln_compiled"),
          ("kiln/ORT", "kiln_compiled", "onnxruntime"),
          ("v4/ORT", "kiln_compiled_v4", "onnxruntime"),
          ("kiln/torch.jit", "kiln_compiled", "torch_jit_frozen")]
KILN_COMPILED = ["kiln_compiled", "kiln_compiled_v4"]
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
    return "–" if x is None else "%.2f" % x


def load(paths):
    rows, metas, order, info, peaks = {}, [], [], {}, {}
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
                if "model_info" in r:
                    i = r["model_info"]
                    info[(i["model"], class_key(i["class"]))] = i
                    continue
                if r.get("engine") == "onednn_sgemm_peak":
                    peaks[int(r["threads"])] = r["gflops"]
                    continue
                if "engine" not in r or "median_ms" not in r:
                    continue
                key = (r.get("model", "?"), class_key(r.get("class", "")),
                       int(r.get("threads", 0)))
                if key not in rows:
                    rows[key] = {"class": r.get("class", ""), "e": {}}
                    order.append(key)
                rows[key]["e"][r["engine"]] = r
    return rows, metas, order, info, peaks


def table(out, head, body, foot=None):
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join(["---"] * 2 + ["--:"] * (len(head) - 2)) + "|")
    for cells in body:
        out.append("| " + " | ".join(cells) + " |")
    if foot:
        out.append("| " + " | ".join(foot) + " |")
    out.append("")


def median(row, e):
    r = row["e"].get(e)
    return r["median_ms"] if r else None


def goals(out, rows, order, info, peaks):
    """The targets of docs/benchmarks.md, each met or missed, with its numbers."""
    out.append("Goals (kiln compiled = the fleet-default cell; the v4 variant alongside):")
    out.append("")
    lines = []
    threads = sorted({k[2] for k in order})
    for e in KILN_COMPILED:
        if not any(e in rows[k]["e"] for k in order):
            continue
        name = SHORT[e]
        for t in threads:
            ks = [k for k in order if k[2] == t and e in rows[k]["e"] and
                  "onnxruntime" in rows[k]["e"]]
            rs = [median(rows[k], e) / median(rows[k], "onnxruntime") for k in ks]
            if not rs:
                continue
            g, worst = geomean(rs), max(rs)
            wk = ks[rs.index(worst)]
            lines.append("- %s, T=%d: geomean %s/ORT latency **%.2f** (goal <= 0.85: %s); "
                         "slowest vs ORT %s `%s` **%.2f** (goal <= 1.10: %s)"
                         % (name, t, name, g, "met" if g <= 0.85 else "missed",
                            wk[0], rows[wk]["class"], worst, "met" if worst <= 1.10 else "missed"))
    for e in KILN_COMPILED:
        ks = [k for k in order if e in rows[k]["e"] and "kiln_eager" in rows[k]["e"]]
        if not ks:
            continue
        rs = [median(rows[k], "kiln_eager") / median(rows[k], e) for k in ks]
        worst = min(rs)
        wk = ks[rs.index(worst)]
        lines.append("- %s >= 2x kiln eager on every row: lowest %s `%s` T=%d **%.2fx** (%s)"
                     % (SHORT[e], wk[0], rows[wk]["class"], wk[2], worst,
                        "met" if worst >= 2.0 else "missed"))
    for e in KILN_COMPILED:
        for k in order:
            i = info.get(k[:2])
            if not i or not i.get("compute_bound") or e not in rows[k]["e"] or k[2] not in peaks:
                continue
            gf = 2.0 * i["macs"] / (median(rows[k], e) * 1e6)
            share = gf / peaks[k[2]]
            lines.append("- %s, compute-bound %s `%s` T=%d: %.0f GFLOP/s = **%.0f%%** of the "
                         "SGEMM peak %.0f GFLOP/s (goal >= 70%%: %s)"
                         % (SHORT[e], k[0], rows[k]["class"], k[2], gf, 100 * share, peaks[k[2]],
                            "met" if share >= 0.7 else "missed"))
    for k in order:
        i = info.get(k[:2])
        if not i or not i.get("attention") or k[2] != threads[0]:
            continue
        ea = rows[k]["e"].get("kiln_eager", {}).get("activation_mb")
        ca = rows[k]["e"].get("kiln_compiled", {}).get("activation_mb")
        if ea and ca is not None:
            lines.append("- activation memory, %s `%s`: compiled %.1f MiB vs eager %.1f MiB = "
                         "**%.2f** (goal <= 0.5: %s)"
                         % (k[0], rows[k]["class"], ca, ea, ca / ea,
                            "met" if ca / ea <= 0.5 else "missed"))
    firsts = [(median(rows[k], "kiln_compiled"), rows[k]["e"]["kiln_compiled"].get("first_ms"), k)
              for k in order if "kiln_compiled" in rows[k]["e"]]
    firsts = [(m, f, k) for m, f, k in firsts if m and f is not None]
    if firsts:
        worst = max(firsts, key=lambda x: x[1] / x[0])
        lines.append("- kiln compiled, first run after bind within 1.5x of the median: worst "
                     "%s `%s` T=%d %.1f ms vs %.1f ms = **%.2fx** (%s)"
                     % (worst[2][0], rows[worst[2]]["class"], worst[2][2], worst[1], worst[0],
                        worst[1] / worst[0], "met" if worst[1] / worst[0] <= 1.5 else "missed"))
    out.extend(lines)
    out.append("")


def jobs(models_dir, only):
    """run.sh: one line per (model, class): its model_info JSON, name and class, tab-separated."""
    order = ["resnet50", "mobilenetv3", "bert", "unet", "mlp"]
    names = sorted(os.listdir(models_dir), key=lambda n: (order.index(n) if n in order else 99, n))
    for name in names:
        if only and name not in only:
            continue
        path = os.path.join(models_dir, name, "bench.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            meta = json.load(f)
        for c in meta["classes"]:
            i = {"model": name, "class": c["class"], "macs": c["macs"],
                 "compute_bound": c.get("compute_bound", False),
                 "attention": meta.get("attention", False)}
            print("%s\t%s\t%s" % (json.dumps({"model_info": i}), name, c["class"]))
    return 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "--jobs":
        return jobs(argv[2], set(argv[3:]))
    if len(argv) < 2:
        sys.stderr.write("usage: report.py RESULTS.jsonl ...\n")
        return 2
    rows, metas, order, info, peaks = load(argv[1:])
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
    label = lambda k: [k[0], "`%s`" % rows[k]["class"], str(k[2])]

    # 1. Latency.
    out.append("Median latency (ms; lower is better). compiled/eager > 1: compiling paid off; "
               "kiln/ORT and kiln/torch.jit < 1: kiln compiled is faster.")
    out.append("")
    cols = {e: [] for e in engines}
    rcols = {r[0]: [] for r in ratios}
    body, errs = [], []
    for k in order:
        row = rows[k]
        cells = label(k)
        for e in engines:
            r = row["e"].get(e)
            v = r["median_ms"] if r else None
            cols[e].append(v)
            cells.append(f_ms(v))
            if r and r.get("max_abs_err") is not None and r["max_abs_err"] > 1e-3:
                errs.append("%s %s T=%d %s: max_abs_err %g"
                            % (k[0], row["class"], k[2], e, r["max_abs_err"]))
        for name, num, den in ratios:
            a, b = median(row, num), median(row, den)
            v = a / b if a and b else None
            rcols[name].append(v)
            cells.append(f_ratio(v))
        body.append(cells)
    foot = ["**geomean**", "", ""] + ["**%s**" % f_ms(geomean(cols[e])) for e in engines] + \
        ["**%s**" % f_ratio(geomean(rcols[r[0]])) for r in ratios]
    table(out, ["model", "class", "T"] + ["%s ms" % SHORT.get(e, e) for e in engines] +
          [r[0] for r in ratios], body, foot)

    # 2. Throughput.
    if info:
        out.append("Achieved GFLOP/s (2 x multiply-adds of the convolutions, linear layers and "
                   "matmuls / median latency); `peak` is oneDNN's SGEMM on 2048^3 at the same T, "
                   "measured in this run: %s."
                   % ", ".join("T=%d %.0f GFLOP/s" % (t, peaks[t]) for t in sorted(peaks)))
        out.append("")
        body = []
        for k in order:
            i = info.get(k[:2])
            if not i:
                continue
            cells = label(k) + ["%.2f" % (i["macs"] / 1e9)]
            for e in engines:
                v = median(rows[k], e)
                cells.append("–" if not v else "%.0f" % (2.0 * i["macs"] / (v * 1e6)))
            for e in KILN_COMPILED:
                v = median(rows[k], e)
                cells.append("–" if not v or k[2] not in peaks else
                             "%.0f%%" % (100 * 2.0 * i["macs"] / (v * 1e6) / peaks[k[2]]))
            body.append(cells)
        table(out, ["model", "class", "T", "GMAC"] + [SHORT.get(e, e) for e in engines] +
              ["%s %% of peak" % SHORT[e] for e in KILN_COMPILED], body)

    # 3. Memory.
    out.append("Peak RSS MiB (delta over the process's baseline before the model was loaded); "
               "one process per engine and (model, class). kiln act: activation memory, MiB "
               "(eager: peak live intermediates; compiled: the cell's workspace).")
    out.append("")
    body = []
    for k in order:
        row = rows[k]
        cells = label(k)
        for e in engines:
            r = row["e"].get(e)
            if r and r.get("peak_rss_mb") is not None:
                d = r.get("rss_delta_mb")
                cells.append("%.0f (%s)" % (r["peak_rss_mb"], "?" if d is None else "%+.0f" % d))
            else:
                cells.append("–")
        for e in ["kiln_eager", "kiln_compiled"]:
            r = row["e"].get(e)
            cells.append("–" if not r or r.get("activation_mb") is None
                         else "%.1f" % r["activation_mb"])
        body.append(cells)
    table(out, ["model", "class", "T"] + [SHORT.get(e, e) for e in engines] +
          ["kiln eager act", "kiln compiled act"], body)

    # 4. First run.
    body = []
    for k in order:
        for e in KILN_COMPILED:
            r = rows[k]["e"].get(e)
            if r and r.get("first_ms") is not None and r["median_ms"]:
                body.append(label(k) + [SHORT[e], f_ms(r.get("setup_ms")), f_ms(r["first_ms"]),
                                        f_ms(r["median_ms"]),
                                        "%.2f" % (r["first_ms"] / r["median_ms"])])
    if body:
        out.append("kiln compiled: binding the cell from the local store (setup ms), its first "
                   "run, and the median.")
        out.append("")
        table(out, ["model", "class", "T", "engine", "setup ms", "first ms", "median ms",
                    "first/median"], body)

    if info:
        goals(out, rows, order, info, peaks)

    missing = [e for e in ENGINES if e not in engines]
    if missing:
        out.append("No results for: %s." % ", ".join(missing))
    if errs:
        out.append("")
        out.append("Output mismatches against the reference outputs (> 1e-3):")
        out.extend("- " + s for s in errs)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
