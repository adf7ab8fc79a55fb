#!/usr/bin/env bash
# bench/fleet_replicas.sh: the fleet simulator (`kiln fleet-sim`, docs/fleet.md) against three
# `kiln hub` replicas behind HAProxy, on one PostgreSQL database and one radosgw bucket, all on
# loopback. Results go in docs/fleet.md and docs/benchmarks.md with this command line.
#
#   bench/fleet_replicas.sh [BUILD_DIR]          (default build/)
#   env: SCENARIO=burst      the cell is published; WORKERS boot at once through HAProxy
#                kill        the same, and replica 2 is `kill -9`ed KILL_AT_S (1) s into the run
#                cold        nothing published: WORKERS miss one cold key (--cold-key)
#                cold-kill   the same, and the lease holder's mint child is SIGKILLed
#                            KILL_HOLDER_AFTER_S (2) s after it started
#        WORKERS=1000  CONCURRENCY=256  TIMEOUT=300  HUB_THREADS=16  LEASE_TTL=5  MAX_MINTS=4
#        HUB_ARGS="--max-conns-per-client 4096" (every replica sees HAProxy's one address)
#        SIM_ARGS (more fleet-sim flags)  JSON=report.json (default: under the work directory)
#        KILN_PG_DIR (default /tmp/kiln-pg-fleet)  S3_DIR (default /tmp/s3-fleet; restarted)
#
# Every replica has its own --data directory; they share the database (a fresh one per run: a
# cell another run's keys signed would not verify), the bucket prefix and their tokens. In the
# cold scenarios the simulated workers use a worker token of tier platform: the hub grants mint
# leases only to a token that may publish the family, and takes event rows only from workers.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD="${1:-build}"
KILN="${KILN:-$BUILD/kiln}"
SCENARIO="${SCENARIO:-burst}"
WORKERS="${WORKERS:-1000}"
CONCURRENCY="${CONCURRENCY:-256}"
TIMEOUT="${TIMEOUT:-300}"
HUB_THREADS="${HUB_THREADS:-16}"
LEASE_TTL="${LEASE_TTL:-5}"
MAX_MINTS="${MAX_MINTS:-4}"
KILL_AT_S="${KILL_AT_S:-1}"
KILL_HOLDER_AFTER_S="${KILL_HOLDER_AFTER_S:-2}"
HUB_ARGS="${HUB_ARGS:---max-conns-per-client 4096}"
MANIFEST="${MANIFEST:-$ROOT/examples/mlp/kiln.toml}"
case "$SCENARIO" in burst | kill | cold | cold-kill) ;; *)
  echo "fleet_replicas.sh: SCENARIO is '$SCENARIO'; expected burst, kill, cold or cold-kill" >&2
  exit 2 ;;
esac
[[ -x "$KILN" ]] || { echo "fleet_replicas.sh: build kiln first ($KILN)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/kiln-fleet-replicas.XXXXXX)
JSON="${JSON:-$WORK/report.json}"
HUB_PIDS=()
KILLER=""
FRESH_DB=""
cleanup() {
  [[ -n "$KILLER" ]] && kill "$KILLER" 2>/dev/null || true
  for pid in "${HUB_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${HUB_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  bash "$ROOT/tools/haproxy.sh" stop "$WORK/haproxy" || true
  if [[ -n "$FRESH_DB" ]]; then psql "$PG_URL" -qc "DROP DATABASE IF EXISTS $FRESH_DB WITH (FORCE)" || true; fi
  rm -rf "$WORK/cache" "$WORK"/data*
}
trap cleanup EXIT

PUB=bench-publisher-token
WORKER_TOKEN=bench-worker-token
MINTING_TOKEN=bench-minting-worker-token
sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat >"$WORK/tokens.json" <<JSON
{"tokens":[{"name":"bench-ci","role":"publisher","tier":"platform","releases":["*"],"sha256":"$(sha $PUB)"},
           {"name":"bench-fleet","role":"worker","releases":["*"],"sha256":"$(sha $WORKER_TOKEN)"},
           {"name":"bench-minting-fleet","role":"worker","tier":"platform","releases":["*"],"sha256":"$(sha $MINTING_TOKEN)"}]}
JSON
chmod 600 "$WORK/tokens.json"  # the hub refuses a tokens file others may read
PG_URL=$(KILN_PG_DIR="${KILN_PG_DIR:-/tmp/kiln-pg-fleet}" bash "$ROOT/tools/pg.sh" | tail -1)
FRESH_DB="kiln_replicas_$$"
psql "$PG_URL" -qc "CREATE DATABASE $FRESH_DB"
DB_URL="${PG_URL%/*}/$FRESH_DB"
S3_DIR="${S3_DIR:-/tmp/s3-fleet}"
bash "$ROOT/tools/s3.sh" restart "$S3_DIR" >/dev/null
set -a; source "$S3_DIR/env"; set +a

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
PORTS=()
for i in 1 2 3; do
  port=$(free_port)
  PORTS+=("$port")
  KILN_LOG_LEVEL=warning "$KILN" hub --data "$WORK/data$i" --port "$port" --bind 127.0.0.1 \
    --tokens "$WORK/tokens.json" --threads "$HUB_THREADS" --db "$DB_URL" \
    --blobs "s3://$KILN_S3_BUCKET/replicas-$$" --mint-lease-ttl "$LEASE_TTL" $HUB_ARGS \
    >"$WORK/hub$i.log" 2>&1 &
  HUB_PIDS+=("$!")
  # One at a time: the first creates the signing key, the others load it.
  up=""
  for _ in $(seq 150); do
    if curl -sf "http://127.0.0.1:$port/v1/health" >/dev/null; then up=1; break; fi
    sleep 0.1
  done
  [[ -n "$up" ]] || { echo "fleet_replicas.sh: replica $i did not start:" >&2; cat "$WORK/hub$i.log" >&2; exit 1; }
done
eval "$(bash "$ROOT/tools/haproxy.sh" start "$WORK/haproxy" 0 "${PORTS[@]}")"
HUB_URL="$KILN_HAPROXY_URL"
echo "== 3 replicas (pids ${HUB_PIDS[*]}, ports ${PORTS[*]}) behind HAProxy $HUB_URL, PostgreSQL $DB_URL, radosgw $KILN_S3_ENDPOINT"

args=(fleet-sim --manifest "$MANIFEST" --hub "$HUB_URL" --workers "$WORKERS"
      --concurrency "$CONCURRENCY" --arrival all --timeout "$TIMEOUT" --json "$JSON" --db "$DB_URL")
for pid in "${HUB_PIDS[@]}"; do args+=(--hub-pid "$pid"); done
case "$SCENARIO" in
  burst | kill)
    ref=$(KILN_CACHE_DIR="$WORK/cache" "$KILN" mint --manifest "$MANIFEST" | head -1 | cut -d' ' -f1)
    KILN_CACHE_DIR="$WORK/cache" "$KILN" publish "$WORK/cache/cells/${ref%@*}/cell.tar" \
      --hub "$HUB_URL" --token "$PUB" >/dev/null
    echo "== published $ref through the balancer"
    args+=(--token "$WORKER_TOKEN")
    ;;
  cold) args+=(--token "$MINTING_TOKEN" --cold-key --max-mints "$MAX_MINTS") ;;
  cold-kill)
    args+=(--token "$MINTING_TOKEN" --cold-key --max-mints "$MAX_MINTS" --kill-holder-after "$KILL_HOLDER_AFTER_S") ;;
esac
args+=(${SIM_ARGS:-})
echo "== machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o 'avx512f\|avx2\|sha_ni' | sort -u | tr '\n' ' ')"
echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== kiln ${args[*]}" | sed "s/--token [^ ]*/--token …/"
if [[ "$SCENARIO" == kill ]]; then
  # The kill, timed from the simulator's start; bounded by its sleep.
  (sleep "$KILL_AT_S"; kill -9 "${HUB_PIDS[1]}" && echo "== kill -9 replica 2 (pid ${HUB_PIDS[1]}) at ${KILL_AT_S} s") &
  KILLER=$!
fi
# CPU seconds (user + system) each part of the fleet's back end spent during the run, by pid:
# HAProxy, the PostgreSQL cluster (postmaster with its reaped and live backends) and the Ceph
# daemons behind radosgw. With the simulator's and the hubs' own (in the report), this says where
# a boot's CPU goes on a machine that hosts the whole fleet.
PG_DIR="${KILN_PG_DIR:-/tmp/kiln-pg-fleet}"
pid_cpu() {  # utime+stime (+ reaped children's with "all") of one pid, in clock ticks
  local f
  f=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  set -- $f
  if [[ "${2:-}" == all ]]; then echo $((${12} + ${13} + ${14} + ${15})); else echo $((${12} + ${13})); fi
}
tier_cpu() {  # "haproxy postgres ceph" in clock ticks
  local ha=0 pg=0 ceph=0 pm pid f
  [[ -f "$WORK/haproxy/haproxy.pid" ]] && ha=$(pid_cpu "$(cat "$WORK/haproxy/haproxy.pid")")
  pm=$(head -1 "$PG_DIR/data/postmaster.pid" 2>/dev/null || echo 0)
  if [[ "$pm" != 0 ]]; then
    pg=$(f=$(sed 's/.*) //' "/proc/$pm/stat"); set -- $f; echo $((${12} + ${13} + ${14} + ${15})))
    for pid in $(pgrep -P "$pm"); do pg=$((pg + $(pid_cpu "$pid"))); done
  fi
  for f in "$S3_DIR"/run/*.pid; do
    [[ -f "$f" ]] && ceph=$((ceph + $(pid_cpu "$(cat "$f")" all)))
  done
  echo "$ha $pg $ceph"
}
read -r HA0 PG0 CEPH0 < <(tier_cpu)
rc=0
"$KILN" "${args[@]}" || rc=$?
read -r HA1 PG1 CEPH1 < <(tier_cpu)
TICK=$(getconf CLK_TCK)
secs() { awk -v t="$1" -v h="$TICK" 'BEGIN { printf "%.2f", t / h }'; }
echo "== back-end CPU in the run: haproxy $(secs $((HA1 - HA0))) s, postgres $(secs $((PG1 - PG0))) s, radosgw + ceph daemons $(secs $((CEPH1 - CEPH0))) s (simulator and hubs: above)"
[[ -n "$KILLER" ]] && wait "$KILLER" 2>/dev/null || true
KILLER=""
echo "== haproxy backends after: $(bash "$ROOT/tools/haproxy.sh" status "$WORK/haproxy" | tr '\n' ' ')"
echo "== report: $JSON"
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$rc"
