#!/usr/bin/python3
"""Regenerate the small real-world-shape fixtures under tests/data/legacy/.

Run with Debian's Python (it has torch, onnx and numpy):

    /usr/bin/python3 tools/make_legacy_models.py

Each fixture is a tiny torch module exported by torch.onnx.export at a legacy
opset, so the graph holds the forms exporters wrote before attributes became
inputs: Slice/Pad/Split/Squeeze/Unsqueeze/ReduceSum attributes at opset 9 and
11, Upsample at opset 9 (Resize at 11), an If on an input-dependent condition
and a for-loop (a Loop with a scan output) from torch.jit.script, and a graph
whose weights all live in Constant nodes.
For every fixture this writes, under tests/data/legacy/<name>/:
  model.onnx          the exported graph
  inputs/<name>.npy   fixed-seed inputs (one file per graph input)
  outputs/<name>.npy  reference outputs computed by the torch module
  (outputs/*.npy for an If fixture: one set per branch, inputs_<k>/outputs_<k>)

tests/eager/legacy_models_test.cc imports and runs every fixture and compares.
The script is deterministic: running it twice gives identical outputs.
"""

import io
import os
import shutil

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "legacy")


class Legacy(nn.Module):
    """Slice, Pad, Split, Squeeze/Unsqueeze, ReduceSum/ReduceMean, Upsample/Resize, Conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        h = self.conv(x)                                  # [1,4,6,6]
        a, b = torch.split(h, [1, 3], dim=1)              # Split (split attr <13)
        s = h[:, 1:3, 1:5, 2:]                            # Slice (attrs at 9, inputs at 11)
        p = F.pad(s, (1, 0, 0, 2), mode="constant", value=0.5)  # Pad (pads attr at 9)
        r = p.sum(dim=2, keepdim=True)                    # ReduceSum (axes attr <13)
        m = b.mean(dim=(2, 3))                            # ReduceMean
        q = a.squeeze(1).unsqueeze(0)                     # Squeeze/Unsqueeze (axes attr <13)
        u = F.interpolate(a, scale_factor=2.0, mode="nearest")  # Upsample-9 / Resize-11
        return r, m, q, u


class Gate(torch.nn.Module):
    """An If on an input-dependent condition (needs torch.jit.script)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if bool(x.sum() > 0):
            z = torch.relu(y) * 2.0
        else:
            z = y - x
        return z


class Recurrence(nn.Module):
    """A scripted for-loop (exported as Loop with a scan output): h = tanh(W x_t + b + h)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(3, 3)

    def forward(self, x):
        h = torch.zeros(x.size(1), 3)
        outs = []
        for t in range(x.size(0)):
            h = torch.tanh(self.cell(x[t]) + h)
            outs.append(h)
        return h, torch.stack(outs)


class ConstWeights(nn.Module):
    """A small MLP whose exported weights are moved into Constant nodes afterwards."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(6, 8)
        self.l2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))


def export(module, args, opset, input_names, output_names, script=False):
    buf = io.BytesIO()
    m = torch.jit.script(module) if script else module
    torch.onnx.export(m, args, buf, opset_version=opset, input_names=input_names,
                      output_names=output_names, do_constant_folding=True)
    return onnx.load_from_string(buf.getvalue())


def initializers_to_constants(model):
    g = model.graph
    consts = []
    for init in g.initializer:
        consts.append(helper.make_node("Constant", [], [init.name], value=init))
    del g.initializer[:]
    names = {n.output[0] for n in consts}
    keep = [i for i in g.input if i.name not in names]
    del g.input[:]
    g.input.extend(keep)
    nodes = consts + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    return model


def write(name, model, sets):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(d, "model.onnx"))
    for k, (inputs, outputs) in enumerate(sets):
        suffix = "" if len(sets) == 1 else "_%d" % k
        os.makedirs(os.path.join(d, "inputs" + suffix))
        os.makedirs(os.path.join(d, "outputs" + suffix))
        for n, v in inputs.items():
            np.save(os.path.join(d, "inputs" + suffix, n + ".npy"), v)
        for n, v in outputs.items():
            np.save(os.path.join(d, "outputs" + suffix, n + ".npy"), v)


def main():
    torch.manual_seed(7)
    torch.set_num_threads(1)
    legacy = Legacy().eval()
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        ref = [t.numpy() for t in legacy(x)]
    outs = ["r", "m", "q", "u"]
    for opset in (9, 11):
        model = export(legacy, (x,), opset, ["x"], outs)
        write("legacy_opset%d" % opset, model, [({"x": x.numpy()}, dict(zip(outs, ref)))])

    gate = Gate().eval()
    sets = []
    for sign in (1.0, -1.0):
        xi = torch.rand(2, 4) * sign
        with torch.no_grad():
            sets.append(({"x": xi.numpy()}, {"z": gate(xi).numpy()}))
    model = export(gate, (torch.rand(2, 4),), 11, ["x"], ["z"], script=True)
    assert any(n.op_type == "If" for n in model.graph.node), "expected an If"
    write("if_opset11", model, sets)

    rec = Recurrence().eval()
    xr = torch.randn(5, 2, 3)
    with torch.no_grad():
        hr, hsr = rec(xr)
    model = export(rec, (xr,), 11, ["x"], ["h", "hs"], script=True)
    assert any(n.op_type == "Loop" for n in model.graph.node), "expected a Loop"
    write("loop_opset11", model, [({"x": xr.numpy()}, {"h": hr.numpy(), "hs": hsr.numpy()})])

    cw = ConstWeights().eval()
    xc = torch.randn(2, 6)
    with torch.no_grad():
        yc = cw(xc).numpy()
    model = initializers_to_constants(export(cw, (xc,), 11, ["x"], ["y"]))
    write("constant_weights_opset11", model, [({"x": xc.numpy()}, {"y": yc})])


if __name__ == "__main__":
    main()
