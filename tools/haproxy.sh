#!/usr/bin/env bash
# A real HAProxy on loopback in front of `kiln hub` replicas, for tests, benches and the fleet
# simulator (docs/fleet.md "Replicas behind a load balancer" shows the same configuration).
#
#   tools/haproxy.sh start DIR PORT BACKEND_PORT...
#                           writes DIR/haproxy.cfg (round robin over 127.0.0.1:BACKEND_PORT...,
#                           health checks on GET /v1/ready, `retries 3`, `option redispatch`),
#                           starts haproxy (pid in DIR/haproxy.pid, log DIR/haproxy.log) listening
#                           on 127.0.0.1:PORT (0: a free port), waits until every backend is UP,
#                           writes DIR/env (KILN_HAPROXY_URL, KILN_HAPROXY_STATS) and prints it.
#   tools/haproxy.sh stop DIR
#                           stops the haproxy started under DIR (by its pid file) and deletes DIR.
#   tools/haproxy.sh status DIR
#                           prints each backend and its state (UP, DOWN, …) from the stats page.
# Exit 3 from start: haproxy is not installed (bash tools/deps.sh --tests).
set -euo pipefail

HAPROXY="${KILN_HAPROXY_BIN:-/usr/sbin/haproxy}"

usage() {
  echo "usage: tools/haproxy.sh start DIR PORT BACKEND_PORT... | stop DIR | status DIR" >&2
  exit 2
}
[ $# -ge 2 ] || usage
cmd=$1
DIR=$(realpath -m "$2")

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

stats() {
  local port
  port=$(sed -n 's/^KILN_HAPROXY_STATS=http:\/\/127.0.0.1:\([0-9]*\)\/stats$/\1/p' "$DIR/env")
  python3 - "$port" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/stats;csv", timeout=2).read()
for line in body.decode().splitlines():
    f = line.split(",")
    if len(f) > 17 and f[0] == "replicas" and f[1] not in ("FRONTEND", "BACKEND"):
        print(f[1], f[17])
PY
}

stop() {
  if [ -f "$DIR/haproxy.pid" ]; then
    local pid
    pid=$(cat "$DIR/haproxy.pid")
    # Only a haproxy of this directory: a stale pid file must not name someone else's process.
    if [ -n "$pid" ] && grep -qF "$DIR/haproxy.cfg" "/proc/$pid/cmdline" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  fi
  rm -rf "$DIR"
}

case "$cmd" in
  stop) stop; exit 0 ;;
  status) stats; exit 0 ;;
  start) ;;
  *) usage ;;
esac

[ $# -ge 4 ] || usage
[ -x "$HAPROXY" ] || { echo "haproxy.sh: $HAPROXY is not installed (bash tools/deps.sh --tests)" >&2; exit 3; }
PORT=$3
shift 3
[ "$PORT" = 0 ] && PORT=$(free_port)
STATS_PORT=$(free_port)
mkdir -p "$DIR"
{
  printf 'global\n  maxconn 4096\n  pidfile %s/haproxy.pid\n' "$DIR"
  printf 'defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n'
  printf '  timeout queue 10s\n  timeout check 2s\n  retries 3\n  option redispatch 1\n'
  printf 'frontend hubs\n  bind 127.0.0.1:%s\n  default_backend replicas\n' "$PORT"
  printf 'backend replicas\n  balance roundrobin\n  option httpchk GET /v1/ready\n'
  printf '  http-check expect status 200\n  default-server inter 500ms fall 2 rise 2\n'
  i=0
  for b in "$@"; do
    printf '  server r%d 127.0.0.1:%s check\n' "$i" "$b"
    i=$((i + 1))
  done
  printf 'listen stats\n  bind 127.0.0.1:%s\n  stats enable\n  stats uri /stats\n' "$STATS_PORT"
} >"$DIR/haproxy.cfg"
"$HAPROXY" -c -q -f "$DIR/haproxy.cfg"
"$HAPROXY" -D -f "$DIR/haproxy.cfg" >"$DIR/haproxy.log" 2>&1
{
  echo "KILN_HAPROXY_URL=http://127.0.0.1:$PORT"
  echo "KILN_HAPROXY_STATS=http://127.0.0.1:$STATS_PORT/stats"
} >"$DIR/env"
for _ in $(seq 100); do
  up=$(stats 2>/dev/null | grep -c ' UP$' || true)
  if [ "$up" = "$#" ]; then
    cat "$DIR/env"
    exit 0
  fi
  sleep 0.1
done
echo "haproxy.sh: not every backend came UP within 10 s:" >&2
stats >&2 || true
exit 1
