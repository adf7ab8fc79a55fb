#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): install what kiln needs, build, run the
# whole suite, then build and run it again under AddressSanitizer + UndefinedBehaviorSanitizer.
# KILN_SKIP_SANITIZE=1 skips the second pass (for a quick local loop).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
start=$(date +%s)

echo "== build (RelWithDebInfo) =="
bash tools/build.sh build
echo "== PostgreSQL for the hub's store tests =="
KILN_TEST_PG_URL=$(bash tools/pg.sh)
export KILN_TEST_PG_URL
trap 'bash tools/pg.sh stop >/dev/null 2>&1 || true' EXIT
echo "$KILN_TEST_PG_URL"
# Cells minted by the tests go to a private cache, never the user's.
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-test-cache-XXXXXX)}"

echo "== tests =="
ctest --test-dir build --output-on-failure -j"$(nproc)" -LE slow

if [ "${KILN_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== build (ASan + UBSan) =="
  bash tools/build.sh build-asan -DKILN_SANITIZE=ON
  echo "== tests under ASan + UBSan =="
  # oneDNN's JIT and OpenMP runtime keep allocations alive until exit by design.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -LE slow
fi
echo "kiln tests: done in $(( $(date +%s) - start )) s"
