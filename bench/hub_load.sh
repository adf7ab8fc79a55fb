#!/usr/bin/env bash
# bench/hub_load.sh: resolve throughput and latency of a kiln hub on loopback, with wrk, on SQLite
# and (when KILN_TEST_PG_URL is set, see tools/pg.sh) on PostgreSQL. Results go in
# docs/benchmarks.md with this command line.
#
#   bench/hub_load.sh [BUILD_DIR]         (default build/)
#   env: KILN=path/to/kiln  DURATION=10s  CONNECTIONS=16  THREADS=2  HUB_THREADS=32
#
# Seeds each hub with one published cell (tests/make_test_cell), then measures GET /v1/cells/<key>
# (a hit with its receipt) with wrk --latency. The goal: >= 5000 resolves/s, p99 < 10 ms
# on 2 cores.
set -euo pipefail
BUILD="${1:-build}"
KILN="${KILN:-$BUILD/kiln}"
MAKE_CELL="$BUILD/tests/make_test_cell"
DURATION="${DURATION:-10s}"
CONNECTIONS="${CONNECTIONS:-16}"
THREADS="${THREADS:-2}"
HUB_THREADS="${HUB_THREADS:-32}"
command -v wrk >/dev/null || { echo "hub_load.sh: wrk is not installed (apt-get install wrk)" >&2; exit 1; }
[[ -x "$KILN" && -x "$MAKE_CELL" ]] || { echo "hub_load.sh: build kiln and make_test_cell first" >&2; exit 1; }

WORK=$(mktemp -d /tmp/kiln-hub-load.XXXXXX)
HUB_PID=""
cleanup() { [[ -n "$HUB_PID" ]] && kill "$HUB_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

PUB=bench-publisher-token
WORKER=bench-worker-token
sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat >"$WORK/tokens.json" <<JSON
{"tokens":[{"name":"bench-ci","role":"publisher","tier":"platform","sha256":"$(sha $PUB)"},
           {"name":"bench-worker","role":"worker","sha256":"$(sha $WORKER)"}]}
JSON
chmod 600 "$WORK/tokens.json"  # the hub refuses a tokens file others may read
KEY=$("$MAKE_CELL" "$WORK/cell.tar" "bench-$$-$RANDOM")

run_backend() {
  local name="$1" db="$2"
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  # --rebuild off: the seeded cell carries a fake shared object (tests/make_test_cell), which a
  # rebuild would refuse; resolve throughput does not depend on it.
  local args=(hub --data "$WORK/data-$name" --port "$port" --tokens "$WORK/tokens.json" --threads "$HUB_THREADS" --rebuild off)
  [[ -n "$db" ]] && args+=(--db "$db")
  KILN_LOG_LEVEL=warning "$KILN" "${args[@]}" >"$WORK/hub-$name.log" 2>&1 &
  HUB_PID=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/v1/health" >/dev/null && break; sleep 0.1; done
  "$KILN" publish "$WORK/cell.tar" --hub "http://127.0.0.1:$port" --token "$PUB" >/dev/null
  curl -sf -H "Authorization: Bearer $WORKER" "http://127.0.0.1:$port/v1/cells/$KEY?family=root/micro-mlp" | grep -q '"found":true'
  echo "== machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "== $name: wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency GET /v1/cells/<key> (hit)"
  wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency \
    -H "Authorization: Bearer $WORKER" "http://127.0.0.1:$port/v1/cells/$KEY?family=root/micro-mlp" |
    grep -E "Requests/sec|Latency|50%|90%|99%|requests in|Non-2xx"
  kill "$HUB_PID"; wait "$HUB_PID" 2>/dev/null || true; HUB_PID=""
}

run_backend sqlite ""
if [[ -n "${KILN_TEST_PG_URL:-}" ]]; then
  run_backend postgresql "$KILN_TEST_PG_URL"
else
  echo "== postgresql: skipped (set KILN_TEST_PG_URL, e.g. \$(tools/pg.sh))"
fi
