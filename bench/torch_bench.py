#!/usr/bin/python3
"""PyTorch peer for kiln's benchmark harness (run with Debian's /usr/bin/python3: torch 1.13).

    /usr/bin/python3 bench/torch_bench.py --engine eager|jit_frozen [--threads T]
        [--warmup 5] [--runs 30] [--min-seconds 1] [--max-seconds 5] MODEL_DIR[@CLASS] ...

The module is the one that produced the model: tools/make_examples.py's classes for an example,
bench/models.py's for a generated benchmark model (its directory holds bench.json), built with
the same seeds (so the same weights), eval mode. Engines:

  eager       model(*inputs) under torch.inference_mode()
  jit_frozen  torch.jit.freeze(torch.jit.trace(model, inputs)) run under torch.inference_mode()

CLASS is a shape class (`x=[4,64]`, `a=[1,2];b=[3]`); without one the reference inputs' shapes
are used. On the reference shapes the reference inputs are fed and the output is compared with
outputs/*.npy ("max_abs_err"); otherwise inputs are generated exactly as ort_bench.js does.

One JSON line per (model, class) on stdout, engine "torch_eager" / "torch_jit_frozen".
Peak memory is ru_maxrss (process-wide, so run one engine and one (model, class) per process, as
run.sh does); rss_delta_mb is ru_maxrss minus ru_maxrss measured after imports.
"""

import os
import sys

# Before torch (and its OpenMP / OpenBLAS) load: idle OpenMP threads must not spin on 2 cores, and
# Debian's torch calls the system BLAS (OpenBLAS, pthreads build) whose pool torch.set_num_threads
# does not size. An explicit environment wins.
def _threads_from_argv(argv):
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


_T = _threads_from_argv(sys.argv)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", _T)
os.environ.setdefault("OPENBLAS_NUM_THREADS", _T)

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def load_make_examples():
    path = os.path.join(ROOT, "tools", "make_examples.py")
    spec = importlib.util.spec_from_file_location("kiln_make_examples", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ME = load_make_examples()
torch.set_num_interop_threads(1)


def maxrss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


RSS_BASE = maxrss_mb()  # after imports, before any model exists


# ------------------------------------------------------------------------------------------------
# Shape classes and deterministic inputs (bit-identical to ort_bench.js)
# ------------------------------------------------------------------------------------------------

CLASS_RE = re.compile(r"([A-Za-z_][\w.:/-]*)\s*=\s*\[([^\]]*)\]")


def parse_class(spec):
    pairs = []
    for m in CLASS_RE.finditer(spec):
        dims = [int(s) for s in m.group(2).split(",") if s.strip()]
        if any(d < 0 for d in dims):
            raise ValueError("bad shape class: %s" % spec)
        pairs.append((m.group(1), dims))
    rest = CLASS_RE.sub("", spec)
    if not pairs or re.search(r"[^\s,;]", rest):
        raise ValueError("bad shape class: %s" % spec)
    return pairs


def format_class(pairs):
    return ";".join("%s=[%s]" % (n, ",".join(str(d) for d in dims)) for n, dims in pairs)


M32 = 0xFFFFFFFF


def fnv1a(s):
    h = 0x811C9DC5
    for ch in s:
        h ^= ord(ch)
        h = (h * 0x01000193) & M32
    return h


def mulberry32(seed, count):
    a = seed & M32
    out = np.empty(count, dtype=np.uint32)
    for i in range(count):
        a = (a + 0x6D2B79F5) & M32
        t = a
        t = ((t ^ (t >> 15)) * (t | 1)) & M32
        t = (t ^ ((t + (((t ^ (t >> 7)) * (t | 61)) & M32)) & M32)) & M32
        out[i] = (t ^ (t >> 14)) & M32
    return out


def gen_input(name, dtype, dims):
    count = int(np.prod(dims)) if dims else 1
    u = mulberry32(fnv1a(name), count)
    if dtype == np.float32:
        a = (u >> 8).astype(np.float64) / 8388608.0 - 1.0
        return a.astype(np.float32).reshape(dims)
    if dtype in (np.int64, np.int32):
        return (u % 512).astype(dtype).reshape(dims)
    raise ValueError("cannot generate input %s of dtype %s" % (name, dtype))


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------


def load_bench_models():
    path = os.path.join(HERE, "models.py")
    spec = importlib.util.spec_from_file_location("kiln_bench_models", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_bench_module(name):
    """A realistic-set model exactly as bench/models.py exported it (same seeds and weights)."""
    models = load_bench_models()
    spec, model = models.build(name)
    order = [n for n, _ in spec["inputs"]]
    dtypes = {n: (np.int64 if dt == "int64" else np.float32) for n, dt in spec["inputs"]}
    return {"inputs": order, "dtypes": dtypes, "outputs": spec["outputs"]}, model


def build_module(name):
    """The example's torch module exactly as tools/make_examples.py builds it."""
    specs = {s["name"]: s for s in ME.SPECS}
    if name not in specs:
        raise KeyError("no torch module for example %r (tools/make_examples.py)" % name)
    spec = specs[name]
    ME.set_determinism(spec["seed"])
    model = spec["make"]()
    gen = torch.Generator().manual_seed(spec["seed"] + 1000)
    ME.randomize_norms(model, gen)
    model.eval()
    # make_examples pins 1 thread and deterministic kernels; undo for the benchmark.
    torch.use_deterministic_algorithms(False)
    return spec, model


def read_dir(d):
    out = {}
    if os.path.isdir(d):
        for f in sorted(os.listdir(d)):
            if f.endswith(".npy"):
                out[f[:-4]] = np.load(os.path.join(d, f))
    return out


def pct(sorted_times, p):
    import math
    k = max(0, min(len(sorted_times) - 1, int(math.ceil(p / 100.0 * len(sorted_times))) - 1))
    return sorted_times[k]


def median(s):
    n = len(s)
    return s[(n - 1) // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def bench_one(model_dir, class_spec, engine, opt):
    name = os.path.basename(os.path.abspath(model_dir))
    ref_in = read_dir(os.path.join(model_dir, "inputs"))
    ref_out = read_dir(os.path.join(model_dir, "outputs"))
    generated = os.path.exists(os.path.join(model_dir, "bench.json"))  # bench/models.py
    spec, module = build_bench_module(name) if generated else build_module(name)
    torch.set_num_threads(opt.threads)

    # Input order: the graph's (make_examples' input generator, or bench/models.py's spec).
    order = spec["inputs"] if generated else list(spec["inputs"](np.random.RandomState(0)).keys())
    if class_spec:
        given = dict(parse_class(class_spec))
        missing = [n for n in order if n not in given]
        if missing:
            raise ValueError("%s: class %s lacks inputs %s" % (name, class_spec, missing))
        pairs = [(n, given[n]) for n in order]
    else:
        pairs = [(n, list(ref_in[n].shape)) for n in order]
    is_ref = all(n in ref_in and list(ref_in[n].shape) == list(d) for n, d in pairs)
    arrays = []
    for n, dims in pairs:
        if is_ref:
            arrays.append(ref_in[n])
        else:
            dt = ref_in[n].dtype.type if n in ref_in else \
                spec["dtypes"][n] if generated else np.float32
            arrays.append(gen_input(n, dt, dims))
    inputs = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)

    if engine == "eager":
        fn = module
    elif engine == "jit_frozen":
        with torch.no_grad():
            traced = torch.jit.trace(module, inputs)
            fn = torch.jit.freeze(traced.eval())
    else:
        raise ValueError("unknown engine %s" % engine)

    with torch.inference_mode():
        first = fn(*inputs)
        if isinstance(first, torch.Tensor):
            first = (first,)
        max_abs_err = None
        if is_ref and ref_out:
            max_abs_err = 0.0
            for out_name, got in zip(spec["outputs"], first):
                ref = ref_out[out_name]
                g = got.detach().numpy()
                if g.shape != ref.shape:
                    raise ValueError("%s: output %s shape %s != %s"
                                     % (name, out_name, g.shape, ref.shape))
                e = float(np.max(np.abs(g.astype(np.float64) - ref.astype(np.float64))))
                max_abs_err = max(max_abs_err, e if e == e else float("inf"))

        # Warm-up stops early on a slow model (Debian's torch runs Linear on the reference BLAS:
        # seconds per BERT run), after at least one call.
        w0 = time.perf_counter()
        for i in range(opt.warmup):
            fn(*inputs)
            if time.perf_counter() - w0 >= opt.max_seconds:
                break

        times = []
        clock = time.perf_counter
        t0 = clock()
        while True:
            a = clock()
            fn(*inputs)
            b = clock()
            times.append((b - a) * 1e3)
            elapsed = b - t0
            if len(times) >= opt.max_runs:
                break
            if elapsed >= opt.max_seconds and len(times) >= 3:
                break
            if len(times) >= opt.runs and elapsed >= opt.min_seconds:
                break
    times.sort()
    peak = maxrss_mb()
    return {
        "engine": "torch_" + engine,
        "model": name,
        "class": format_class(pairs),
        "threads": opt.threads,
        "median_ms": round(median(times), 4),
        "p90_ms": round(pct(times, 90), 4),
        "min_ms": round(times[0], 4),
        "runs": len(times),
        "peak_rss_mb": round(peak, 1),
        "rss_delta_mb": round(peak - RSS_BASE, 1),
        "max_abs_err": None if max_abs_err is None else float("%.3e" % max_abs_err),
        "inputs": "reference" if is_ref else "generated",
        "version": "torch " + torch.__version__,
        "env": {k: os.environ.get(k) for k in
                ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                 "OPENBLAS_CORETYPE") if os.environ.get(k) is not None},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["eager", "jit_frozen"], required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--max-seconds", type=float, default=5.0)
    ap.add_argument("--max-runs", type=int, default=100000)
    ap.add_argument("--class", dest="cls", default=None,
                    help="shape class for the MODEL_DIRs that carry no @CLASS")
    ap.add_argument("models", nargs="+", metavar="MODEL_DIR[@CLASS]")
    opt = ap.parse_args()
    if opt.threads < 1:
        ap.error("--threads must be >= 1")
    failed = 0
    for m in opt.models:
        d, _, c = m.partition("@")
        try:
            r = bench_one(d, c or opt.cls, opt.engine, opt)
            sys.stdout.write(json.dumps(r) + "\n")
            sys.stdout.flush()
        except Exception as e:  # report and go on with the next model
            failed += 1
            sys.stderr.write("torch_bench: %s%s: %s: %s\n"
                             % (d, " " + (c or opt.cls) if (c or opt.cls) else "",
                                type(e).__name__, e))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
