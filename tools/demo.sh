#!/usr/bin/env bash
# The README's main command: install what kiln needs, build it, run `kiln demo` on the embedded
# example models.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
bash tools/build.sh build >/dev/null
exec build/kiln demo "$@"
