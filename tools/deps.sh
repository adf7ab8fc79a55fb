#!/usr/bin/env bash
# Installs the Debian 12 packages kiln builds and tests with (see docs/dependencies.md for why
# each is here). Idempotent: apt runs only when something is missing. Needs root (or sudo).
# `deps.sh --tests` adds what the test suite needs beyond the build: python3-torch and
# python3-torchvision, which make the real-model corpus at test time (tools/corpus.py), and
# clang-format, for CI's format gate (tools/check_format.sh), clang, the second compiler one hub
# attests cells of beside g++ (its builder per toolchain), HAProxy, the load balancer hub
# replicas are tested behind (tools/haproxy.sh), and the S3 object store the hub's S3 blob
# backend is tested against; the demo (tools/demo.sh) does not pay for them.
# `deps.sh --s3` installs only that object store: Ceph's radosgw on a one-node cluster (monitor,
# manager, OSD; tools/s3.sh starts it) and awscli, the independent client the tests check the
# bucket with. KILN_WITH_PYTHON=1 does the same (regenerating examples/). `deps.sh --list` prints
# every package, test ones included, and installs nothing (tools/check_install_steps.py checks
# every path a build found against it).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libonnx-dev libprotobuf-dev protobuf-compiler
  libdnnl-dev
  libssl-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
  libcpp-httplib-dev libboost-dev libsqlite3-dev libpqxx-dev postgresql
  chromium
  libgtest-dev libgmock-dev
  python3 python3-numpy python3-onnx
)
S3_PACKAGES=(ceph-mon ceph-mgr ceph-osd ceph-common radosgw awscli)
TEST_PACKAGES=(python3-torch python3-torchvision clang-format clang haproxy "${S3_PACKAGES[@]}")
case "${1:-}" in
  --list)
    printf '%s\n' "${PACKAGES[@]}" "${TEST_PACKAGES[@]}"
    exit 0
    ;;
  --tests) PACKAGES+=("${TEST_PACKAGES[@]}") ;;
  --s3) PACKAGES=("${S3_PACKAGES[@]}") ;;
  "") ;;
  *)
    echo "deps.sh: unknown argument '$1' (expected --tests, --s3 or --list)" >&2
    exit 2
    ;;
esac
if [ "${KILN_WITH_PYTHON:-0}" = 1 ]; then
  PACKAGES+=("${TEST_PACKAGES[@]}")
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "kiln: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
