#!/usr/bin/env bash
# bench/infer_load.sh: KServe v2 `infer` under load on a kiln worker serving the micro-diffusion
# example from its cell, on loopback, and what the serving path adds to the cell's own run time.
# Results go in docs/benchmarks.md with this command line.
#
#   bench/infer_load.sh [BUILD_DIR]       (default build/)
#   env: KILN=path/to/kiln  DURATION=20s  THREADS=1 (compute threads per request)
#
# Steps: mint the cell into a private cache; `kiln bench --compiled-only` times the cell alone
# (median of in-process runs: the cell's own run time); start `kiln worker` on it; one request
# checks serving_mode=aot_cell; wrk with 1 connection measures the end-to-end latency of one
# request at a time (HTTP, parsing the binary tensor extension, the serving wrapper, the cell,
# the binary answer); wrk with 2 and 4 connections measures throughput on the machine's cores.
# Overhead = (end-to-end p50 at 1 connection - cell median) / cell median. The goal:
# under 5%, no errors.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
KILN="${KILN:-$BUILD/kiln}"
DURATION="${DURATION:-20s}"
THREADS="${THREADS:-1}"
PY=/usr/bin/python3
EX="$PWD/examples/micro-diffusion"
command -v wrk >/dev/null || { echo "infer_load.sh: wrk is not installed (apt-get install wrk)" >&2; exit 1; }
[[ -x "$KILN" ]] || { echo "infer_load.sh: build kiln first ($KILN)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/kiln-infer-load.XXXXXX)
PID=""
cleanup() { [[ -n "$PID" ]] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
export KILN_CACHE_DIR="$WORK/cache"

echo "== machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$KILN" mint --manifest "$EX/kiln.toml" >/dev/null
CLASS='latent=[1,4,64,64];timestep=[1];cond=[1,64]'
CELL_MS=$("$KILN" bench "$EX/model.onnx" --checkpoint "$EX/checkpoint.safetensors" --class "$CLASS" \
  --threads "$THREADS" --compiled-only --json --warmup 5 --runs 200 --max-seconds 10 |
  $PY -c 'import json,sys
for l in sys.stdin:
    j=json.loads(l)
    if j["engine"]=="kiln_compiled": print(j["median_ms"])')
echo "== the cell alone (kiln bench --compiled-only, threads=$THREADS): median $CELL_MS ms"

sed -e "s|\"model.onnx\"|\"$EX/model.onnx\"|" -e "s|\"checkpoint.safetensors\"|\"$EX/checkpoint.safetensors\"|" \
  "$EX/kiln.toml" >"$WORK/kiln.toml"
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$KILN" worker --manifest "$WORK/kiln.toml" --port "$PORT" --threads "$THREADS" >"$WORK/worker.log" 2>&1 &
PID=$!
for _ in $(seq 200); do curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null && break; sleep 0.1; done

# The request: the example's inputs as binary tensors, the answer asked for in binary too.
$PY - "$EX" "$WORK" <<'PY'
import json, sys
import numpy as np
ex, work = sys.argv[1], sys.argv[2]
names = ["latent", "timestep", "cond"]
arrays = [np.load(f"{ex}/inputs/{n}.npy").astype(np.float32) for n in names]
header = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP32",
                      "parameters": {"binary_data_size": a.nbytes}} for n, a in zip(names, arrays)],
          "parameters": {"binary_data_output": True}}
h = json.dumps(header).encode()
open(f"{work}/body.bin", "wb").write(h + b"".join(a.tobytes() for a in arrays))
open(f"{work}/header_len", "w").write(str(len(h)))
PY
HLEN=$(cat "$WORK/header_len")
curl -sf -o "$WORK/first.bin" -H "Content-Type: application/octet-stream" \
  -H "Inference-Header-Content-Length: $HLEN" --data-binary "@$WORK/body.bin" \
  "http://127.0.0.1:$PORT/v2/models/micro-diffusion/infer"
grep -aq '"serving_mode":"aot_cell"' "$WORK/first.bin" ||
  { echo "infer_load.sh: the first answer was not served by the cell:"; head -c 400 "$WORK/first.bin"; exit 1; }
echo "== first request: serving_mode=aot_cell"

cat >"$WORK/post.lua" <<LUA
local f = io.open("$WORK/body.bin", "rb")
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = "$HLEN"
LUA
URL="http://127.0.0.1:$PORT/v2/models/micro-diffusion/infer"
for c in 1 2 4; do
  echo "== wrk -t$((c < 2 ? 1 : 2)) -c$c -d$DURATION --latency (binary tensors)"
  wrk -t"$((c < 2 ? 1 : 2))" -c"$c" -d"$DURATION" --latency -s "$WORK/post.lua" "$URL" >"$WORK/wrk-$c.txt"
  grep -E "Requests/sec|Latency |50%|99%|requests in|Non-2xx|Socket errors" "$WORK/wrk-$c.txt"
done

# Overhead at one connection: wrk's p50 against the cell's median.
P50=$(awk '$1=="50%"{print $2}' "$WORK/wrk-1.txt")
$PY - "$P50" "$CELL_MS" <<'PY'
import sys
p50, cell = sys.argv[1], float(sys.argv[2])
ms = float(p50[:-2]) if p50.endswith("ms") else float(p50[:-2]) / 1000 if p50.endswith("us") else float(p50[:-1]) * 1000
print(f"== overhead at 1 connection: end-to-end p50 {ms:.3f} ms vs cell {cell:.3f} ms -> "
      f"{(ms - cell) / cell * 100:+.1f}%")
PY
curl -sf "http://127.0.0.1:$PORT/metrics" | grep -E '^kiln_infer_(requests|errors)_total|^kiln_infer_duration_ms_(sum|count)'
