#!/usr/bin/env bash
# Configures and builds kiln into build/ (or $1, with extra CMake args after it). ccache keeps
# rebuilds on the same machine fast.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
# Share ccache hits between checkouts in different folders (CI clones into a new one each time).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
shift || true
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
ninja -C "$dir" -j"$(nproc)"
