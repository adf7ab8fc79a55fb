#!/usr/bin/env bash
# ONNX node conformance in one command: builds kiln_conformance, generates the cases from
# python3-onnx into the build directory (tests/conformance/generate_cases.py), and runs every
# case eager and compiled.
#   bash tools/conformance.sh            check against tests/conformance/baseline.txt (exit 1 when
#                                        a recorded (mode, case) no longer passes)
#   bash tools/conformance.sh --update   rewrite docs/conformance.md and the baseline; also runs
#                                        every case through the command line (`kiln run` and
#                                        `kiln run --compile`, $KILN_CONFORMANCE_JOBS at a time,
#                                        default 2), the counts the report leads with
# Extra arguments go to kiln_conformance (--filter SUBSTRING, --eager-only, --batch N, --verbose,
# --skip CASE: a case that crashes the process shows last with --verbose); the build
# directory is $KILN_BUILD_DIR (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${KILN_BUILD_DIR:-build}"
python="${KILN_PYTHON:-/usr/bin/python3}"
update=0
args=()
for a in "$@"; do
  if [ "$a" = --update ]; then update=1; else args+=("$a"); fi
done

export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
[ -f "$dir/build.ninja" ] || cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C "$dir" kiln_conformance kiln

cases="$dir/conformance_cases"
# --update always regenerates, so the report speaks for the installed onnx; a check reuses them.
if [ "$update" = 1 ] || [ ! -f "$cases/index.tsv" ] ||
   [ tests/conformance/generate_cases.py -nt "$cases/index.tsv" ]; then
  "$python" tests/conformance/generate_cases.py "$cases"
fi
# The runner builds cells in its own scratch directory; keep any cache writes private too.
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-conformance-cache-XXXXXX)}"
# Cases that crash the process (none today) are listed in tests/conformance/skip.txt.
args+=(--skip-file tests/conformance/skip.txt)
if [ "$update" = 1 ]; then
  exec "$dir/tests/kiln_conformance" --cases "$cases" --update --report docs/conformance.md \
    --baseline tests/conformance/baseline.txt --explanations tests/conformance/explanations.txt \
    --cli "$dir/kiln" \
    --jobs "${KILN_CONFORMANCE_JOBS:-2}" ${args[@]+"${args[@]}"}
fi
exec "$dir/tests/kiln_conformance" --cases "$cases" --baseline tests/conformance/baseline.txt \
  ${args[@]+"${args[@]}"}
