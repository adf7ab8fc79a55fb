#!/usr/bin/python3
"""Regenerate kiln's committed example models under examples/.

Run with Debian's Python (it has torch, onnx and numpy):

    /usr/bin/python3 tools/make_examples.py

For every example this writes, under examples/<name>/:
  model.onnx               torch.onnx.export, opset 17, constant folding on
  checkpoint.safetensors   every float initializer of model.onnx (keyed by
                           initializer name) plus every float Constant node's
                           value (keyed by the Constant's output name)
  inputs/<name>.npy        fixed-seed inputs
  outputs/<name>.npy       reference outputs computed by the torch module
  README.md                architecture, shapes, ONNX op types, sizes

The script is deterministic: running it twice gives byte-identical files.
"""

import collections
import hashlib
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import onnx
from onnx import numpy_helper

OPSET = 17
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")

# The op types kiln's eager runtime implements; every exported graph must stay
# within this set.
ALLOWED_OPS = set("""
Add Sub Mul Div Pow Sqrt Exp Log Neg Abs Reciprocal Relu LeakyRelu Sigmoid Tanh
Erf HardSigmoid HardSwish Clip Sin Cos Softmax MatMul Gemm Conv MaxPool
AveragePool GlobalAveragePool BatchNormalization InstanceNormalization
LayerNormalization Reshape Transpose Concat Split Slice Gather Squeeze Unsqueeze
Flatten Expand Pad Resize Shape Constant ConstantOfShape Identity Cast Where
Equal ReduceMean ReduceSum Dropout Range Tile Less Greater Not Min Max
""".split())


def set_determinism(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        return self.fc3(x)


class ResBlock(nn.Module):
    def __init__(self, cin, cout, emb_dim, groups=8):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.emb_proj = nn.Linear(emb_dim, cout)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, emb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb_proj(emb)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        s = x if self.skip is None else self.skip(x)
        return s + h


class SelfAttention2d(nn.Module):
    def __init__(self, ch, heads=2, groups=8):
        super().__init__()
        assert ch % heads == 0
        self.heads = heads
        self.head_dim = ch // heads  # a Python int: the scale stays a literal
        self.norm = nn.GroupNorm(groups, ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.proj = nn.Conv2d(ch, ch, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        d = self.head_dim
        qkv = self.qkv(self.norm(x))                       # [b, 3c, h, w]
        qkv = qkv.reshape(b, 3, self.heads, d, h * w)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]          # [b, heads, d, hw]
        q = q.transpose(-1, -2)                            # [b, heads, hw, d]
        attn = torch.matmul(q, k) * (1.0 / math.sqrt(d))   # [b, heads, hw, hw]
        attn = torch.softmax(attn, dim=-1)
        out = torch.matmul(attn, v.transpose(-1, -2))      # [b, heads, hw, d]
        out = out.transpose(-1, -2).reshape(b, c, h, w)
        return x + self.proj(out)


class MicroDiffusion(nn.Module):
    """A tiny UNet-style noise predictor (64x64x4 latent)."""

    def __init__(self, tdim=64, cond_dim=64, emb_dim=128):
        super().__init__()
        half = tdim // 2
        freqs = torch.exp(-math.log(10000.0) *
                          torch.arange(half, dtype=torch.float32) / half)
        # A buffer, so the frequencies are an initializer (no Range at runtime).
        self.register_buffer("freqs", freqs)
        self.emb_mlp = nn.Sequential(
            nn.Linear(tdim + cond_dim, emb_dim), nn.SiLU(),
            nn.Linear(emb_dim, emb_dim))
        self.conv_in = nn.Conv2d(4, 32, 3, padding=1)
        self.res1 = ResBlock(32, 32, emb_dim)
        self.down = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.res2 = ResBlock(64, 64, emb_dim)
        self.attn = SelfAttention2d(64, heads=2)
        self.up_conv = nn.Conv2d(64, 64, 3, padding=1)
        self.res3 = ResBlock(96, 32, emb_dim)
        self.norm_out = nn.GroupNorm(8, 32)
        self.conv_out = nn.Conv2d(32, 4, 3, padding=1)

    def forward(self, latent, timestep, cond):
        # [1, 1] * [32] -> [1, 32]; freqs is used as-is so the initializer
        # keeps its name "freqs" (no folded Unsqueeze renaming it).
        args = timestep[:, None] * self.freqs
        temb = torch.cat([torch.sin(args), torch.cos(args)], dim=1)
        emb = self.emb_mlp(torch.cat([temb, cond], dim=1))    # [1, 128]

        h = self.conv_in(latent)                              # [1,32,64,64]
        skip = self.res1(h, emb)                              # [1,32,64,64]
        h = self.down(skip)                                   # [1,64,32,32]
        h = self.res2(h, emb)
        h = self.attn(h)
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")  # [1,64,64,64]
        h = self.up_conv(h)
        h = torch.cat([h, skip], dim=1)                       # [1,96,64,64]
        h = self.res3(h, emb)                                 # [1,32,64,64]
        return self.conv_out(F.silu(self.norm_out(h)))        # [1,4,64,64]


class EncoderLayer(nn.Module):
    def __init__(self, d_model, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.ln1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, d_ff)
        self.ff2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        b, t, c = x.shape
        d = self.head_dim
        h = self.ln1(x)
        q = self.q(h).reshape(b, t, self.heads, d).transpose(1, 2)  # [b,H,t,d]
        k = self.k(h).reshape(b, t, self.heads, d).transpose(1, 2)
        v = self.v(h).reshape(b, t, self.heads, d).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, c)
        x = x + self.o(y)
        x = x + self.ff2(F.gelu(self.ff1(self.ln2(x))))
        return x


class Transformer(nn.Module):
    def __init__(self, vocab=512, seq=32, d_model=128, heads=4, d_ff=512,
                 layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        # Learned positions as a parameter: no data-dependent Range.
        self.pos = nn.Parameter(torch.randn(1, seq, d_model) * 0.02)
        self.layers = nn.ModuleList(
            [EncoderLayer(d_model, heads, d_ff) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, input_ids):
        x = self.tok(input_ids) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.ln_f(x)


def randomize_norms(module, gen):
    """Give norm layers non-trivial affine params, so the tests see them."""
    for m in module.modules():
        if isinstance(m, (nn.GroupNorm, nn.LayerNorm)):
            with torch.no_grad():
                m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape,
                                                       generator=gen))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))


# --------------------------------------------------------------------------
# Safetensors
# --------------------------------------------------------------------------


def write_safetensors(path, tensors):
    """tensors: dict name -> float32 ndarray. Keys sorted, data in that order."""
    header = {}
    chunks = []
    off = 0
    for name in sorted(tensors):
        # np.asarray, not np.ascontiguousarray: the latter turns 0-d into 1-d.
        a = np.asarray(tensors[name], dtype="<f4")
        raw = a.tobytes(order="C")
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    hjson = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode())
    base = 8 + n
    out = {}
    end_max = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        end_max = max(end_max, e)
        a = np.frombuffer(data[base + b:base + e], dtype="<f4")
        out[name] = a.reshape(tuple(info["shape"]))
    assert base + end_max == len(data), "trailing bytes in safetensors file"
    return out


# --------------------------------------------------------------------------
# ONNX helpers
# --------------------------------------------------------------------------


# Float inputs that determine a shape by value: kiln treats a float constant feeding one of these
# as structural (part of the graph), not as a weight, so checkpoints leave them out.
SHAPE_INPUTS = {"Resize": (1, 2), "Upsample": (1,), "Range": (0, 1, 2)}


def structural_float_names(model):
    names = set()
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if i in SHAPE_INPUTS.get(node.op_type, ()):
                names.add(name)
    return names


def float_tensors_of(model):
    """Float initializers (by name) + float Constant node values (by output), minus the float
    constants that determine a shape (Resize scales etc.), which are structural."""
    structural = structural_float_names(model)
    out = {}
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT:
            out[init.name] = numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type != "Constant":
            continue
        for attr in node.attribute:
            val = None
            if attr.name == "value" and attr.t.data_type == onnx.TensorProto.FLOAT:
                val = numpy_helper.to_array(attr.t)
            elif attr.name == "value_float":
                val = np.array(attr.f, dtype=np.float32)
            elif attr.name == "value_floats":
                val = np.array(list(attr.floats), dtype=np.float32)
            if val is not None:
                name = node.output[0]
                assert name not in out, "name clash: %s" % name
                out[name] = val
    return {k: v for k, v in out.items() if k not in structural}


def op_counts(model):
    return collections.Counter(n.op_type for n in model.graph.node)


def value_info_str(vi):
    t = vi.type.tensor_type
    dims = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
    return "%s %s %s" % (vi.name, onnx.TensorProto.DataType.Name(t.elem_type)
                         .lower(), dims)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def human(n):
    if n >= 1 << 20:
        return "%.2f MiB" % (n / float(1 << 20))
    if n >= 1 << 10:
        return "%.1f KiB" % (n / 1024.0)
    return "%d B" % n


# --------------------------------------------------------------------------
# Export driver
# --------------------------------------------------------------------------


def build_example(spec):
    name = spec["name"]
    out_dir = os.path.join(EXAMPLES, name)
    os.makedirs(os.path.join(out_dir, "inputs"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "outputs"), exist_ok=True)

    set_determinism(spec["seed"])
    model = spec["make"]()
    gen = torch.Generator().manual_seed(spec["seed"] + 1000)
    randomize_norms(model, gen)
    model.eval()

    rng = np.random.RandomState(spec["seed"] + 2000)
    inputs = spec["inputs"](rng)                     # OrderedDict name -> ndarray
    in_names = list(inputs)
    out_names = spec["outputs"]
    torch_in = tuple(torch.from_numpy(a) for a in inputs.values())

    with torch.no_grad():
        ref = model(*torch_in)
    if isinstance(ref, torch.Tensor):
        ref = (ref,)
    refs = collections.OrderedDict(
        (n, r.detach().numpy().astype(np.float32)) for n, r in zip(out_names, ref))

    onnx_path = os.path.join(out_dir, "model.onnx")
    with torch.no_grad():
        torch.onnx.export(
            model, torch_in, onnx_path,
            export_params=True, opset_version=OPSET, do_constant_folding=True,
            input_names=in_names, output_names=out_names,
            dynamic_axes=spec.get("dynamic_axes"),
            training=torch.onnx.TrainingMode.EVAL)

    m = onnx.load(onnx_path)
    onnx.checker.check_model(m, full_check=True)
    counts = op_counts(m)
    bad = sorted(set(counts) - ALLOWED_OPS)
    if bad:
        raise SystemExit("%s: ops outside kiln's set: %s" % (name, bad))

    tensors = float_tensors_of(m)
    ckpt_path = os.path.join(out_dir, "checkpoint.safetensors")
    write_safetensors(ckpt_path, tensors)
    back = read_safetensors(ckpt_path)
    assert sorted(back) == sorted(tensors)
    for k, v in tensors.items():
        assert back[k].shape == v.shape and back[k].dtype == np.float32, k
        assert np.array_equal(back[k], v), k

    for n, a in inputs.items():
        np.save(os.path.join(out_dir, "inputs", n + ".npy"), a)
    for n, a in refs.items():
        np.save(os.path.join(out_dir, "outputs", n + ".npy"), a)

    n_params = sum(p.numel() for p in model.parameters())
    n_inits = len(m.graph.initializer)
    n_float_inits = sum(1 for i in m.graph.initializer
                        if i.data_type == onnx.TensorProto.FLOAT)
    n_consts = counts.get("Constant", 0)
    info = {
        "name": name, "dir": out_dir, "counts": counts,
        "inputs": [value_info_str(v) for v in m.graph.input],
        "outputs": [value_info_str(v) for v in m.graph.output],
        "n_params": n_params, "n_inits": n_inits,
        "n_float_inits": n_float_inits, "n_consts": n_consts,
        "n_ckpt": len(tensors),
        "ckpt_floats": int(sum(v.size for v in tensors.values())),
    }
    write_readme(spec, info, inputs, refs)
    return info


def write_readme(spec, info, inputs, refs):
    d = info["dir"]
    files = []
    for root, _, fnames in os.walk(d):
        for f in fnames:
            p = os.path.join(root, f)
            if f == "README.md":
                continue
            files.append((os.path.relpath(p, d), os.path.getsize(p)))
    files.sort()
    lines = ["# %s" % info["name"], "", spec["doc"].strip(), "",
             "Generated by `/usr/bin/python3 tools/make_examples.py` "
             "(torch %s, onnx %s, opset %d). Do not edit by hand."
             % (torch.__version__.split("+")[0], onnx.__version__, OPSET), "",
             "## Graph inputs and outputs", ""]
    for s in info["inputs"]:
        lines.append("- input  `%s`" % s)
    for s in info["outputs"]:
        lines.append("- output `%s`" % s)
    lines += ["", "Reference data (`inputs/`, `outputs/`; outputs computed by the "
              "torch module itself, float32):", ""]
    for n, a in list(inputs.items()) + list(refs.items()):
        sub = "inputs" if n in inputs else "outputs"
        lines.append("- `%s/%s.npy` %s %s" % (sub, n, a.dtype, list(a.shape)))
    lines += ["", "## ONNX op types (%d nodes)" % sum(info["counts"].values()),
              "", "| op | count |", "|---|---|"]
    for op, c in sorted(info["counts"].items()):
        lines.append("| %s | %d |" % (op, c))
    lines += ["", "## Sizes", "",
              "- torch parameters: %d (%s fp32)" % (info["n_params"],
                                                    human(4 * info["n_params"])),
              "- ONNX initializers: %d (%d float), Constant nodes: %d"
              % (info["n_inits"], info["n_float_inits"], info["n_consts"]),
              "- checkpoint.safetensors: %d tensors, %d floats (float "
              "initializers keyed by initializer name + float Constant values "
              "keyed by the Constant's output name)"
              % (info["n_ckpt"], info["ckpt_floats"]),
              "- initializer names are the exporter's: parameters used as-is "
              "keep their torch name (`fc1.weight`), ones the exporter "
              "constant-folded (a transposed Linear weight before MatMul, an "
              "unsqueezed GroupNorm scale) get generated names such as "
              "`onnx::MatMul_202`",
              "", "| file | bytes |", "|---|---|"]
    for f, s in files:
        lines.append("| %s | %d |" % (f, s))
    lines.append("")
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("\n".join(lines))


def mlp_inputs(rng):
    return collections.OrderedDict(
        x=rng.standard_normal((4, 64)).astype(np.float32))


def diffusion_inputs(rng):
    return collections.OrderedDict([
        ("latent", rng.standard_normal((1, 4, 64, 64)).astype(np.float32)),
        ("timestep", np.array([417.0], dtype=np.float32)),
        ("cond", rng.standard_normal((1, 64)).astype(np.float32)),
    ])


def transformer_inputs(rng):
    return collections.OrderedDict(
        input_ids=rng.randint(0, 512, size=(1, 32)).astype(np.int64))


SPECS = [
    dict(name="mlp", seed=1, make=MLP, inputs=mlp_inputs, outputs=["logits"],
         dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
         doc="""
A three-layer perceptron: `x [batch, 64]` -> Linear 64->256 -> ReLU ->
Linear 256->256 -> GELU (exact, erf form) -> Linear 256->10 -> `logits
[batch, 10]`. The batch dimension is a dynamic axis named `batch`; the
reference data uses batch = 4.
"""),
    dict(name="micro-diffusion", seed=2, make=MicroDiffusion,
         inputs=diffusion_inputs, outputs=["noise_pred"],
         doc="""
A tiny UNet-style noise predictor for a 4x64x64 latent.

- Timestep embedding inside the graph: `timestep [1] * freqs [32]` (freqs is a
  registered buffer, so an initializer; no Range at runtime) -> concat(sin,
  cos) -> 64-d, concatenated with `cond [1, 64]` -> Linear 128->128, SiLU,
  Linear 128->128 = `emb`.
- conv_in 4->32 (3x3) at 64x64.
- ResBlock(32): GroupNorm(8) + SiLU + Conv3x3 + Linear(emb) added per channel
  + GroupNorm(8) + SiLU + Conv3x3 + residual. Its output is the skip.
- Downsample: Conv3x3 stride 2, 32->64, to 32x32.
- ResBlock(64), then self-attention at 32x32 (GroupNorm, 1x1 conv qkv, 2 heads
  of d=32, softmax(q k^T / sqrt(d)) v, 1x1 proj, residual).
- Upsample: nearest x2 (Resize) + Conv3x3 64->64, concat skip -> 96 channels.
- ResBlock(96->32) (1x1 conv on the residual path).
- GroupNorm(8) + SiLU + conv_out 32->4 -> `noise_pred [1, 4, 64, 64]`.

GroupNorm exports as Reshape + InstanceNormalization + Reshape + Mul + Add;
SiLU exports as Sigmoid + Mul. The norm layers' affine parameters are
randomized (not 1/0) so the tests exercise them.
"""),
    dict(name="transformer", seed=3, make=Transformer,
         inputs=transformer_inputs, outputs=["hidden"],
         doc="""
A small pre-LN transformer encoder: `input_ids [1, 32] int64` (vocab 512) ->
token embedding (Gather) + learned positional embedding (a parameter, so no
Range) -> 2 x [LayerNorm -> 4-head self-attention (d_model 128, head dim 32,
written by hand: matmul, scale, softmax, matmul) -> residual -> LayerNorm ->
FFN 128->512, GELU (erf form), 512->128 -> residual] -> final LayerNorm ->
`hidden [1, 32, 128]`. The LayerNorms' affine parameters are randomized.
"""),
]


def main():
    if not os.path.isdir(EXAMPLES):
        os.makedirs(EXAMPLES)
    infos = []
    for spec in SPECS:
        infos.append(build_example(spec))
    total = 0
    for info in infos:
        print("== %s" % info["name"])
        for s in info["inputs"]:
            print("   input  %s" % s)
        for s in info["outputs"]:
            print("   output %s" % s)
        print("   ops: %s" % ", ".join(
            "%s x%d" % kv for kv in sorted(info["counts"].items())))
        for root, _, fnames in os.walk(info["dir"]):
            for f in sorted(fnames):
                p = os.path.join(root, f)
                size = os.path.getsize(p)
                total += size
                print("   %8d  %s  %s" % (size, sha256(p)[:16],
                                          os.path.relpath(p, ROOT)))
    print("total: %d bytes (%s)" % (total, human(total)))


if __name__ == "__main__":
    main()
