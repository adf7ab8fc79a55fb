#!/usr/bin/python3
"""Ranged entries against concrete ones, side by side: latency, mint time and cell size.

    /usr/bin/python3 bench/ranged.py --kiln build/kiln [--threads 1] [--work DIR] [--quick]

Models (random weights, exported at bench time; nothing downloaded):
  bert      a BERT-base-sized encoder (tools/corpus.py's BertEncoder: 12 layers, d 768, 12 heads,
            FFN 3072, vocab 8192, 512 positions; opset 14), input_ids and attention_mask
            [batch, seq], one ranged entry batch in [1, 8] x seq in [1, 256]
  resnet18  torchvision resnet18 at 224x224 (opset 13), image [batch, 3, 224, 224], one ranged
            entry batch in [1, 16]
  resnet18_side
            the same resnet18 over a ranged image side: image [batch, 3, side, side], one ranged
            entry batch in [1, 4] x side in 64, 96, ..., 224 (a step of 32)

For each point (bert: batch 1 and 8 at seq 128; resnet18: batch 1 and 8; resnet18_side: side 224
and 128 at batch 1) `kiln bench
--engine compiled` times the concrete cell compiled for exactly that shape (`kiln_concrete`) and
the ranged cell's entry at that point (`--ranged`, `kiln_ranged`), each process binding its cell
from its own local store (a miss mints it first; the setup time says how long). The ratio is
ranged median / concrete median.

Mint time and cell size: the ranged cell (one `kiln mint` of the ranged entry) against a cell
listing concrete shapes of the range. resnet18's range is 16 shapes: all 16 are minted as one
cell; resnet18_side's is 4 x 6 = 24, all minted as one cell. bert's is 8 x 256 = 2,048 shapes, too many to mint here: a cell of 8 of them (batch 1 and 8
at seq 32, 64, 128, 256) is minted and its per-class time and bytes are multiplied out to 2,048,
and the report says so. `--quick` skips the full listings and uses a smaller BERT (4 layers, d
256) for a smoke run.

Every JSON line (the `kiln bench` rows, the mint rows and a summary) goes to
bench/results/ranged-<UTC stamp>.jsonl, the first line the machine (CPU, ISA, load).
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

import torch
import torchvision

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from corpus import BertEncoder  # noqa: E402
from ranged_serving_check import export  # noqa: E402


def models(work, quick):
    torch.manual_seed(0)
    out = []
    path = os.path.join(work, "bert.onnx")
    if quick:
        bert = BertEncoder(vocab=8192, d=256, layers=4, heads=4, max_len=512)
    else:
        bert = BertEncoder(vocab=8192, d=768, layers=12, heads=12, max_len=512)
    ids = torch.randint(0, 8192, (2, 16))
    export(bert, (ids, torch.ones(2, 16, dtype=torch.int64)), ["input_ids", "attention_mask"],
           {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
           path, 14, ["hidden", "pooled"])
    out.append({
        "name": "bert", "path": path,
        "ranged": {"inputs": {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]},
                   "ranges": {"batch": [1, 8], "seq": [1, 256]}},
        "cls": lambda b, s: f"input_ids=[{b},{s}];attention_mask=[{b},{s}]",
        "toml": lambda b, s: f"{{ input_ids = [{b}, {s}], attention_mask = [{b}, {s}] }}",
        "points": [(1, 128), (8, 128)],
        "listing": [(b, s) for b in (1, 8) for s in (32, 64, 128, 256)], "shapes": 8 * 256})
    path = os.path.join(work, "resnet18.onnx")
    side = 64 if quick else 224
    export(torchvision.models.resnet18(weights=None), (torch.randn(1, 3, side, side),), ["image"],
           {"image": {0: "batch"}}, path, 13, ["logits"])
    out.append({
        "name": "resnet18", "path": path,
        "ranged": {"inputs": {"image": ["batch", 3, side, side]}, "ranges": {"batch": [1, 16]}},
        "cls": lambda b, s: f"image=[{b},3,{side},{side}]",
        "toml": lambda b, s: f"{{ image = [{b}, 3, {side}, {side}] }}",
        "points": [(1, None), (8, None)],
        "listing": [(b, None) for b in range(1, 17)], "shapes": 16})
    path = os.path.join(work, "resnet18_side.onnx")
    sides = list(range(64, 225, 32))
    export(torchvision.models.resnet18(weights=None), (torch.randn(1, 3, side, side),), ["image"],
           {"image": {0: "batch", 2: "side", 3: "side"}}, path, 13, ["logits"])
    out.append({
        "name": "resnet18_side", "path": path,
        "ranged": {"inputs": {"image": ["batch", 3, "side", "side"]},
                   "ranges": {"batch": [1, 4], "side": [64, 224, 32]}},
        "cls": lambda b, s: f"image=[{b},3,{s},{s}]",
        "toml": lambda b, s: f"{{ image = [{b}, 3, {s}, {s}] }}",
        "points": [(1, 224 if not quick else 64), (1, 128)],
        "listing": [(b, s) for b in range(1, 5) for s in sides], "shapes": 4 * len(sides)})
    return out


def sh(args, env=None, timeout=7200):
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)[:200]} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def cell_bytes(store):
    total = 0
    for root, _, files in os.walk(os.path.join(store, "cells")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if f == "cell.tar")
    return total


def mint(kiln, work, name, model, envelope_lines, tag):
    """`kiln mint` of one target whose envelope is `envelope_lines`, in a fresh store."""
    d = os.path.join(work, f"{name}-{tag}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "kiln.toml"), "w") as f:
        f.write(f'[endpoint]\nname = "{name}"\n[targets.{name}]\ngraph = "{model}"\n'
                f'envelope = [\n' + "".join(f"  {e},\n" for e in envelope_lines) + "]\n"
                f'[functions.{name}]\ntarget = "{name}"\n')
    env = dict(os.environ, KILN_CACHE_DIR=os.path.join(d, "store"))
    start = time.time()
    sh([kiln, "mint", "--manifest", os.path.join(d, "kiln.toml")], env)
    return {"seconds": time.time() - start, "bytes": cell_bytes(os.path.join(d, "store")),
            "classes": len(envelope_lines)}


def bench(kiln, threads, model, cls, store, label, ranged=None):
    env = dict(os.environ, KILN_CACHE_DIR=store, OMP_WAIT_POLICY="PASSIVE")
    args = [kiln, "bench", model, "--class", cls, "--engine", "compiled", "--json", "--threads",
            str(threads), "--label", label, "--runs", "50", "--max-seconds", "20"]
    if ranged:
        args += ["--ranged", json.dumps(ranged)]
    rows = [json.loads(line) for line in sh(args, env).splitlines() if line.startswith("{")]
    return rows[-1]


def machine():
    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line
    isa = "avx512f" if " avx512f" in flags else "avx2" if " avx2" in flags else "sse"
    return {"cpu": name, "isa": isa, "cores": os.cpu_count(), "machine": platform.machine(),
            "loadavg_start": open("/proc/loadavg").read().split()[0],
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "git": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", default="/tmp/kiln-bench-ranged")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", help="comma-separated model names (default: all)")
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln)
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    out_path = os.path.join(ROOT, "bench", "results",
                            "ranged-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + ".jsonl")
    out = open(out_path, "w")

    def emit(row):
        out.write(json.dumps(row) + "\n")
        out.flush()

    emit({"meta": dict(machine(), threads=args.threads, quick=args.quick)})
    summary = []
    for m in models(args.work, args.quick):
        if args.only and m["name"] not in args.only.split(","):
            continue
        stores = {k: os.path.join(args.work, f"{m['name']}-{k}-store") for k in ("c", "r")}
        for s in stores.values():
            shutil.rmtree(s, ignore_errors=True)
        for b, s in m["points"]:
            cls = m["cls"](b, s)
            c = bench(kiln, args.threads, m["path"], cls, stores["c"], "kiln_concrete")
            r = bench(kiln, args.threads, m["path"], cls, stores["r"], "kiln_ranged", m["ranged"])
            emit(c)
            emit(r)
            row = {"model": m["name"], "class": cls, "threads": args.threads,
                   "concrete_ms": c["median_ms"], "ranged_ms": r["median_ms"],
                   "ratio": r["median_ms"] / c["median_ms"],
                   "ranged_first_ms": r["first_ms"], "concrete_first_ms": c["first_ms"]}
            summary.append(row)
            emit({"latency": row})
            print(f"{m['name']:9s} {cls:40s} concrete {c['median_ms']:9.3f} ms  ranged "
                  f"{r['median_ms']:9.3f} ms  ratio {row['ratio']:.3f}  (first run: concrete "
                  f"{c['first_ms']:.1f} ms, ranged {r['first_ms']:.1f} ms incl. its instance)",
                  flush=True)
        ranged_toml = ("{ " + ", ".join(
            f"{k} = [" + ", ".join(f'"{d}"' if isinstance(d, str) else str(d) for d in v) + "]"
            for k, v in m["ranged"]["inputs"].items()) + ", ranges = { " + ", ".join(
            f"{k} = [" + ", ".join(str(x) for x in r) + "]"
            for k, r in m["ranged"]["ranges"].items()) + " } }")
        rm = mint(kiln, args.work, m["name"], m["path"], [ranged_toml], "ranged")
        row = {"model": m["name"], "ranged_mint_s": rm["seconds"], "ranged_cell_bytes": rm["bytes"],
               "shapes_in_range": m["shapes"]}
        if not args.quick:
            cm = mint(kiln, args.work, m["name"], m["path"],
                      [m["toml"](b, s) for b, s in m["listing"]], "listing")
            per_s, per_b = cm["seconds"] / cm["classes"], cm["bytes"] / cm["classes"]
            row.update(listing_classes=cm["classes"], listing_mint_s=cm["seconds"],
                       listing_cell_bytes=cm["bytes"],
                       every_shape_mint_s=per_s * m["shapes"],
                       every_shape_cell_bytes=per_b * m["shapes"],
                       every_shape_measured=cm["classes"] == m["shapes"])
        emit({"mint": row})
        print(json.dumps(row), flush=True)
    emit({"meta": {"loadavg_end": open("/proc/loadavg").read().split()[0]}})
    out.close()
    print("results:", os.path.relpath(out_path, ROOT))


if __name__ == "__main__":
    main()
