#!/usr/bin/python3
"""Serving latency of a worker while one of its targets mints in a child process.

Measures what docs/benchmarks.md "Serving during a mint" reports: one `kiln worker` with two
targets, `denoiser` (micro-diffusion; its cell already in the local store, so it serves aot_cell
from boot) and `encoder` (the transformer example, a miss, so the worker mints it in a
`kiln mint --child` process). Requests to `denoiser` run back to back (one at a time) from boot;
those answered before the `mint_phases` row are "during the mint", as many after it are the
baseline. The time is the worker's own serve time (`parameters.duration_ms`), so the JSON
encoding of the request stays out of it. Prints p50/p99 of both and the slowdown, for each child
niceness given.

    /usr/bin/python3 tools/mint_serving_latency.py build/kiln 0 10 19
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EX = os.path.join(ROOT, "examples")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def manifest():
    tf, md = os.path.join(EX, "transformer"), os.path.join(EX, "micro-diffusion")
    return f"""[endpoint]
name = "latency"
max_concurrency = 1
[targets.encoder]
graph = "{tf}/model.onnx"
checkpoint = "{tf}/checkpoint.safetensors"
export = {{ family = "root/transformer" }}
envelope = [ {{ input_ids = [1, 32] }} ]
[targets.denoiser]
graph = "{md}/model.onnx"
checkpoint = "{md}/checkpoint.safetensors"
export = {{ family = "root/micro-diffusion" }}
envelope = [ {{ latent = [1, 4, 64, 64], timestep = [1], cond = [1, 64] }} ]
[functions.encoder]
target = "encoder"
[functions.denoiser]
target = "denoiser"
"""


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


def run(kiln, nice):
    d = tempfile.mkdtemp(prefix="kiln-mint-latency-")
    env = dict(os.environ, KILN_CACHE_DIR=d)
    with open(d + "/kiln.toml", "w") as f:
        f.write(manifest())
    subprocess.run([kiln, "mint", "--manifest", d + "/kiln.toml", "--target", "denoiser"], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    worker = subprocess.Popen([kiln, "worker", "--manifest", d + "/kiln.toml", "--port", str(port),
                               "--events", d + "/events.jsonl", "--mint-nice", str(nice)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    body = json.dumps({"inputs": [
        {"name": "latent", "shape": [1, 4, 64, 64], "datatype": "FP32", "data": [0.1] * 16384},
        {"name": "timestep", "shape": [1], "datatype": "FP32", "data": [10.0]},
        {"name": "cond", "shape": [1, 64], "datatype": "FP32", "data": [0.2] * 64}]}).encode()
    url = f"http://127.0.0.1:{port}/v2/models/denoiser/infer"
    during, after = [], []
    try:
        for _ in range(400):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=1)
                break
            except Exception:
                time.sleep(0.05)
        minted = False
        while True:
            with urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"}), timeout=30) as r:
                params = json.load(r)["parameters"]
            assert params["serving_mode"] == "aot_cell", params
            ms = params["duration_ms"]
            if not minted:
                during.append(ms)
                if len(during) % 2 == 0:
                    with open(d + "/events.jsonl") as f:
                        rows = [json.loads(l) for l in f if l.strip()]
                    minted = any(r["kind"] in ("mint_phases", "self_mint_abort") for r in rows)
                    mint_ms = next((r["duration_ms"] for r in rows if r["kind"] == "mint_phases"), 0)
            else:
                after.append(ms)
                if len(after) >= max(len(during), 30):
                    break
    finally:
        worker.terminate()
        worker.wait()
        subprocess.run(["rm", "-rf", d])
    print(f"nice {nice:2d}: mint {mint_ms / 1000:.1f} s; denoiser aot_cell serve time during the mint "
          f"p50 {pct(during, 50):.2f} ms p99 {pct(during, 99):.2f} ms ({len(during)} requests); "
          f"after p50 {pct(after, 50):.2f} ms p99 {pct(after, 99):.2f} ms; "
          f"slowdown p50 {pct(during, 50) / pct(after, 50):.2f}x p99 "
          f"{pct(during, 99) / pct(after, 99):.2f}x")


if __name__ == "__main__":
    for n in sys.argv[2:] or ["10"]:
        run(sys.argv[1], int(n))
