#!/usr/bin/env bash
# The README's main command: install what kiln needs, build it, run `kiln demo` on the embedded
# example models.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
# Only the binary the demo runs; `bash tools/test.sh` builds the rest into the same folder.
KILN_TARGETS=kiln bash tools/build.sh build >/dev/null
exec build/kiln demo "$@"
