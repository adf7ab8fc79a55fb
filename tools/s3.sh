#!/usr/bin/env bash
# A real S3 object store on loopback for tests: Ceph's radosgw (Debian) on a single-node cluster
# under one directory. One monitor, one manager, one OSD on memstore (RAM, 1 GiB, gone at stop),
# and radosgw with the beast frontend, all bound to 127.0.0.1 on free ports. radosgw checks every
# request's SigV4 signature against the user this script creates.
#
#   tools/s3.sh start DIR   brings the cluster up under DIR (created; must not hold a running
#                           one), creates a user and a bucket, writes DIR/env (shell-sourceable:
#                           KILN_S3_ENDPOINT, KILN_S3_BUCKET, AWS_ACCESS_KEY_ID,
#                           AWS_SECRET_ACCESS_KEY, AWS_REGION) and prints it. Exit 0 only when an
#                           authenticated request has succeeded.
#   tools/s3.sh stop DIR    stops the daemons this script started under DIR (by their pid files)
#                           and deletes DIR.
#   tools/s3.sh restart DIR stop, then start (what the CTest fixture runs: a cluster left by a
#                           killed test run is replaced, not reused).
# Exit 3 from start: the packages are not installed (CTest reports the fixture as skipped).
#
# Needs the packages `tools/deps.sh --s3` installs. Ceph's own authentication between daemons is
# cephx with one keyring under DIR (mode 600); every daemon listens on 127.0.0.1 only.
set -euo pipefail

usage() {
  echo "usage: tools/s3.sh start|stop|restart DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
cmd=$1
DIR=$(realpath -m "$2")

kill_daemons() {
  local pids=()
  for f in "$DIR"/run/*.pid; do
    [ -f "$f" ] || continue
    local pid
    pid=$(cat "$f")
    # Only a daemon of this cluster: a stale pid file must not name someone else's process.
    if [ -n "$pid" ] && grep -qF "$DIR/ceph.conf" "/proc/$pid/cmdline" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 20); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  done
}

stop() {
  [ -d "$DIR" ] || return 0
  kill_daemons
  rm -rf "$DIR"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits up to $1 seconds for the command after it to succeed.
wait_for() {
  local limit=$1
  shift
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if [ $((SECONDS - start)) -ge "$limit" ]; then
      echo "s3.sh: timed out after ${limit}s waiting for: $*" >&2
      return 1
    fi
    sleep 0.5
  done
}

start() {
  for bin in ceph-mon ceph-osd ceph-mgr radosgw radosgw-admin ceph ceph-authtool monmaptool; do
    command -v "$bin" >/dev/null || {
      echo "s3.sh: '$bin' is missing; run tools/deps.sh --s3" >&2
      exit 3
    }
  done
  if [ -e "$DIR/run" ]; then
    echo "s3.sh: '$DIR' already holds a cluster; stop it first" >&2
    exit 2
  fi
  mkdir -p "$DIR"/{run,log,mon.a,mgr.x,osd.0}
  local fsid mon_port rgw_port conf
  fsid=$(python3 -c "import uuid; print(uuid.uuid4())")
  mon_port=$(free_port)
  rgw_port=$(free_port)
  conf=$DIR/ceph.conf
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $DIR/keyring
run dir = $DIR/run
pid file = $DIR/run/\$name.pid
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
crash dir = $DIR/crash
mon data = $DIR/mon.\$id
mgr data = $DIR/mgr.\$id
osd data = $DIR/osd.\$id
osd objectstore = memstore
memstore device bytes = 1073741824
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
# The monitor refuses to start when its data filesystem has under 5% free (and warns under 30%).
# Its store here is a few MB on a shared build disk that a sanitizer build can fill past that;
# the OSD's data is in RAM, so the percentage says nothing about this cluster.
mon data avail crit = 0
mon data avail warn = 0
# One OSD, fixed in RAM: no scrubbing, no recovery throttles to wait on.
osd scrub auto repair = false
osd max scrubs = 0
mgr initial modules =
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$rgw_port
rgw dns name = 127.0.0.1
rgw thread pool size = 64
EOF
  local C=(-c "$conf")
  # One keyring for every daemon and the admin client; the monitor imports it at mkfs.
  local K=$DIR/keyring
  {
    ceph-authtool --create-keyring "$K" --gen-key -n mon. --cap mon 'allow *'
    ceph-authtool "$K" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
      --cap mgr 'allow *'
    ceph-authtool "$K" --gen-key -n mgr.x --cap mon 'allow profile mgr' --cap osd 'allow *'
    ceph-authtool "$K" --gen-key -n osd.0 --cap mon 'allow profile osd' --cap osd 'allow *' \
      --cap mgr 'allow profile osd'
    ceph-authtool "$K" --gen-key -n client.rgw.a --cap mon 'allow rw' --cap osd 'allow rwx' \
      --cap mgr 'allow rw'
  } >"$DIR/log/setup.log" 2>&1
  chmod 600 "$K"
  monmaptool --create --clobber --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" \
    "$DIR/monmap" >>"$DIR/log/setup.log" 2>&1
  ceph-mon "${C[@]}" --mkfs -i a --monmap "$DIR/monmap" --keyring "$K" >>"$DIR/log/setup.log" 2>&1
  ceph-mon "${C[@]}" -i a >>"$DIR/log/setup.log" 2>&1
  wait_for 30 ceph "${C[@]}" --connect-timeout 5 mon stat
  ceph-mgr "${C[@]}" -i x >>"$DIR/log/setup.log" 2>&1
  local uuid id
  uuid=$(python3 -c "import uuid; print(uuid.uuid4())")
  id=$(ceph "${C[@]}" osd new "$uuid")
  [ "$id" = 0 ] || {
    echo "s3.sh: expected osd id 0, got '$id'" >&2
    exit 1
  }
  ceph-osd "${C[@]}" -i 0 --mkfs --osd-uuid "$uuid" >>"$DIR/log/setup.log" 2>&1
  ceph-osd "${C[@]}" -i 0 >>"$DIR/log/setup.log" 2>&1
  wait_for 60 sh -c "ceph -c '$conf' osd dump | grep -q '^osd.0 up'"
  radosgw "${C[@]}" -n client.rgw.a >>"$DIR/log/setup.log" 2>&1

  local access secret
  access=$(python3 -c 'import secrets; print("KILN" + secrets.token_hex(8).upper())')
  secret=$(python3 -c 'import secrets; print(secrets.token_urlsafe(30))')
  radosgw-admin "${C[@]}" user create --uid=kiln --display-name=kiln \
    --access-key="$access" --secret-key="$secret" >>"$DIR/log/setup.log" 2>&1
  cat >"$DIR/env" <<EOF
KILN_S3_ENDPOINT=http://127.0.0.1:$rgw_port
KILN_S3_BUCKET=kiln
AWS_ACCESS_KEY_ID=$access
AWS_SECRET_ACCESS_KEY=$secret
AWS_REGION=us-east-1
EOF
  chmod 600 "$DIR/env"
  # Ready means: an authenticated request gets through. Creating the bucket is that request.
  local aws=/usr/bin/aws
  wait_for 60 env -i PATH=/usr/bin:/bin HOME="$DIR" AWS_ACCESS_KEY_ID="$access" \
    AWS_SECRET_ACCESS_KEY="$secret" AWS_REGION=us-east-1 \
    "$aws" --endpoint-url "http://127.0.0.1:$rgw_port" s3api create-bucket --bucket kiln
  cat "$DIR/env"
}

# A failed start stops what it started and prints every daemon log's tail (a CI run keeps no
# build folder for the post-mortem).
on_start_exit() {
  local rc=$?
  [ $rc -ne 0 ] || return 0
  kill_daemons
  for f in "$DIR"/log/*.log; do
    [ -f "$f" ] || continue
    echo "--- $f" >&2
    tail -n 20 "$f" >&2 || true
  done
  echo "s3.sh: start failed (exit $rc); logs in $DIR/log" >&2
}

case "$cmd" in
  start)
    trap on_start_exit EXIT
    start
    ;;
  stop) stop ;;
  restart)
    stop
    trap on_start_exit EXIT
    start
    ;;
  *) usage ;;
esac
