#!/usr/bin/env python3
"""Shapes over a range on real models: kiln's polynomial for every value, against kiln's own
concrete static inference at random points the fit never saw.

Builds, with random weights and torch's exporter (dynamic axes): a BERT-style encoder with
`batch` in [1, 8] and `seq` in [1, 256] (opsets 14 and 17), torchvision's resnet18 with `batch`
in [1, 16], resnet18 with a ranged spatial size `side` in [64, 128], and resnet18 with `side` in
64, 96, ..., 224 (a step of 32, which its five stride-2 stages divide). For each, runs
`kiln info MODEL --ranged ENTRY` and, at N random points inside the ranges,
`kiln info MODEL --shapes-at SHAPES`, and checks that every fitted value's polynomial gives the
concrete shape, that fitted + irregular + dynamic values are exactly the values the graph has, and
that each model's irregular set is what its architecture implies (none for ranged batch and
sequence and for the stepped side; the strided convolutions' outputs for a contiguous spatial
range). A stepped symbol's polynomials are in its coordinate, value // step. Then reports whether
the compiler's generated source over each range is one template (`kiln info --ranged ...
--template`, compile/ranged_emit.h): it must be for ranged batch and sequence from 2 up and for
the stepped side, and cannot be for a contiguous spatial range; where it is not, the first point
and line where it differs are printed.

    python3 tools/ranged_shapes_check.py --kiln build/kiln --work /tmp/ranged [--points 20]
"""
import argparse
import json
import os
import random
import subprocess
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import BertEncoder  # noqa: E402


def export(model, args, names, axes, path, opset):
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, args, path, opset_version=opset, input_names=names,
                          dynamic_axes=axes, do_constant_folding=True)


def models(work):
    torch.manual_seed(0)
    out = []
    bert = BertEncoder(max_len=256)
    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    bert_axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    bert_entry = {"inputs": {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]},
                  "ranges": {"batch": [1, 8], "seq": [1, 256]}}
    for opset in (14, 17):
        path = os.path.join(work, f"bert_encoder_opset{opset}.onnx")
        export(bert, (ids, mask), ["input_ids", "attention_mask"], bert_axes, path, opset)
        out.append((path, bert_entry, "none"))
    resnet = torchvision.models.resnet18(weights=None, num_classes=10)
    image = torch.randn(1, 3, 64, 64)
    path = os.path.join(work, "resnet18_batch.onnx")
    export(resnet, (image,), ["image"], {"image": {0: "batch"}}, path, 13)
    out.append((path, {"inputs": {"image": ["batch", 3, 64, 64]}, "ranges": {"batch": [1, 16]}},
                "none"))
    path = os.path.join(work, "resnet18_side.onnx")
    export(resnet, (image,), ["image"], {"image": {2: "side", 3: "side"}}, path, 13)
    out.append((path, {"inputs": {"image": [1, 3, "side", "side"]}, "ranges": {"side": [64, 128]}},
                "strided"))
    out.append((path, {"inputs": {"image": [1, 3, "side", "side"]},
                       "ranges": {"side": [64, 224, 32]}}, "none"))
    return out


def draw(rng, r, floor=None):
    """A random value of range r ([lo, hi] or [lo, hi, step]), at least `floor` where it can."""
    lo, hi, step = r[0], r[1], (r[2] if len(r) > 2 else 1)
    first = lo
    while floor is not None and first < floor and first + step <= hi:
        first += step
    return first + rng.randint(0, (hi - first) // step) * step


def coordinates(entry, point):
    return {s: v // (entry["ranges"][s][2] if len(entry["ranges"][s]) > 2 else 1)
            for s, v in point.items()}


def kiln_json(kiln, model, flag, value, extra=()):
    r = subprocess.run([kiln, "info", model, flag, json.dumps(value), *extra], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"kiln info {model} {flag} failed ({r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout)


def evaluate(poly, point):
    total = 0
    for coeff, symbols in poly:
        term = coeff
        for s in symbols:
            term *= point[s]
        total += term
    return total


def is_symbolic(polys):
    return any(len(p) != 1 or p[0][1] for p in polys)


def evaluate_bytes(polys, point, element_bytes):
    n = element_bytes
    for p in polys:
        n *= evaluate(p, point)
    return n


def check_model(kiln, path, entry, expect, points, rng):
    name = os.path.basename(path)
    ranged = kiln_json(kiln, path, "--ranged", entry)
    fitted, irregular, dynamic = ranged["shapes"], ranged["irregular"], set(ranged["dynamic"])
    failures = []
    if expect == "none" and irregular:
        failures.append(f"irregular values where none were expected: {irregular}")
    if expect == "strided":
        if not irregular:
            failures.append("no irregular value for a ranged spatial size through strided convs")
        if any("dim 2" not in why and "dim 3" not in why for why in irregular.values()):
            failures.append(f"an irregular value off the spatial dims: {irregular}")
    for _ in range(points):
        point = {s: draw(rng, r) for s, r in entry["ranges"].items()}
        at = coordinates(entry, point)
        shapes = {i: [point[d] if isinstance(d, str) else d for d in dims]
                  for i, dims in entry["inputs"].items()}
        concrete = kiln_json(kiln, path, "--shapes-at", shapes)
        values = set(concrete["shapes"]) | set(concrete["dynamic"])
        if values != set(fitted) | set(irregular) | dynamic:
            failures.append(f"at {point}: the value sets differ")
        for value, polys in fitted.items():
            predicted = [evaluate(p, at) for p in polys]
            if concrete["shapes"].get(value) != predicted:
                failures.append(f"at {point}: '{value}' is {concrete['shapes'].get(value)}, "
                                f"the fit says {predicted}")
        # The footprint at the range's maximum bounds every computed value at every point (a
        # symbolic value is computed from the inputs, never bound data).
        sizes = [evaluate_bytes(polys, at, ranged["element_bytes"][value])
                 for value, polys in fitted.items() if is_symbolic(polys)]
        foot = ranged["footprint"]
        if sizes and (max(sizes) > foot["largest_bytes"] or sum(sizes) > foot["total_bytes"]):
            failures.append(f"at {point}: values of {max(sizes)} bytes ({sum(sizes)} in all) "
                            f"exceed the footprint at the maximum {foot}")
    symbolic = sum(is_symbolic(polys) for polys in fitted.values())
    print(f"{name}: {len(fitted)} fitted ({symbolic} symbolic), {len(irregular)} irregular, "
          f"{len(dynamic)} dynamic, {ranged['inferences']} inferences, "
          f"{ranged['footprint']['total_bytes'] / 2**20:.1f} MiB at the maximum; "
          f"{points} random points checked: {'ok' if not failures else 'FAILED'}")
    # Whether the compiler's generated source over the range is one template
    # (compile/ranged_emit.h): reported, and held to its own contract (a template that does not
    # hold says where).
    # Held to the probe points and to `points` random points of the range (from 2 up, where a
    # template is expected).
    extra = [{s: draw(rng, r, floor=2) for s, r in entry["ranges"].items()} for _ in range(points)]
    t = kiln_json(kiln, path, "--ranged", entry,
                  ["--template", "--template-points", json.dumps(extra)])["template"]
    if t["emits"] < 1 or (not t["holds"] and not t["disagreement"]):
        failures.append(f"the template fit says nothing: {t}")
    # Ranged batch and sequence: one template wherever every symbol is at least 2 (1 is the size
    # the compiler treats apart). A ranged spatial size: its strided convolutions' floor
    # divisions are no polynomial, so not.
    if expect == "none" and not t["holds_above_base"]:
        failures.append(f"the generated source is not one template from 2 up: {t['summary']}")
    if expect == "strided" and t["holds_above_base"]:
        failures.append(f"a template over a strided spatial range: {t['summary']}")
    print(f"  generated source: {t['summary']}")
    for f in failures[:10]:
        print("  " + f)
    return not failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--points", type=int, default=20)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    rng = random.Random(20261203)
    ok = True
    for path, entry, expect in models(args.work):
        ok &= check_model(args.kiln, path, entry, expect, args.points, rng)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
