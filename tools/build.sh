#!/usr/bin/env bash
# Configures and builds kiln into build/ (or $1, with extra CMake args after it). ccache keeps
# rebuilds on the same machine fast. KILN_TARGETS="kiln" builds only those targets (the demo
# needs the `kiln` binary alone, not the test suite).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
# Share ccache hits between checkouts in different folders (CI clones into a new one each time).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
shift || true
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
# shellcheck disable=SC2086
ninja -C "$dir" -j"$(nproc)" ${KILN_TARGETS:-}
