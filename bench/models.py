#!/usr/bin/python3
"""The realistic benchmark set: torch modules of real sizes, exported to ONNX at bench time
(never committed). Run with Debian's /usr/bin/python3 (torch 1.13, torchvision 0.14).

    /usr/bin/python3 bench/models.py export DIR [NAME ...]   # DIR/<name>/model.onnx + bench.json
    /usr/bin/python3 bench/models.py list                    # name and shape classes, one a line

An export that finds DIR/<name>/bench.json (written last) keeps that model: bench/run.sh keys DIR
by a hash of this file and the torch version, so a run re-exports only when either changes.

Models (random weights, fixed seeds, eval mode, opset 17):

  resnet50      torchvision ResNet-50, x=[N,3,224,224], N = 1 and 8
  mobilenetv3   torchvision MobileNetV3-Large, x=[1,3,224,224]
  bert          a BERT-base-like post-LN encoder: 12 layers, d 768, 12 heads, FFN 3072, GELU,
                sequence 128, learned positions; input_ids=[N,128] int64, N = 1 and 8
  unet          a UNet-style denoiser: 128/256 channels, 64x64 latent (4 channels), GroupNorm(32)
                + SiLU residual blocks with a time embedding, self-attention over the 32x32 level
                (1024 tokens, 4 heads of 64), nearest upsampling with a skip concat; N = 1 and 2
  mlp           512-2048-2048-2048-512 with GELU, x=[N,512], N = 8 and 64

Each DIR/<name>/bench.json records the classes and, per class, the multiply-add count of its
convolutions, linear layers and matmuls (counted on a torch forward pass), from which the report
derives achieved GFLOP/s. torch_bench.py rebuilds the same modules from this file (same
seeds, so the same weights as the ONNX export).
"""

import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

OPSET = 17


# ------------------------------------------------------------------------------------------------
# Modules
# ------------------------------------------------------------------------------------------------


class WideMlp(nn.Module):
    def __init__(self):
        super().__init__()
        dims = [512, 2048, 2048, 2048, 512]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.gelu(x)
        return x


class BertLayer(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.reshape(b, s, h, d // h).transpose(1, 2)
        k = k.reshape(b, s, h, d // h).transpose(1, 2)
        v = v.reshape(b, s, h, d // h).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // h)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        ctx = ctx.transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.out(ctx))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class BertEncoder(nn.Module):
    def __init__(self, vocab=8192, d=768, heads=12, ff=3072, layers=12, seq=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(BertLayer(d, heads, ff) for _ in range(layers))

    def forward(self, input_ids):
        x = self.ln(self.embed(input_ids) + self.pos)
        for layer in self.layers:
            x = layer(x)
        return x


class ResBlock(nn.Module):
    def __init__(self, cin, cout, temb):
        super().__init__()
        self.n1 = nn.GroupNorm(32, cin)
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(temb, cout)
        self.n2 = nn.GroupNorm(32, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, t):
        h = self.c1(F.silu(self.n1(x)))
        h = h + self.t(t)[:, :, None, None]
        h = self.c2(F.silu(self.n2(h)))
        return h + (self.skip(x) if self.skip is not None else x)


class AttnBlock(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(32, c)
        self.qkv = nn.Linear(c, 3 * c)
        self.out = nn.Linear(c, c)

    def forward(self, x):
        b, c, hh, ww = x.shape
        h = self.heads
        t = self.norm(x).reshape(b, c, hh * ww).transpose(1, 2)  # [b, hw, c]
        q, k, v = self.qkv(t).split(c, dim=-1)
        q = q.reshape(b, hh * ww, h, c // h).transpose(1, 2)
        k = k.reshape(b, hh * ww, h, c // h).transpose(1, 2)
        v = v.reshape(b, hh * ww, h, c // h).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(c // h))
        a = torch.matmul(torch.softmax(scores, dim=-1), v)
        a = self.out(a.transpose(1, 2).reshape(b, hh * ww, c))
        return x + a.transpose(1, 2).reshape(b, c, hh, ww)


class UNetDenoiser(nn.Module):
    def __init__(self, cin=4, c1=128, c2=256, temb=512):
        super().__init__()
        self.freqs = nn.Parameter(torch.exp(-math.log(10000.0) * torch.arange(64) / 64.0),
                                  requires_grad=False)
        self.t1 = nn.Linear(128, temb)
        self.t2 = nn.Linear(temb, temb)
        self.conv_in = nn.Conv2d(cin, c1, 3, padding=1)
        self.down_block = ResBlock(c1, c1, temb)
        self.down = nn.Conv2d(c1, c2, 3, stride=2, padding=1)
        self.mid1 = ResBlock(c2, c2, temb)
        self.attn = AttnBlock(c2, 4)
        self.mid2 = ResBlock(c2, c2, temb)
        self.up = nn.Conv2d(c2, c1, 3, padding=1)
        self.up_block = ResBlock(2 * c1, c1, temb)
        self.norm_out = nn.GroupNorm(32, c1)
        self.conv_out = nn.Conv2d(c1, cin, 3, padding=1)

    def forward(self, latent, timestep):
        e = timestep[:, None] * self.freqs[None, :]
        t = self.t2(F.silu(self.t1(torch.cat([torch.sin(e), torch.cos(e)], dim=1))))
        h0 = self.down_block(self.conv_in(latent), t)
        h = self.mid2(self.attn(self.mid1(self.down(h0), t)), t)
        h = self.up(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        h = self.up_block(torch.cat([h, h0], dim=1), t)
        return self.conv_out(F.silu(self.norm_out(h)))


def _resnet50():
    import torchvision
    return torchvision.models.resnet50(weights=None)


def _mobilenetv3():
    import torchvision
    return torchvision.models.mobilenet_v3_large(weights=None)


# name -> (seed, constructor, [(input name, dtype), ...], output names, classes)
# A class is {input: dims}; the first dim is the batch. "attention": the model has attention
# (the report checks its activation memory); "compute_bound": classes whose time should be
# GEMM/convolution throughput (the report compares their GFLOP/s with the SGEMM peak).
SPECS = [
    {"name": "resnet50", "seed": 50, "make": _resnet50, "inputs": [("x", "float32")],
     "outputs": ["logits"], "classes": [{"x": [1, 3, 224, 224]}, {"x": [8, 3, 224, 224]}],
     "compute_bound": [{"x": [8, 3, 224, 224]}]},
    {"name": "mobilenetv3", "seed": 3, "make": _mobilenetv3, "inputs": [("x", "float32")],
     "outputs": ["logits"], "classes": [{"x": [1, 3, 224, 224]}]},
    {"name": "bert", "seed": 768, "make": BertEncoder, "inputs": [("input_ids", "int64")],
     "outputs": ["hidden"], "classes": [{"input_ids": [1, 128]}, {"input_ids": [8, 128]}],
     "attention": True, "compute_bound": [{"input_ids": [8, 128]}]},
    {"name": "unet", "seed": 64, "make": UNetDenoiser,
     "inputs": [("latent", "float32"), ("timestep", "float32")], "outputs": ["noise"],
     "classes": [{"latent": [1, 4, 64, 64], "timestep": [1]},
                 {"latent": [2, 4, 64, 64], "timestep": [2]}],
     "attention": True, "compute_bound": [{"latent": [1, 4, 64, 64], "timestep": [1]},
                                          {"latent": [2, 4, 64, 64], "timestep": [2]}]},
    {"name": "mlp", "seed": 512, "make": WideMlp, "inputs": [("x", "float32")],
     "outputs": ["y"], "classes": [{"x": [8, 512]}, {"x": [64, 512]}]},
]


def spec_by_name(name):
    for s in SPECS:
        if s["name"] == name:
            return s
    raise KeyError("no benchmark model %r (bench/models.py)" % name)


def build(name):
    """The module, with its seeded random weights, in eval mode."""
    spec = spec_by_name(name)
    torch.manual_seed(spec["seed"])
    model = spec["make"]()
    # Non-trivial normalization statistics, so folded BatchNorms and GroupNorm affines are not
    # identities.
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)):
            if getattr(m, "weight", None) is not None:
                m.weight.data = 1.0 + 0.1 * torch.randn(m.weight.shape, generator=g)
                m.bias.data = 0.1 * torch.randn(m.bias.shape, generator=g)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean = 0.1 * torch.randn(m.running_mean.shape, generator=g)
                m.running_var = 1.0 + 0.1 * torch.rand(m.running_var.shape, generator=g)
    return spec, model.eval()


def class_spec(cls):
    return ";".join("%s=[%s]" % (n, ",".join(str(d) for d in dims)) for n, dims in cls.items())


def example_inputs(spec, cls):
    out = []
    for name, dtype in spec["inputs"]:
        dims = cls[name]
        if dtype == "int64":
            out.append(torch.randint(0, 512, dims, dtype=torch.int64))
        else:
            out.append(torch.rand(dims) * 2 - 1)
    return tuple(out)


# ------------------------------------------------------------------------------------------------
# Multiply-adds of the compute ops, counted in torch on one forward pass
# ------------------------------------------------------------------------------------------------


def count_macs(model, inputs):
    """Multiply-adds of every convolution, linear layer and matmul in one forward pass."""
    total = [0]

    def conv_hook(m, args, out):
        total[0] += out.numel() * (m.in_channels // m.groups) * math.prod(m.kernel_size)

    def linear_hook(m, args, out):
        total[0] += out.numel() * m.in_features

    hooks = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            hooks.append(m.register_forward_hook(linear_hook))
    real_matmul = torch.matmul

    def matmul(a, b):
        out = real_matmul(a, b)
        total[0] += out.numel() * a.shape[-1]
        return out

    torch.matmul = matmul
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        torch.matmul = real_matmul
        for h in hooks:
            h.remove()
    return total[0]


def export(out_dir, names=None):
    os.makedirs(out_dir, exist_ok=True)
    for spec in SPECS:
        if names and spec["name"] not in names:
            continue
        d = os.path.join(out_dir, spec["name"])
        if os.path.exists(os.path.join(d, "bench.json")):  # written last: the export is whole
            continue
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "model.onnx")
        _, model = build(spec["name"])
        cls0 = spec["classes"][0]
        inputs = example_inputs(spec, cls0)
        in_names = [n for n, _ in spec["inputs"]]
        # The batch axis is dynamic, so one file serves every class of the model.
        axes = {n: {0: "batch"} for n in in_names}
        axes.update({n: {0: "batch"} for n in spec["outputs"]})
        with torch.no_grad():
            torch.onnx.export(model, inputs, path, opset_version=OPSET, input_names=in_names,
                              output_names=spec["outputs"], dynamic_axes=axes,
                              do_constant_folding=True)
        meta = {"name": spec["name"], "opset": OPSET, "source": "bench/models.py",
                "torch": torch.__version__, "attention": spec.get("attention", False),
                "inputs": [n for n, _ in spec["inputs"]], "classes": []}
        for cls in spec["classes"]:
            meta["classes"].append({"class": class_spec(cls),
                                    "macs": count_macs(model, example_inputs(spec, cls)),
                                    "compute_bound": cls in spec.get("compute_bound", [])})
        with open(os.path.join(d, "bench.json"), "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
        sys.stderr.write("models.py: %s: %s\n" % (spec["name"], ", ".join(
            "%s %.2f GMAC" % (c["class"], c["macs"] / 1e9) for c in meta["classes"])))


def main(argv):
    if len(argv) >= 3 and argv[1] == "export":
        export(argv[2], set(argv[3:]) or None)
        return 0
    if len(argv) == 2 and argv[1] == "list":
        for spec in SPECS:
            for cls in spec["classes"]:
                print("%s %s" % (spec["name"], class_spec(cls)))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
