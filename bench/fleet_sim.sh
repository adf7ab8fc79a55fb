#!/usr/bin/env bash
# bench/fleet_sim.sh: a fleet of simulated workers boot-adopting one cell from a kiln hub at once
# (`kiln fleet-sim`, docs/fleet.md "Fleet simulator"). Results go in docs/fleet.md and
# docs/benchmarks.md with this command line.
#
#   bench/fleet_sim.sh [BUILD_DIR]          (default build/)
#   env: KILN=path/to/kiln  WORKERS=1000  CONCURRENCY=64  ARRIVAL=all|ramp  RAMP=10  TIMEOUT=600
#        JSON=report.json (default: under the work directory, printed)  HUB_THREADS=40
#        HUB_ARGS="--max-conns-per-client 4096" (more `kiln hub` flags: every simulated worker
#        dials from 127.0.0.1, so past ~500 boots in flight the hub's per-address connection cap,
#        1024 by default, answers 503 too_many_connections where a real fleet's many addresses
#        would not)
#
# Without HUB_URL it brings up what it measures, all on loopback: a PostgreSQL cluster
# (tools/pg.sh, in $KILN_PG_DIR, default /tmp/kiln-pg-fleet), radosgw (tools/s3.sh, in
# $S3_DIR, default /tmp/s3-fleet; restarted), one `kiln hub` on both (--db, --blobs s3://), and
# publishes the mlp example's cell to it (`kiln mint` + `kiln publish`; the hub rebuilds it), then
# runs the simulator against it with the hub's pid and the database URL.
# With HUB_URL (a hub, or a load balancer in front of several) it only runs the simulator:
#   HUB_URL=http://127.0.0.1:8470 HUB_PIDS="123 456" DB_URL=postgresql://… TOKEN=… \
#     bench/fleet_sim.sh build
# (the cell of MANIFEST, default examples/mlp/kiln.toml, must already be published there).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD="${1:-build}"
KILN="${KILN:-$BUILD/kiln}"
WORKERS="${WORKERS:-1000}"
CONCURRENCY="${CONCURRENCY:-64}"
ARRIVAL="${ARRIVAL:-all}"
RAMP="${RAMP:-10}"
TIMEOUT="${TIMEOUT:-600}"
HUB_THREADS="${HUB_THREADS:-40}"
MANIFEST="${MANIFEST:-$ROOT/examples/mlp/kiln.toml}"
[[ -x "$KILN" ]] || { echo "fleet_sim.sh: build kiln first ($KILN)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/kiln-fleet-bench.XXXXXX)
JSON="${JSON:-$WORK/report.json}"
HUB_PID=""
FRESH_DB=""
cleanup() {
  if [[ -n "$HUB_PID" ]]; then kill "$HUB_PID" 2>/dev/null || true; wait "$HUB_PID" 2>/dev/null || true; fi
  if [[ -n "$FRESH_DB" ]]; then psql "$PG_URL" -qc "DROP DATABASE IF EXISTS $FRESH_DB WITH (FORCE)" || true; fi
  rm -rf "$WORK/cache" "$WORK/data"
}
trap cleanup EXIT

if [[ -z "${HUB_URL:-}" ]]; then
  PUB=bench-publisher-token
  TOKEN=bench-worker-token
  sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
  cat >"$WORK/tokens.json" <<JSON
{"tokens":[{"name":"bench-ci","role":"publisher","tier":"platform","releases":["*"],"sha256":"$(sha $PUB)"},
           {"name":"bench-fleet","role":"worker","releases":["*"],"sha256":"$(sha $TOKEN)"}]}
JSON
  chmod 600 "$WORK/tokens.json"  # the hub refuses a tokens file others may read
  PG_URL=$(KILN_PG_DIR="${KILN_PG_DIR:-/tmp/kiln-pg-fleet}" bash "$ROOT/tools/pg.sh" | tail -1)
  # A database of its own per run, so every run starts cold: no cell, event row or signing key
  # (kept in the database on PostgreSQL) carried over from an earlier run.
  FRESH_DB="kiln_fleet_$$"
  psql "$PG_URL" -qc "CREATE DATABASE $FRESH_DB"
  DB_URL="${PG_URL%/*}/$FRESH_DB"
  S3_DIR="${S3_DIR:-/tmp/s3-fleet}"
  bash "$ROOT/tools/s3.sh" restart "$S3_DIR" >/dev/null
  set -a; source "$S3_DIR/env"; set +a
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  HUB_URL="http://127.0.0.1:$port"
  KILN_LOG_LEVEL=warning "$KILN" hub --data "$WORK/data" --port "$port" --bind 127.0.0.1 \
    --tokens "$WORK/tokens.json" --threads "$HUB_THREADS" --db "$DB_URL" \
    --blobs "s3://$KILN_S3_BUCKET/fleet-$$" ${HUB_ARGS:-} >"$WORK/hub.log" 2>&1 &
  HUB_PID=$!
  HUB_PIDS="$HUB_PID"
  for _ in $(seq 100); do curl -sf "$HUB_URL/v1/health" >/dev/null && break; sleep 0.1; done
  ref=$(KILN_CACHE_DIR="$WORK/cache" "$KILN" mint --manifest "$MANIFEST" | head -1 | cut -d' ' -f1)
  KILN_CACHE_DIR="$WORK/cache" "$KILN" publish "$WORK/cache/cells/${ref%@*}/cell.tar" \
    --hub "$HUB_URL" --token "$PUB" >/dev/null
  echo "== hub $HUB_URL (pid $HUB_PID) on PostgreSQL $DB_URL and radosgw $KILN_S3_ENDPOINT; cell $ref"
fi

args=(fleet-sim --manifest "$MANIFEST" --hub "$HUB_URL" --workers "$WORKERS"
      --concurrency "$CONCURRENCY" --arrival "$ARRIVAL" --timeout "$TIMEOUT" --json "$JSON")
[[ "$ARRIVAL" == ramp ]] && args+=(--ramp "$RAMP")
[[ -n "${TOKEN:-}" ]] && args+=(--token "$TOKEN")
for pid in ${HUB_PIDS:-}; do args+=(--hub-pid "$pid"); done
[[ -n "${DB_URL:-}" ]] && args+=(--db "$DB_URL")
echo "== machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== kiln ${args[*]}" | sed "s/--token [^ ]*/--token …/"
rc=0
"$KILN" "${args[@]}" || rc=$?
echo "== report: $JSON"
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$rc"
