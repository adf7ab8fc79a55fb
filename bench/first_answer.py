#!/usr/bin/python3
"""Process start to the first `aot_cell` answer, and the first request against the median.

    /usr/bin/python3 bench/first_answer.py [--kiln build/kiln] [--boots 5] [--requests 50]
                                           [--threads 1]

The demo model (examples/micro-diffusion) is minted once into a private cache; then, per boot,
`kiln worker` starts on a free port with that cell in its local store (no hub) and this script
sends the example's infer request (KServe v2 JSON) until an answer comes back: the clock runs
from just before the worker process is started to the first answer whose serving_mode is
aot_cell (connection refused while the worker binds, or an eager answer while it arms, counts as
time). Then `--requests` more requests, one at a time: the first aot_cell request's latency
against their median (client side, loopback). One JSON line per boot and a summary line; the
goals: start -> first aot_cell answer <= 200 ms, first request <= 1.5x the median.
"""

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EX = os.path.join(ROOT, "examples", "micro-diffusion")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def body():
    names = ["latent", "timestep", "cond"]
    inputs = []
    for n in names:
        a = np.load(os.path.join(EX, "inputs", n + ".npy")).astype(np.float32)
        inputs.append({"name": n, "shape": list(a.shape), "datatype": "FP32",
                       "data": a.reshape(-1).tolist()})
    return json.dumps({"inputs": inputs}).encode()


def infer(port, payload, timeout=30):
    """(serving_mode, client latency ms, the worker's own duration_ms), or None when nothing
    listens yet."""
    t = time.perf_counter()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v2/models/micro-diffusion/infer", payload,
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
    except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
        return None
    ms = (time.perf_counter() - t) * 1000
    if r.status != 200:
        return ("http_%d" % r.status, ms, None)
    params = json.loads(data).get("parameters", {})
    return (params.get("serving_mode", "?"), ms, params.get("duration_ms"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--boots", type=int, default=5)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    opt = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kiln-first-answer.")
    env = dict(os.environ, KILN_CACHE_DIR=os.path.join(work, "cache"))
    try:
        manifest = os.path.join(work, "kiln.toml")
        with open(os.path.join(EX, "kiln.toml")) as f:
            text = f.read()
        text = text.replace('"model.onnx"', json.dumps(os.path.join(EX, "model.onnx")))
        text = text.replace('"checkpoint.safetensors"',
                            json.dumps(os.path.join(EX, "checkpoint.safetensors")))
        with open(manifest, "w") as f:
            f.write(text)
        subprocess.run([opt.kiln, "mint", "--manifest", manifest], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        payload = body()
        rows = []
        for boot in range(opt.boots):
            port = free_port()
            log = open(os.path.join(work, "worker-%d.log" % boot), "w")
            t0 = time.perf_counter()
            proc = subprocess.Popen([opt.kiln, "worker", "--manifest", manifest, "--port",
                                     str(port), "--threads", str(opt.threads)], env=env,
                                    stdout=log, stderr=subprocess.STDOUT)
            try:
                first = None
                modes = []
                while time.perf_counter() - t0 < 30:
                    got = infer(port, payload)
                    if got is None:
                        time.sleep(0.001)
                        continue
                    modes.append(got[0])
                    if got[0] == "aot_cell":
                        first = got
                        break
                start_ms = (time.perf_counter() - t0) * 1000
                if first is None:
                    raise RuntimeError("no aot_cell answer within 30 s (answers: %s)" % modes)
                lat, served = [], []
                for _ in range(opt.requests):
                    mode, ms, dur = infer(port, payload)
                    if mode != "aot_cell":
                        raise RuntimeError("a later answer was %s" % mode)
                    lat.append(ms)
                    served.append(dur)
                med = statistics.median(lat)
                row = {"boot": boot, "start_to_first_aot_cell_ms": round(start_ms, 1),
                       "answers_before_it": modes[:-1], "first_request_ms": round(first[1], 2),
                       "median_ms": round(med, 2), "first_over_median": round(first[1] / med, 2),
                       "worker_first_ms": first[2],
                       "worker_median_ms": statistics.median(served)}
                rows.append(row)
                print(json.dumps(row), flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
                log.close()
        starts = [r["start_to_first_aot_cell_ms"] for r in rows]
        ratios = [r["first_over_median"] for r in rows]
        summary = {"boots": len(rows), "start_to_first_aot_cell_ms_median": statistics.median(starts),
                   "start_to_first_aot_cell_ms_max": max(starts),
                   "first_over_median_median": statistics.median(ratios),
                   "first_over_median_max": max(ratios),
                   "loadavg": open("/proc/loadavg").read().split()[0]}
        print(json.dumps({"summary": summary}))
        ok = summary["start_to_first_aot_cell_ms_median"] <= 200 and \
            summary["first_over_median_median"] <= 1.5
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
