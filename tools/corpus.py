#!/usr/bin/python3
"""kiln's real-model corpus: published architectures, made at test time, minted and served.

Run with Debian's Python (python3-torch, python3-torchvision, python3-onnx, python3-numpy):

    /usr/bin/python3 tools/corpus.py --kiln build/kiln --work /tmp/corpus [--fast] \
        [--only NAME[,NAME...]] [--report docs/models.md] [--jobs N]

What it does, per model and per opset (9, 11, 13, 17, where torch's exporter supports them):
  1. builds the architecture twice with random initialisation (seeds 1 and 2; no download),
     BatchNorm running statistics calibrated on random batches so they are realistic (not 0/1),
     and exports both to ONNX. Some exports keep BatchNormalization unfused
     (do_constant_folding=False), as published models often do.
  2. writes a sample input set (.npy), the torch outputs of both initialisations, the second
     initialisation's weights as a safetensors checkpoint (keyed like kiln binds weights), and a
     kiln.toml declaring the sample as the target's `samples`.
  3. runs the kiln command line as a user would:
       kiln key  (both initialisations: the key must be the same)
       kiln mint (gate HEALTHY, fence proven: the mint refuses otherwise)
       kiln run           -> eager outputs, compared with torch
       kiln run --compile -> compiled outputs (the minted cell, from the local store)
       kiln run --compile --checkpoint second.safetensors -> the same cell re-bound to the
                             second initialisation, compared with torch's outputs for it
       kiln bench         -> eager and compiled latency
  4. prints one line per (model, opset) and, with --report, writes docs/models.md.

A model passes when every step above holds; outputs match torch when their relative L2 error is
below 1e-3 (fp32, summation order differs). Exit status 1 when any model fails. Nothing is
downloaded and nothing large is committed: everything is written under --work.
"""

import argparse
import concurrent.futures
import hashlib
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import warnings

try:
    import numpy as np
    import onnx
    import torch
    import torchvision  # noqa: F401 (the vision architectures)
except ImportError as e:
    sys.exit(f"corpus.py: {e}; install the test packages with `bash tools/deps.sh --tests` and "
             "run with Debian's /usr/bin/python3")
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL_L2 = 1e-3
EXPORT_VERSION = 2

# --------------------------------------------------------------------------------------------
# Text and audio models, built with torch.


class Block(nn.Module):
    """A pre-norm transformer block with explicit attention (exports at every opset)."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, bias):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q = q.reshape(b, t, h, d // h).transpose(1, 2)
        k = k.reshape(b, t, h, d // h).transpose(1, 2)
        v = v.reshape(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // h) + bias
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class BertEncoder(nn.Module):
    """BERT-style encoder: token + position embeddings, padding mask, pooled output."""

    def __init__(self, vocab=1000, d=128, layers=2, heads=4, max_len=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.pool = nn.Linear(d, d)

    def forward(self, input_ids, attention_mask):
        t = input_ids.shape[1]
        pos = torch.arange(t, device=input_ids.device).unsqueeze(0)
        x = self.tok(input_ids) + self.pos(pos)
        # Padding positions get -1e4 before the softmax, as BERT does.
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for blk in self.blocks:
            x = blk(x, bias)
        x = self.ln(x)
        return x, torch.tanh(self.pool(x[:, 0]))


class GptDecoder(nn.Module):
    """GPT-style decoder: causal mask from the sequence length, tied embedding head."""

    def __init__(self, vocab=1000, d=128, layers=2, heads=4, max_len=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.register_buffer("causal", torch.triu(torch.ones(max_len, max_len), 1) * -1e9)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        pos = torch.arange(t, device=input_ids.device).unsqueeze(0)
        x = self.tok(input_ids) + self.pos(pos)
        bias = self.causal[:t, :t]
        for blk in self.blocks:
            x = blk(x, bias)
        return self.ln(x) @ self.tok.weight.t()


class Tagger(nn.Module):
    """A sequence tagger: embedding, bidirectional LSTM, GRU, per-token classifier."""

    def __init__(self, vocab=500, emb=64, hidden=64, tags=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, tags)

    def forward(self, tokens):
        h, _ = self.lstm(self.emb(tokens))
        h, _ = self.gru(h)
        return self.out(h).log_softmax(-1)


class AudioConv(nn.Module):
    """A Conv1d keyword classifier over a raw waveform (BatchNorm, ReLU, pooling)."""

    def __init__(self, classes=10):
        super().__init__()
        chans = [1, 32, 32, 64, 64]
        layers = []
        for i in range(4):
            layers += [
                nn.Conv1d(chans[i], chans[i + 1], 9 if i else 80, stride=4 if i == 0 else 1,
                          padding=0 if i == 0 else 4),
                nn.BatchNorm1d(chans[i + 1]),
                nn.ReLU(),
                nn.MaxPool1d(4),
            ]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(64, classes)

    def forward(self, wave):
        h = self.features(wave)
        return self.head(h.mean(-1)).log_softmax(-1)


class ControlFlow(nn.Module):
    """Scripted, with data-dependent control flow: an If on the input's values, a Loop whose
    trip count is an input, and an If on the input's length whose branches hold a Conv1d and an
    LSTM stack (as voice-activity models choose a front end by sample rate)."""

    def __init__(self):
        super().__init__()
        self.front_long = nn.Conv1d(1, 16, 8, stride=8)
        self.front_short = nn.Conv1d(1, 16, 4, stride=4)
        self.lstm = nn.LSTM(16, 32, batch_first=False)
        self.step = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x, steps):
        # x: [1, 1, T]; steps: int64 [] (loop trip count)
        if x.shape[-1] >= 512:
            h = self.front_long(x)
        else:
            h = self.front_short(x)
        h = h.permute(2, 0, 1)  # [T', 1, 16]
        out, state = self.lstm(h)
        y = out[-1]
        if bool(y.sum() > 0):
            y = torch.relu(y)
        else:
            y = -y
        for i in range(int(steps)):
            y = torch.tanh(self.step(y))
        return self.head(y)


class OcrLike(nn.Module):
    """An OCR-style CNN: Conv/BatchNorm/ReLU stages, a squeeze-excitation gate with HardSigmoid,
    a ConvTranspose2d and a nearest Resize (Upsample at opset 9) back up, a per-pixel head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32),
                                  nn.ReLU())
        self.se_fc1 = nn.Conv2d(32, 8, 1)
        self.se_fc2 = nn.Conv2d(8, 32, 1)
        self.body = nn.Sequential(nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32),
                                  nn.ReLU())
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.head = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        h = self.stem(x)
        s = F.hardsigmoid(self.se_fc2(F.relu(self.se_fc1(h.mean((2, 3), keepdim=True)))))
        h = self.body(h * s)
        h = self.up(h)
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        return self.head(h).sigmoid()


class VadBranch(nn.Module):
    """One sample rate's front end and recurrent stack: a strided Conv1d filterbank, a Conv1d
    encoder, an LSTM over time carrying (h, c), a Conv1d decoder."""

    def __init__(self, window):
        super().__init__()
        self.stft = nn.Conv1d(1, 64, window, stride=window // 2)
        self.encoder = nn.Sequential(nn.Conv1d(32, 64, 3, padding=1), nn.ReLU(),
                                     nn.Conv1d(64, 64, 3, stride=2, padding=1), nn.ReLU())
        self.lstm = nn.LSTM(64, 64)
        self.decoder = nn.Conv1d(64, 1, 1)

    def forward(self, x, h, c):
        spec = self.stft(x.unsqueeze(1))
        real, imag = spec[:, :32], spec[:, 32:]
        mag = torch.sqrt(real * real + imag * imag + 1e-9)
        feats = self.encoder(mag)                      # [1, 64, T]
        out, (h2, c2) = self.lstm(feats.permute(2, 0, 1), (h, c))
        prob = torch.sigmoid(self.decoder(out.permute(1, 2, 0))).mean(-1)
        return prob, h2, c2


class VadLike(nn.Module):
    """Scripted like published voice-activity models: a rank check (an If on the input's shape,
    which folds), then an If over the sample rate (a runtime input) whose branches each hold a
    Conv1d and LSTM stack, the recurrent state passed in and out."""

    def __init__(self):
        super().__init__()
        self.model16k = VadBranch(256)
        self.model8k = VadBranch(128)

    def forward(self, x, sr, h, c):
        if x.dim() == 1:
            x = x.unsqueeze(0)
        if bool(sr == 16000):
            out, h2, c2 = self.model16k(x, h, c)
        else:
            out, h2, c2 = self.model8k(x, h, c)
        return out, h2, c2


class ResBlock(nn.Module):
    """A diffusion UNet's residual block: GroupNorm, SiLU, convolution, the time embedding added
    per channel, again, and the skip (a 1x1 convolution when the width changes)."""

    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.n1 = nn.GroupNorm(8, cin)
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2 = nn.GroupNorm(8, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, emb):
        h = self.c1(F.silu(self.n1(x)))
        h = h + self.t(emb)[:, :, None, None]
        h = self.c2(F.silu(self.n2(h)))
        return self.skip(x) + h


class UNetDenoiser(nn.Module):
    """A UNet-style denoiser as diffusion models write it: a sinusoidal timestep embedding through
    an MLP, a condition vector projected to the same width and added to it before the SiLU
    (Gemm(t) + Gemm(cond) -> SiLU: at batch 1 the condition's [1, 256] looks like a bias), residual
    blocks that add the embedding per channel, a strided down path, a nearest up path with the
    skip concatenated, and a GroupNorm/SiLU/conv head."""

    def __init__(self, ch=32, tdim=256, cdim=64):
        super().__init__()
        self.ch = ch
        self.t1 = nn.Linear(ch, tdim)
        self.t2 = nn.Linear(tdim, tdim)
        self.cond = nn.Linear(cdim, tdim)
        self.inp = nn.Conv2d(4, ch, 3, padding=1)
        self.d1 = ResBlock(ch, ch, tdim)
        self.down = nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1)
        self.mid = ResBlock(2 * ch, 2 * ch, tdim)
        self.u1 = ResBlock(3 * ch, ch, tdim)
        self.out_norm = nn.GroupNorm(8, ch)
        self.out = nn.Conv2d(ch, 4, 3, padding=1)

    def forward(self, latent, timestep, cond):
        half = self.ch // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
        args = timestep[:, None] * freqs[None, :]
        temb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        emb = F.silu(self.t2(F.silu(self.t1(temb))) + self.cond(cond))
        h0 = self.d1(self.inp(latent), emb)
        h = self.mid(self.down(h0), emb)
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        h = self.u1(torch.cat([h, h0], dim=1), emb)
        return self.out(F.silu(self.out_norm(h)))


class VadRateBranch(nn.Module):
    """One sample rate's voice-activity stack: a strided Conv1d filterbank, a magnitude, a strided
    Conv1d encoder that leaves one frame for this rate's window, the frame squeezed to an LSTM
    step carrying (h, c), a Conv1d head. Given another rate's window the encoder leaves two
    frames, the squeeze keeps the axis and the LSTM input gains a dim: that branch cannot run."""

    def __init__(self, win):
        super().__init__()
        self.cut = win // 2 + 1
        self.stft = nn.Conv1d(1, 2 * self.cut, win, stride=win // 4)
        self.encoder = nn.Sequential(nn.Conv1d(self.cut, 64, 3, padding=1), nn.ReLU(),
                                     nn.Conv1d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
                                     nn.Conv1d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
                                     nn.Conv1d(64, 64, 3, stride=2, padding=1), nn.ReLU())
        self.lstm = nn.LSTM(64, 64)
        self.head = nn.Conv1d(64, 1, 1)

    def forward(self, x, h, c):
        x = F.pad(x, (0, 64), mode="reflect")
        s = self.stft(x.unsqueeze(1))
        real, imag = s[:, :self.cut], s[:, self.cut:]
        e = self.encoder(torch.sqrt(real * real + imag * imag))
        out, (h2, c2) = self.lstm(e.squeeze(-1).unsqueeze(0), (h, c))
        return torch.sigmoid(self.head(out[0].unsqueeze(-1))).squeeze(-1), h2, c2


class VadIfLstm(nn.Module):
    """Scripted like published voice-activity detectors: an If on the sample rate (a runtime
    input) whose else-branch runs the 8 kHz stack, an LSTM that cannot be typed for the 16 kHz
    frame the target serves (eager runs only the branch the rate takes)."""

    def __init__(self):
        super().__init__()
        self.model16k = VadRateBranch(256)
        self.model8k = VadRateBranch(128)

    def forward(self, x, h, c, sr):
        if bool(sr == 16000):
            out, h2, c2 = self.model16k(x, h, c)
        else:
            out, h2, c2 = self.model8k(x, h, c)
        return out, h2, c2


def relu6_block(cin, cout, stride=1, groups=1, k=3):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6())


class Inverted(nn.Module):
    def __init__(self, cin, cout, stride, expand=4):
        super().__init__()
        hid = cin * expand
        self.body = nn.Sequential(relu6_block(cin, hid, k=1), relu6_block(hid, hid, stride, hid),
                                  nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class LineDetector(nn.Module):
    """A line-segment detector head in the shape of M-LSD: a MobileNetV2 encoder (ReLU6 is Clip
    at every opset), a decoder that upsamples bilinearly and concatenates skips, a 3x3 head
    wide enough for the kernel library's Winograd convolution, and the centre map's peaks found
    by MaxPool and Equal. Its sample input carries NaN, +Inf and -Inf."""

    def __init__(self):
        super().__init__()
        self.stem = relu6_block(4, 16, 2)
        self.s1 = nn.Sequential(Inverted(16, 24, 2), Inverted(24, 24, 1))
        self.s2 = nn.Sequential(Inverted(24, 32, 2), Inverted(32, 32, 1), Inverted(32, 32, 1))
        self.s3 = nn.Sequential(Inverted(32, 64, 2), Inverted(64, 64, 1))
        self.up1 = relu6_block(96, 64, k=1)
        self.up2 = relu6_block(88, 64, k=1)
        self.head = nn.Sequential(relu6_block(64, 64), nn.Conv2d(64, 9, 1))

    def forward(self, image):
        a = self.s1(self.stem(image))
        b = self.s2(a)
        c = self.s3(b)
        c = F.interpolate(c, size=b.shape[2:], mode="bilinear", align_corners=True)
        b = self.up1(torch.cat([b, c], 1))
        b = F.interpolate(b, size=a.shape[2:], mode="bilinear", align_corners=True)
        y = self.head(self.up2(torch.cat([a, b], 1)))
        centre = torch.sigmoid(y[:, :1])
        peaks = (F.max_pool2d(centre, 5, 1, 2) == centre).float()
        return centre * peaks, y[:, 1:5], y[:, 5:]


class Detections(nn.Module):
    """A torchvision detector on one image: its boxes, scores and labels (as many as it keeps:
    NonMaxSuppression inside an If decides how many). `calibrate` runs the backbone alone, since
    the detector proper wants targets in training mode."""

    def __init__(self, detector):
        super().__init__()
        self.detector = detector

    def forward(self, image):
        out = self.detector([image[0]])[0]
        return out["boxes"], out["scores"], out["labels"]

    def calibrate(self, image):
        self.detector.backbone(image)


class FlowLast(nn.Module):
    """An optical-flow model on an image pair: its last (finest) flow estimate."""

    def __init__(self, flow):
        super().__init__()
        self.flow = flow

    def forward(self, image1, image2):
        return self.flow(image1, image2)[-1]


# --------------------------------------------------------------------------------------------
# The model list.


def tv(name, **kw):
    def build():
        import torchvision.models as m
        return getattr(m, name)(weights=None, **kw)
    return build


def tv_video(name):
    def build():
        import torchvision.models.video as m
        return getattr(m, name)(weights=None)
    return build


def ssdlite():
    import torchvision.models.detection as m
    detector = m.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                detections_per_img=100)
    # Random weights leave every class score within 1e-5 of 1/91, so the per-class TopK over
    # 3,234 anchors chooses among near-ties that float rounding decides: torch in float32 and
    # torch in float64 kept different sets (37 of 300 detections). A wider classification head
    # spreads the scores as a trained one does (0.04 to 0.5), and at 100 detections the two torch
    # precisions keep the same set, so a difference from torch is kiln's, not the model's.
    with torch.no_grad():
        for head in detector.head.classification_head.module_list:
            head[-1].weight.mul_(3000.0)
    return Detections(detector)


def raft_small():
    import torchvision.models.optical_flow as m
    return FlowLast(m.raft_small(weights=None))


def video(frames, size):
    return lambda rng: {"video": rng.standard_normal((1, 3, frames, size, size))
                        .astype(np.float32)}


def image_pair(size):
    return lambda rng: {"image1": rng.standard_normal((1, 3, size, size)).astype(np.float32),
                        "image2": rng.standard_normal((1, 3, size, size)).astype(np.float32)}


def image(size):
    return lambda rng: {"input": rng.standard_normal((1, 3, size, size)).astype(np.float32)}


def tokens(vocab, t, mask=False, pad=8):
    def make(rng):
        ids = rng.integers(1, vocab, size=(1, t)).astype(np.int64)
        out = {"input_ids": ids}
        if mask:
            m = np.ones((1, t), dtype=np.int64)
            m[:, t - pad:] = 0
            ids[:, t - pad:] = 0
            out["attention_mask"] = m
        return out
    return make


def denoiser_inputs(batch, size):
    def make(rng):
        return {"latent": rng.standard_normal((batch, 4, size, size)).astype(np.float32),
                "timestep": (rng.random(batch) * 1000).astype(np.float32),
                "cond": rng.standard_normal((batch, 64)).astype(np.float32)}
    return make


def vad_inputs(rng):
    return {"x": rng.standard_normal((1, 576)).astype(np.float32),
            "h": np.zeros((1, 1, 64), dtype=np.float32),
            "c": np.zeros((1, 1, 64), dtype=np.float32),
            "sr": np.array(16000, dtype=np.int64)}


def detector_inputs(size):
    def make(rng):
        x = rng.standard_normal((1, 4, size, size)).astype(np.float32)
        # Broken pixels in a corner, as a camera or a bad crop delivers them: NaN, +Inf and -Inf
        # spread through the receptive fields, and about 60% of every output stays finite.
        x[0, 0, 0, 0] = np.nan
        x[0, 1, 0, 1] = np.inf
        x[0, 2, 1, 0] = -np.inf
        return x
    return lambda rng: {"image": make(rng)}


class Spec:
    def __init__(self, name, build, inputs, opsets=(9, 11, 13, 17), unfused=(11,),
                 script=False, fast_opsets=None, fast_inputs=None, outputs=None,
                 detections=False):
        self.name = name
        self.build = build
        self.inputs = inputs
        self.opsets = opsets
        self.unfused = unfused  # opsets exported with do_constant_folding=False
        self.script = script
        self.fast_opsets = fast_opsets or ()
        self.fast_inputs = fast_inputs or inputs
        self.outputs = outputs
        # Outputs are detections (boxes, scores, labels, one row each): compared as a set of
        # rows, since two detections whose scores agree to float rounding may come in either order.
        self.detections = detections


MODELS = [
    Spec("resnet18", tv("resnet18"), image(224), fast_opsets=(11,), fast_inputs=image(64)),
    Spec("resnet50", tv("resnet50"), image(224)),
    Spec("mobilenet_v2", tv("mobilenet_v2"), image(224), fast_opsets=(13,),
         fast_inputs=image(64)),
    Spec("mobilenet_v3_large", tv("mobilenet_v3_large"), image(224)),
    Spec("efficientnet_b0", tv("efficientnet_b0"), image(224)),
    Spec("squeezenet1_1", tv("squeezenet1_1"), image(224), fast_opsets=(9,),
         fast_inputs=image(96)),
    Spec("shufflenet_v2_x1_0", tv("shufflenet_v2_x1_0"), image(224)),
    Spec("densenet121", tv("densenet121"), image(224)),
    Spec("regnet_y_400mf", tv("regnet_y_400mf"), image(224)),
    Spec("convnext_tiny", tv("convnext_tiny"), image(224)),
    Spec("vit_b_16", tv("vit_b_16"), image(224)),
    Spec("swin_t", tv("swin_t"), image(224)),
    Spec("bert_encoder", BertEncoder, tokens(1000, 32, mask=True), fast_opsets=(13,),
         outputs=["hidden", "pooled"]),
    Spec("gpt_decoder", GptDecoder, tokens(1000, 32), fast_opsets=(17,)),
    Spec("lstm_gru_tagger", Tagger, lambda rng: {"tokens": rng.integers(0, 500, (1, 20))},
         fast_opsets=(9,)),
    Spec("conv1d_audio", AudioConv, lambda rng: {"wave": rng.standard_normal((1, 1, 16000))
                                                 .astype(np.float32)}, fast_opsets=(11,),
         fast_inputs=lambda rng: {"wave": rng.standard_normal((1, 1, 4000)).astype(np.float32)}),
    Spec("scripted_control_flow", ControlFlow,
         lambda rng: {"x": rng.standard_normal((1, 1, 1024)).astype(np.float32),
                      "steps": np.array(3, dtype=np.int64)},
         opsets=(11, 13, 17), script=True, fast_opsets=(13,)),
    Spec("ocr_like", OcrLike,
         lambda rng: {"image": rng.standard_normal((1, 3, 32, 128)).astype(np.float32)},
         unfused=(9, 11), fast_opsets=(9,)),
    Spec("vad_like", VadLike,
         lambda rng: {"x": rng.standard_normal((1, 512)).astype(np.float32),
                      "sr": np.array(16000, dtype=np.int64),
                      "h": np.zeros((1, 1, 64), dtype=np.float32),
                      "c": np.zeros((1, 1, 64), dtype=np.float32)},
         opsets=(11, 13, 17), script=True, fast_opsets=(17,),
         outputs=["prob", "h_out", "c_out"]),
    Spec("unet_denoiser", UNetDenoiser, denoiser_inputs(1, 32), opsets=(11, 13, 17),
         fast_opsets=(17,), fast_inputs=denoiser_inputs(1, 16)),
    Spec("unet_denoiser_b2", UNetDenoiser, denoiser_inputs(2, 32), opsets=(11, 13, 17),
         fast_opsets=(13,), fast_inputs=denoiser_inputs(2, 16)),
    Spec("vad_if_lstm", VadIfLstm, vad_inputs, opsets=(11, 13, 17), script=True,
         fast_opsets=(13,), outputs=["prob", "h_out", "c_out"]),
    Spec("line_detector", LineDetector, detector_inputs(128), opsets=(11, 13, 17),
         unfused=(11,), fast_opsets=(11,),
         outputs=["centre", "offsets", "displacement"]),
    # 3-D convolutions over an 8-frame clip.
    Spec("mc3_18", tv_video("mc3_18"), video(8, 112), opsets=(17,)),
    # NonMaxSuppression inside an If, TopK, GatherND; as many detections as it keeps.
    Spec("ssdlite320", ssdlite, image(320), opsets=(17,), unfused=(),
         outputs=["boxes", "scores", "labels"], detections=True),
    # GridSample (opset 16 on) over a correlation pyramid, twelve refinement steps.
    Spec("raft_small", raft_small, image_pair(128), opsets=(17,), unfused=()),
]

# --------------------------------------------------------------------------------------------
# Making one model.


def seeded(spec, seed, calib_inputs):
    torch.manual_seed(seed)
    model = spec.build()
    # torchvision zero-initialises some matrices (ViT's head and class token): its outputs would
    # be all zero, and matching them would prove nothing.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not bool(p.any()):
                p.normal_(0.0, 0.02)
    # Realistic BatchNorm statistics: a few training-mode passes on random batches of the
    # model's own input kind (random initialisation leaves running_mean 0 and running_var 1).
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        model.train()
        g = torch.Generator().manual_seed(seed + 100)
        with torch.no_grad():
            for _ in range(3):
                batch = {k: torch.randn((2,) + v.shape[1:], generator=g) if v.dtype == np.float32
                         else torch.from_numpy(v) for k, v in calib_inputs.items()}
                (model.calibrate if hasattr(model, "calibrate") else model)(*batch.values())
    model.eval()
    return model


def to_torch(inputs):
    return tuple(torch.from_numpy(np.asarray(v)) for v in inputs.values())


def torch_outputs(model, inputs):
    with torch.no_grad():
        out = model(*to_torch(inputs))
    if isinstance(out, torch.Tensor):
        out = (out,)
    return [o.numpy() for o in out]


def export(model, inputs, path, opset, fold, names, script, outputs):
    args = to_torch(inputs)
    target = torch.jit.script(model) if script else model
    # EVAL runs the exporter's eval peephole, which fuses BatchNorm into the Conv before it;
    # PRESERVE (the module is in eval mode) keeps BatchNormalization nodes, as many published
    # models have them.
    mode = torch.onnx.TrainingMode.EVAL if fold else torch.onnx.TrainingMode.PRESERVE
    try:
        torch.onnx.export(target, args, path, opset_version=opset, do_constant_folding=fold,
                          input_names=list(inputs.keys()), output_names=names, training=mode)
    except Exception:  # noqa: BLE001 (the exporter's own checker, after writing the file)
        # This torch's exporter leaves the outputs of a scripted If untyped (the graph's and its
        # branches') and its checker then refuses the file it wrote; published models declare
        # the graph's. Declare each graph output's element type from torch's own output, as
        # those models do (ONNX lets a branch's outputs leave theirs out).
        if not os.path.exists(path):
            raise
        m = onnx.load(path)
        codes = {np.dtype("float32"): onnx.TensorProto.FLOAT,
                 np.dtype("int64"): onnx.TensorProto.INT64}
        for o, arr in zip(m.graph.output, outputs):
            if not o.type.tensor_type.elem_type:
                o.type.tensor_type.elem_type = codes[arr.dtype]
        onnx.save(m, path)


def float_tensors(path):
    """Float initializers and float Constant nodes (what kiln binds as weights), in the order
    a walk of the graph meets them: [(name, array)]."""
    m = onnx.load(path)
    out = []

    def visit(g):
        for t in g.initializer:
            a = numpy_helper.to_array(t)
            if a.dtype in (np.float32, np.float16, np.float64):
                out.append((t.name, a))
        for n in g.node:
            if n.op_type == "Constant":
                for at in n.attribute:
                    if at.name == "value":
                        a = numpy_helper.to_array(at.t)
                        if a.dtype in (np.float32, np.float16, np.float64):
                            out.append((n.output[0], a))
            for at in n.attribute:
                if at.g.node:
                    visit(at.g)
                for sub in at.graphs:
                    visit(sub)

    visit(m.graph)
    return out


def second_checkpoint(first, second):
    """The second export's weights under the first export's names. Both exports trace the same
    architecture, so their graphs match node for node; a scripted model's Constant names may
    still differ between exports, so names are paired by position."""
    a, b = float_tensors(first), float_tensors(second)
    if len(a) != len(b) or any(x[1].shape != y[1].shape for x, y in zip(a, b)):
        raise RuntimeError("the two initialisations exported different graphs")
    return {name: arr for (name, _), (_, arr) in zip(a, b)}


def write_safetensors(path, tensors):
    codes = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("float64"): "F64"}
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes(order="C")
        header[name] = {"dtype": codes[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def sample_inputs(spec, fast):
    return (spec.fast_inputs if fast else spec.inputs)(np.random.default_rng(7))


def export_one(spec, opset, fast, seed, d, stem, which):
    """One initialisation: builds, exports to d/<stem>.onnx, saves torch's outputs. Run in a
    process of its own: torch.jit.script caches a compiled class, and a second export in one
    process names the same Constants differently (the digest binds weights by name)."""
    torch.set_num_threads(1)
    inputs = sample_inputs(spec, fast)
    model = seeded(spec, seed, inputs)
    outs = torch_outputs(model, inputs)
    names = spec.outputs or [f"output{i}" if len(outs) > 1 else "output"
                             for i in range(len(outs))]
    export(model, inputs, os.path.join(d, stem + ".onnx"), opset, opset not in spec.unfused,
           names, spec.script, outs)
    for i in range(len(outs)):
        np.save(os.path.join(d, f"torch_{which}_{i}.npy"), outs[i])
    return names


def make(spec, opset, fast, work):
    """Writes the model's files under work/<name>-op<opset>/; returns that folder or raises."""
    d = os.path.join(work, f"{spec.name}-op{opset}")
    # The files are reused only when they were made the same way: bump EXPORT_VERSION when what
    # make() or the models write changes.
    stamp = hashlib.sha256(f"{EXPORT_VERSION} {torch.__version__} {spec.name} {opset} {fast}"
                           .encode()).hexdigest()
    done = os.path.join(d, "done")
    if os.path.exists(done) and open(done).read() == stamp:
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "sample"))
    inputs = sample_inputs(spec, fast)
    fold = opset not in spec.unfused
    for seed, stem, which in ((1, "model", "a"), (2, "second", "b")):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--export-one", spec.name,
                            str(opset), str(seed), stem, which, d] + (["--fast"] if fast else []),
                           capture_output=True, text=True)
        if r.returncode != 0:
            lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
            raise RuntimeError(lines[-1] if lines else "export failed")
    names = json.loads(open(os.path.join(d, "names.json")).read())
    write_safetensors(os.path.join(d, "second.safetensors"),
                      second_checkpoint(os.path.join(d, "model.onnx"),
                                        os.path.join(d, "second.onnx")))
    for k, v in inputs.items():
        np.save(os.path.join(d, "sample", k + ".npy"), np.asarray(v))
    env = ", ".join(f"{k} = {list(np.asarray(v).shape)}" for k, v in inputs.items())
    sample = ", ".join(f'{k} = "sample/{k}.npy"' for k in inputs)
    for manifest, graph in (("kiln.toml", "model.onnx"), ("second.toml", "second.onnx")):
        with open(os.path.join(d, manifest), "w") as f:
            f.write(f'[endpoint]\nname = "corpus"\n\n[targets.{spec.name}]\ngraph = "{graph}"\n'
                    f'export = {{ family = "corpus/{spec.name}" }}\n'
                    f"envelope = [{{ {env} }}]\nsamples = [{{ {sample} }}]\n")
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"outputs": names, "inputs": list(inputs), "fold": fold,
                   "detections": spec.detections,
                   "ops": sorted({n.op_type for n in onnx.load(os.path.join(d, "model.onnx"))
                                  .graph.node})}, f)
    with open(done, "w") as f:
        f.write(stamp)
    return d


# --------------------------------------------------------------------------------------------
# Checking one model with the kiln command line.


def rel_l2(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return math.inf
    # Non-finite values must sit at the same positions with the same value (NaN, +Inf, -Inf);
    # the error is measured over the finite rest.
    if not np.array_equal(np.isnan(want), np.isnan(got)):
        return math.inf
    infinite = np.isinf(want)
    if not np.array_equal(infinite, np.isinf(got)) or not np.array_equal(want[infinite],
                                                                         got[infinite]):
        return math.inf
    finite = np.isfinite(want)
    want, got = want[finite], got[finite]
    n = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (n if n > 0 else 1.0))


def detection_rows(outputs):
    """Detections (boxes [n, 4], then per-row outputs [n]) in one canonical row order: by label,
    then box; each output reordered alike."""
    boxes = np.asarray(outputs[0], dtype=np.float64)
    if boxes.ndim != 2 or any(np.asarray(o).shape[:1] != boxes.shape[:1] for o in outputs):
        return outputs
    keys = [np.round(boxes[:, j], 3) for j in range(boxes.shape[1] - 1, -1, -1)]
    if len(outputs) > 2:
        keys.append(np.asarray(outputs[2]))
    order = np.lexsort(keys)
    return [np.asarray(o)[order] for o in outputs]


def safe_name(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


class Failure(Exception):
    pass


def kiln(args, env, timeout=3600):
    start = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    ms = (time.monotonic() - start) * 1000
    if r.returncode != 0:
        tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
        raise Failure(" ".join(os.path.basename(a) for a in args[1:3]) + ": " + " | ".join(tail))
    return r.stdout, ms


def check(kiln_bin, d, threads):
    meta = json.load(open(os.path.join(d, "meta.json")))
    env = dict(os.environ)
    env.setdefault("KILN_CACHE_DIR", os.path.join(d, "cache"))
    row = {"dir": d}
    inputs = []
    for k in meta["inputs"]:
        inputs += ["--input", f"{k}={os.path.join(d, 'sample', k + '.npy')}"]
    model = os.path.join(d, "model.onnx")

    def compare(out_dir, which):
        gots, wants = [], []
        for i, n in enumerate(meta["outputs"]):
            gots.append(np.load(os.path.join(out_dir, safe_name(n) + ".npy")))
            wants.append(np.load(os.path.join(d, f"torch_{which}_{i}.npy")))
            if not np.any(wants[-1]):
                raise Failure(f"torch's output '{n}' is all zero: comparing with it proves nothing")
            if not np.isfinite(wants[-1]).any():
                raise Failure(f"torch's output '{n}' has no finite value: comparing with it "
                              "proves little")
        if meta.get("detections"):
            gots, wants = detection_rows(gots), detection_rows(wants)
        return max(rel_l2(g, w) for g, w in zip(gots, wants))

    try:
        # Two initialisations, one key (law 1).
        key_a, _ = kiln([kiln_bin, "key", "--manifest", os.path.join(d, "kiln.toml")], env)
        key_b, _ = kiln([kiln_bin, "key", "--manifest", os.path.join(d, "second.toml")], env)
        row["key"] = key_a.split()[0]
        row["same_key"] = key_a.split()[0] == key_b.split()[0]
        # Eager against torch.
        kiln([kiln_bin, "run", model, *inputs, "--out", os.path.join(d, "eager")], env)
        row["eager_err"] = compare(os.path.join(d, "eager"), "a")
        # Mint: gate and fence, refused otherwise.
        out, ms = kiln([kiln_bin, "mint", "--manifest", os.path.join(d, "kiln.toml")], env)
        row["mint_ms"] = ms
        m = re.search(r"^\s*gate\s+(\S+)", out, re.M)
        row["gate"] = m.group(1) if m else "?"
        m = re.search(r"^\s*fence\s+(.*)$", out, re.M)
        row["fence"] = m.group(1) if m else "?"
        m = re.search(r"(\d+) weights: (\d+) measured(?:, (\d+) proven structurally)?", out)
        if m:
            row["weights"], row["measured"] = int(m.group(1)), int(m.group(2))
            row["structural"] = int(m.group(3) or 0)
        m = re.search(r"^\s*stored (\S+)", out, re.M)
        if m:
            row["cell_bytes"] = os.path.getsize(os.path.join(m.group(1), "cell.tar"))
        # Compiled (the minted cell, from the local store) against torch.
        kiln([kiln_bin, "run", model, *inputs, "--compile", "--out", os.path.join(d, "compiled")],
             env)
        row["compiled_err"] = compare(os.path.join(d, "compiled"), "a")
        # The same cell re-bound to the second initialisation follows it.
        kiln([kiln_bin, "run", model, *inputs, "--compile", "--checkpoint",
              os.path.join(d, "second.safetensors"), "--out", os.path.join(d, "rebound")], env)
        row["rebound_err"] = compare(os.path.join(d, "rebound"), "b")
        # Latency.
        spec = ";".join(f"{k}={list(np.load(os.path.join(d, 'sample', k + '.npy')).shape)}"
                        .replace(" ", "") for k in meta["inputs"])
        out, _ = kiln([kiln_bin, "bench", model, "--class", spec, *inputs, "--json",
                       "--threads", str(threads), "--max-seconds", "5"], env)
        lat = {}
        for line in out.splitlines():
            try:
                j = json.loads(line)
            except ValueError:
                continue
            lat[j.get("engine", "?")] = j
        row["latency"] = lat
    except (Failure, subprocess.TimeoutExpired) as e:
        row["error"] = str(e)[:400]
    row["ok"] = ("error" not in row and row.get("same_key") and row.get("gate") == "HEALTHY"
                 and row.get("eager_err", 1) <= REL_L2 and row.get("compiled_err", 1) <= REL_L2
                 and row.get("rebound_err", 1) <= REL_L2)
    return row


# --------------------------------------------------------------------------------------------
# Report.


def latency_ms(row, engine):
    j = row.get("latency", {}).get(engine)
    if not j:
        return None
    return float(j["median_ms"]) if "median_ms" in j else None


def render(rows, fast, command):
    lines = [
        "# Real-model corpus",
        "",
        f"Generated by `{command}` (do not edit by hand). Every model is built with torch and "
        "torchvision from Debian's packages with random initialisation (nothing downloaded), "
        "exported to ONNX at each opset among 9, 11, 13 and 17 that torch's exporter supports "
        "for it, and driven through the `kiln` command line as a user would: `kiln key` for two "
        "initialisations (one key), `kiln run` (eager), `kiln mint` (numerics gate and fence "
        "proof; a refusal fails the row), `kiln run --compile` (the minted cell), the same cell "
        "re-bound to the second initialisation with `--checkpoint`, and `kiln bench`. "
        "BatchNorm running statistics are calibrated on random batches (realistic, not 0 and 1). "
        "Export `folded` is torch's default (constant folding, BatchNorm fused into the "
        "convolution before it); `as traced` keeps every node, BatchNormalization included "
        "(`do_constant_folding=False`, training mode PRESERVE). "
        "The target declares its sample input in `kiln.toml` (`samples`), which the gate and "
        "the fence probe beside their synthetic probes.",
        "",
        f"Outputs match when their relative L2 error against torch is below {REL_L2:g}. "
        "Columns: eager and compiled give that error (vs the first initialisation), rebound the "
        "compiled cell's error against torch's second initialisation; mint is the wall time of "
        "`kiln mint` (compile, build, gate, fence, seal); cell the packed cell's size; fence "
        "says how many weights the perturbed checkpoints measured and how many the structural "
        "scan proved; latency is `kiln bench`'s median, single-threaded, compiled/eager, "
        f"measured on the machine that ran the command ({os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} when the run started: other work on a loaded machine makes "
        "the latencies indicative only; `docs/benchmarks.md` has the controlled comparison).",
        "",
    ]
    ok = sum(1 for r in rows if r["ok"])
    lines += [f"**{ok} of {len(rows)} (model, opset) rows pass{' (fast subset)' if fast else ''}.**",
              ""]
    lines += ["| model | opset | export | eager | compiled | rebound | one key | gate | fence | mint s "
              "| cell MiB | eager ms | compiled ms | compiled/eager |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e, c = latency_ms(r, "kiln_eager"), latency_ms(r, "kiln_compiled")
        fence = "-"
        if "weights" in r:
            fence = f"{r['measured']}/{r['weights']} measured"
            if r.get("structural"):
                fence += f", {r['structural']} structural"

        def err(k):
            v = r.get(k)
            if v is None:
                return "-"
            return ("ok " if v <= REL_L2 else "**FAIL** ") + f"{v:.1e}"

        key = "yes" if r.get("same_key") else ("**no**" if "same_key" in r else "-")
        cells = [r["model"], str(r["opset"]), "folded" if r.get("fold", True) else "as traced",
                 err("eager_err"), err("compiled_err"), err("rebound_err"), key,
                 r.get("gate", "-"), fence,
                 f"{r['mint_ms'] / 1000:.1f}" if "mint_ms" in r else "-",
                 f"{r['cell_bytes'] / 1048576:.1f}" if "cell_bytes" in r else "-",
                 f"{e:.2f}" if e else "-", f"{c:.2f}" if c else "-",
                 f"{c / e:.2f}" if e and c else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    failures = [r for r in rows if not r["ok"]]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            lines.append(f"- {r['model']} opset {r['opset']}: {r.get('error', 'outputs differ')}")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    p.add_argument("--work", default="/tmp/kiln-corpus")
    p.add_argument("--fast", action="store_true", help="the CI subset (small inputs)")
    p.add_argument("--only", default="", help="comma-separated model names")
    p.add_argument("--opsets", default="", help="comma-separated opsets to keep")
    p.add_argument("--report", default="", help="write this markdown table")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="models checked at once")
    p.add_argument("--export-one", nargs=5, metavar=("MODEL", "OPSET", "SEED", "STEM", "WHICH"),
                   help=argparse.SUPPRESS)
    p.add_argument("dir", nargs="?", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.export_one:
        name, opset, seed, stem, which = a.export_one
        spec = next(s for s in MODELS if s.name == name)
        names = export_one(spec, int(opset), a.fast, int(seed), a.dir, stem, which)
        with open(os.path.join(a.dir, "names.json"), "w") as f:
            json.dump(names, f)
        return 0
    only = set(filter(None, a.only.split(",")))
    keep_opsets = set(int(x) for x in filter(None, a.opsets.split(",")))
    os.makedirs(a.work, exist_ok=True)
    todo = []
    for spec in MODELS:
        if only and spec.name not in only:
            continue
        for opset in (spec.fast_opsets if a.fast else spec.opsets):
            if keep_opsets and opset not in keep_opsets:
                continue
            todo.append((spec, opset))
    rows, made = [], []
    for spec, opset in todo:
        row = {"model": spec.name, "opset": opset, "fold": opset not in spec.unfused}
        try:
            made.append((row, make(spec, opset, a.fast, a.work)))
        except Exception as e:  # the exporter does not support this model at this opset
            msg = str(e).strip().splitlines()
            row.update(ok=False, skipped=True,
                       error="torch.onnx.export: " + (msg[0][:200] if msg else type(e).__name__))
            rows.append(row)
            print(f"{spec.name:24s} op{opset:<3d} EXPORT FAILED {row['error']}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = {pool.submit(check, a.kiln, d, a.threads): row for row, d in made}
        for f in concurrent.futures.as_completed(futures):
            row = futures[f]
            row.update(f.result())
            rows.append(row)
            print(f"{row['model']:24s} op{row['opset']:<3d} {'ok  ' if row['ok'] else 'FAIL'} "
                  f"eager={row.get('eager_err', '-')} compiled={row.get('compiled_err', '-')} "
                  f"rebound={row.get('rebound_err', '-')} gate={row.get('gate', '-')} "
                  f"mint_ms={row.get('mint_ms', 0):.0f} {row.get('error', '')}", flush=True)
    rows.sort(key=lambda r: ([s.name for s in MODELS].index(r["model"]), r["opset"]))
    # Rows the exporter could not make are reported, not counted as kiln failures.
    counted = [r for r in rows if not r.get("skipped")]
    if a.report:
        cmd = "bash tools/corpus.sh" + (" --fast" if a.fast else "")
        text = render(counted, a.fast, cmd)
        skipped = [r for r in rows if r.get("skipped")]
        if skipped:
            text += "\n## Exports torch does not support\n\n" + "\n".join(
                f"- {r['model']} opset {r['opset']}: {r['error']}" for r in skipped) + "\n"
        # The sections other scripts measure (from "## Shapes over a range" on: the ranged
        # analyses and serving) are kept as they are.
        if os.path.exists(a.report):
            with open(a.report) as f:
                old = f.read()
            at = old.find("\n## Shapes over a range")
            if at >= 0:
                text = text.rstrip("\n") + "\n" + old[at:]
        with open(a.report, "w") as f:
            f.write(text)
    bad = [r for r in counted if not r["ok"]]
    print(f"corpus: {len(counted) - len(bad)} of {len(counted)} pass"
          f" ({len(rows) - len(counted)} not exportable)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
