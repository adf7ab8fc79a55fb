#!/usr/bin/env bash
# tools/pg.sh: a throwaway PostgreSQL cluster on loopback for kiln's tests (hub store, hub API).
#
#   tools/pg.sh            start (or find running) and print the connection URL on stdout
#   tools/pg.sh stop       stop it and delete its directory
#   export KILN_TEST_PG_URL=$(tools/pg.sh)
#
# Idempotent: a second start prints the URL of the running cluster. Runs as root (initdb and the
# server run as the `postgres` user) or as any non-root user (then as that user). The cluster
# lives in $KILN_PG_DIR (default /tmp/kiln-pg), trusts loopback connections, listens on
# 127.0.0.1 only, on a free port, and holds one database, kiln_test.
set -euo pipefail

DIR="${KILN_PG_DIR:-/tmp/kiln-pg}"
BIN="${KILN_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}"
if [[ -z "$BIN" || ! -x "$BIN/initdb" ]]; then
  echo "pg.sh: no PostgreSQL server binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql)" >&2
  exit 1
fi

as_pg() {
  if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

url() { echo "postgresql://postgres@127.0.0.1:$(cat "$DIR/port")/kiln_test"; }

if [[ "${1:-start}" == "stop" ]]; then
  if [[ -f "$DIR/data/postmaster.pid" ]]; then
    as_pg "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >&2 || true
  fi
  rm -rf "$DIR"
  exit 0
fi

if [[ -f "$DIR/port" ]] && as_pg "$BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
  url
  exit 0
fi

mkdir -p "$DIR"
if [[ "$(id -u)" == 0 ]]; then chown postgres:postgres "$DIR"; fi
if [[ ! -f "$DIR/data/PG_VERSION" ]]; then
  as_pg "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 >"$DIR/initdb.log" 2>&1 || {
    cat "$DIR/initdb.log" >&2
    exit 1
  }
fi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
echo "$PORT" >"$DIR/port"
as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
  -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off" start >&2 || {
  cat "$DIR/server.log" >&2
  exit 1
}
as_pg "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres kiln_test 2>/dev/null || true
url
