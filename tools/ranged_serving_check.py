#!/usr/bin/env python3
"""Ranged entries served compiled on real models, by a real worker, against eager.

Builds, with random weights and torch's exporter (dynamic axes), each model below, writes a
kiln.toml whose envelope is one ranged entry, and starts `kiln worker` on it (its own local store:
the worker mints the cell in a child at boot, once). Then, at N random points of the range
(seeded), it sends a KServe v2 request and requires:
  - the answer is the cell's (`serving_mode` aot_cell), every request by the same cell ref;
  - its outputs match `kiln run` (the eager interpreter, a separate process) on the same inputs
    within the strict gate (arm/gate.h): cos >= 0.99999 and |s|/|r| within [0.999, 1/0.999]
    over all outputs, non-finite positions equal;
and, past the range, that the request is served eager as `declared_range_exceeded`, naming the
symbol, while the cell stays armed (the next request in range is the cell's again).

Models (`--only` picks some):
  bert      BERT-style encoder (opset 14; position table of 512, so seq 257 is a valid input the
            envelope does not declare), input_ids/attention_mask [batch, seq], batch in [1, 8],
            seq in [1, 256]; past the range: seq 257
  resnet18  torchvision resnet18, image [batch, 3, 64, 64], batch in [1, 16]; past it: batch 17
  resnet18_side
            the corpus's resnet18 over a ranged spatial size: image [batch, 3, side, side], batch
            in [1, 4], side in 64, 96, ..., 224 (a step of 32, which every stride-2 stage
            divides); past it: side 256, and side 100 (inside [64, 224] but off the grid)
  unet_side the corpus's UNet denoiser (opset 17; strided down path, nearest up path, GroupNorm):
            latent [batch, 4, side, side] with timestep [batch] and cond [batch, 64], batch in
            [1, 2], side in 16, 24, ..., 64; its output is [batch, 4, side, side]; past it: side
            72, and side 20 (off the grid)
  gpt       the corpus's GPT-style decoder (opset 17, positions and causal mask of 128), input_ids
            [1, seq], seq in [1, 64] (its sequence is its spatial axis: the causal mask is sliced
            to seq x seq); past it: seq 65

    python3 tools/ranged_serving_check.py --kiln build/kiln --work /tmp/ranged-serving \
        [--points 20] [--only bert,resnet18,resnet18_side,unet_side,gpt]

Prints one line per model (points served compiled, worst cos and retention, mint time) and a JSON
summary with --json FILE. Exit status 1 when any check fails.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import BertEncoder, GptDecoder, UNetDenoiser  # noqa: E402
from mint_serving_latency import free_port  # noqa: E402

COS_WARN = 0.99999
RETENTION = 0.999


def export(model, args, names, axes, path, opset, outputs):
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, args, path, opset_version=opset, input_names=names,
                          output_names=outputs, dynamic_axes=axes, do_constant_folding=True)


def bert_inputs(rng, p):
    b, s = p["batch"], p["seq"]
    ids = rng.integers(0, 1000, (b, s)).astype(np.int64)
    mask = np.ones((b, s), dtype=np.int64)
    for row in range(b):  # some rows padded at the end, as real batches are
        keep = int(rng.integers(1, s + 1))
        mask[row, keep:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def models(work, only):
    torch.manual_seed(0)
    out = []
    if "bert" in only:
        path = os.path.join(work, "bert_encoder_opset14.onnx")
        ids = torch.randint(0, 1000, (2, 16))
        export(BertEncoder(max_len=512), (ids, torch.ones(2, 16, dtype=torch.int64)),
               ["input_ids", "attention_mask"],
               {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
               path, 14, ["hidden", "pooled"])
        out.append({
            "name": "bert", "path": path,
            "envelope": '{ input_ids = ["batch", "seq"], attention_mask = ["batch", "seq"], '
                        'ranges = { batch = [1, 8], seq = [1, 256] } }',
            "ranges": {"batch": (1, 8), "seq": (1, 256)}, "inputs": bert_inputs,
            "past": {"batch": 2, "seq": 257}, "symbol": "seq"})
    if "resnet18" in only:
        path = os.path.join(work, "resnet18_batch.onnx")
        export(torchvision.models.resnet18(weights=None, num_classes=10),
               (torch.randn(1, 3, 64, 64),), ["image"], {"image": {0: "batch"}}, path, 13,
               ["logits"])
        out.append({
            "name": "resnet18", "path": path,
            "envelope": '{ image = ["batch", 3, 64, 64], ranges = { batch = [1, 16] } }',
            "ranges": {"batch": (1, 16)},
            "inputs": lambda rng, p: {"image": rng.standard_normal((p["batch"], 3, 64, 64))
                                      .astype(np.float32)},
            "past": {"batch": 17}, "symbol": "batch"})
    if "resnet18_side" in only:
        path = os.path.join(work, "resnet18_side.onnx")
        export(torchvision.models.resnet18(weights=None, num_classes=10),
               (torch.randn(1, 3, 64, 64),), ["image"],
               {"image": {0: "batch", 2: "side", 3: "side"}}, path, 13, ["logits"])
        out.append({
            "name": "resnet18_side", "path": path,
            "envelope": '{ image = ["batch", 3, "side", "side"], '
                        'ranges = { batch = [1, 4], side = [64, 224, 32] } }',
            "ranges": {"batch": (1, 4), "side": (64, 224, 32)},
            "inputs": lambda rng, p: {"image": rng.standard_normal(
                (p["batch"], 3, p["side"], p["side"])).astype(np.float32)},
            "past": {"batch": 1, "side": 256}, "off_grid": {"batch": 1, "side": 100},
            "symbol": "side"})
    if "unet_side" in only:
        path = os.path.join(work, "unet_denoiser_side.onnx")
        export(UNetDenoiser(), (torch.randn(1, 4, 32, 32), torch.rand(1) * 1000,
                                torch.randn(1, 64)), ["latent", "timestep", "cond"],
               {"latent": {0: "batch", 2: "side", 3: "side"}, "timestep": {0: "batch"},
                "cond": {0: "batch"}}, path, 17, ["noise"])
        out.append({
            "name": "unet_side", "path": path,
            "envelope": '{ latent = ["batch", 4, "side", "side"], timestep = ["batch"], '
                        'cond = ["batch", 64], ranges = { batch = [1, 2], side = [16, 64, 8] } }',
            "ranges": {"batch": (1, 2), "side": (16, 64, 8)},
            "inputs": lambda rng, p: {
                "latent": rng.standard_normal((p["batch"], 4, p["side"], p["side"]))
                .astype(np.float32),
                "timestep": (rng.random(p["batch"]) * 1000).astype(np.float32),
                "cond": rng.standard_normal((p["batch"], 64)).astype(np.float32)},
            "past": {"batch": 1, "side": 72}, "off_grid": {"batch": 1, "side": 20},
            "symbol": "side"})
    if "gpt" in only:
        path = os.path.join(work, "gpt_decoder_opset17.onnx")
        export(GptDecoder(max_len=128), (torch.randint(0, 1000, (1, 16)),), ["input_ids"],
               {"input_ids": {1: "seq"}}, path, 17, ["logits"])
        out.append({
            "name": "gpt", "path": path,
            "envelope": '{ input_ids = [1, "seq"], ranges = { seq = [1, 64] } }',
            "ranges": {"seq": (1, 64)},
            "inputs": lambda rng, p: {"input_ids": rng.integers(0, 1000, (1, p["seq"]))
                                      .astype(np.int64)},
            "past": {"seq": 65}, "symbol": "seq"})
    return out


def step(r):
    return r[2] if len(r) > 2 else 1


DTYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


def infer(port, name, inputs):
    body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": DTYPES[v.dtype],
                        "data": v.reshape(-1).tolist()} for k, v in inputs.items()]}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{name}/infer",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def eager(kiln, model, inputs, d):
    os.makedirs(d, exist_ok=True)
    args = [kiln, "run", model, "--out", os.path.join(d, "out")]
    for k, v in inputs.items():
        np.save(os.path.join(d, k + ".npy"), v)
        args += ["--input", f"{k}={os.path.join(d, k + '.npy')}"]
    subprocess.run(args, check=True, capture_output=True, timeout=600)
    return {f[:-4]: np.load(os.path.join(d, "out", f)) for f in os.listdir(os.path.join(d, "out"))}


def gate(ref, got):
    """cos and retention over all outputs, in double, as the strict gate measures them."""
    r = np.concatenate([ref[k].astype(np.float64).reshape(-1) for k in sorted(ref)])
    s = np.concatenate([got[k].astype(np.float64).reshape(-1) for k in sorted(ref)])
    fin_r, fin_s = np.isfinite(r), np.isfinite(s)
    if not np.array_equal(fin_r, fin_s) or not np.array_equal(r[~fin_r], s[~fin_s]):
        return 0.0, 0.0, "non-finite positions differ"
    r, s = r[fin_r], s[fin_s]
    nr, ns = np.linalg.norm(r), np.linalg.norm(s)
    if nr == 0 and ns == 0:
        return 1.0, 1.0, ""
    if nr == 0 or ns == 0:
        return 0.0, 0.0, "one side is zero"
    return float(r @ s / (nr * ns)), float(ns / nr), ""


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check(kiln, work, spec, points, seed):
    d = os.path.join(work, spec["name"])
    subprocess.run(["rm", "-rf", d], check=True)
    os.makedirs(d)
    with open(os.path.join(d, "kiln.toml"), "w") as f:
        f.write(f"""[endpoint]
name = "{spec['name']}"
[targets.{spec['name']}]
graph = "{spec['path']}"
lane = "optional"
export = {{ family = "test/{spec['name']}" }}
envelope = [
  {spec['envelope']},
]
[functions.{spec['name']}]
target = "{spec['name']}"
""")
    env = dict(os.environ, KILN_CACHE_DIR=os.path.join(d, "cache"))
    port = free_port()
    events = os.path.join(d, "events.jsonl")
    log = open(os.path.join(d, "worker.log"), "w")
    worker = subprocess.Popen([kiln, "worker", "--manifest", os.path.join(d, "kiln.toml"),
                               "--port", str(port), "--events", events, "--max-body-mb", "64"],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    failures = []
    result = {"model": spec["name"], "points": 0, "compiled": 0}
    try:
        start = time.time()
        while time.time() - start < 900:  # the mint: bounded
            kinds = [(r.get("kind"), r.get("phase")) for r in rows(events)]
            if ("local_cell_armed", "armed") in kinds:
                break
            if worker.poll() is not None:
                raise SystemExit(f"{spec['name']}: the worker exited ({worker.returncode})")
            time.sleep(0.2)
        else:
            raise SystemExit(f"{spec['name']}: no cell armed after 900 s; see {d}/worker.log")
        mint = [r for r in rows(events) if r.get("kind") == "mint_phases"]
        result["mint_ms"] = mint[-1].get("duration_ms") if mint else None
        rng = np.random.default_rng(seed)
        pick = random.Random(seed)
        refs = set()
        worst_cos, worst_ret = 1.0, 1.0
        for i in range(points):
            p = {s: r[0] + pick.randint(0, (r[1] - r[0]) // step(r)) * step(r)
                 for s, r in spec["ranges"].items()}
            inputs = spec["inputs"](rng, p)
            status, body = infer(port, spec["name"], inputs)
            result["points"] += 1
            params = body.get("parameters", {})
            if status != 200 or params.get("serving_mode") != "aot_cell":
                failures.append(f"{p}: {status} {params.get('serving_mode')} "
                                f"{params.get('fallback_reason', '')} {json.dumps(body)[:300]}")
                continue
            result["compiled"] += 1
            refs.add(params.get("served_cell_ref"))
            got = {o["name"]: np.array(o["data"], dtype=np.float32).reshape(o["shape"])
                   for o in body["outputs"]}
            ref = eager(kiln, spec["path"], inputs, os.path.join(d, f"point{i}"))
            cos, ret, why = gate(ref, got)
            worst_cos, worst_ret = min(worst_cos, cos), min(worst_ret, ret, 1 / ret if ret else 0)
            if why or cos < COS_WARN or not RETENTION <= ret <= 1 / RETENTION:
                failures.append(f"{p}: cos {cos:.9f} retention {ret:.9f} {why}")
        if len(refs) > 1:
            failures.append(f"answers came from {len(refs)} cells: {sorted(refs)}")
        result.update(worst_cos=worst_cos, worst_retention=worst_ret)
        # Past the range (and off a step's grid): eager, named, and the cell stays armed.
        for where in ("past", "off_grid"):
            if where not in spec:
                continue
            status, body = infer(port, spec["name"], spec["inputs"](rng, spec[where]))
            params = body.get("parameters", {})
            text = json.dumps(body)
            if status != 200 or params.get("serving_mode") != "eager" or \
                    "declared_range_exceeded" not in text or \
                    f"symbol '{spec['symbol']}'" not in text:
                failures.append(f"{where} {spec[where]}: {status} {text[:300]}")
        inside = {s: r[0] for s, r in spec["ranges"].items()}
        status, body = infer(port, spec["name"], spec["inputs"](rng, inside))
        if body.get("parameters", {}).get("serving_mode") != "aot_cell":
            failures.append(f"after the out-of-range request the cell is not serving: {status}")
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
    result["failures"] = failures
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--only", default="bert,resnet18,resnet18_side,unet_side,gpt")
    ap.add_argument("--json")
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln)
    os.makedirs(args.work, exist_ok=True)
    only = set(args.only.split(","))
    results, failed = [], False
    for spec in models(args.work, only):
        r = check(kiln, args.work, spec, args.points, args.seed)
        results.append(r)
        mint = f"{r['mint_ms'] / 1000:.1f} s" if r.get("mint_ms") else "?"
        print(f"{r['model']:13s} {r['compiled']}/{r['points']} random points served compiled; "
              f"worst cos {r.get('worst_cos', 0):.9f}, retention {r.get('worst_retention', 0):.9f}; "
              f"mint {mint}; " + ("OK" if not r["failures"] else "FAILED"))
        for f in r["failures"]:
            print("    " + f)
        failed = failed or bool(r["failures"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
