#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): install what kiln needs, check the format
# of the C++ files this change touches (tools/check_format.sh), build with warnings as errors, run
# the whole suite, then build and run it again under AddressSanitizer + UndefinedBehaviorSanitizer
# (warnings are errors in both builds).
# KILN_SKIP_SANITIZE=1 skips the second pass (for a quick local loop).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Each phase's wall time, printed as it ends and again as a table at the end, so the CI budget
# (90 minutes on 2 cores; the suite keeps under 45) is visible in every run.
phases=()
phase_start=$start
phase_done() {
  local now
  now=$(date +%s)
  phases+=("$(printf '%-22s %5d s' "$1" $((now - phase_start)))")
  echo "-- $1: $((now - phase_start)) s"
  phase_start=$now
}
report() {
  local rc=$?
  bash tools/pg.sh stop >/dev/null 2>&1 || true
  echo "== phase times =="
  printf '%s\n' "${phases[@]}"
  echo "total                  $(( $(date +%s) - start )) s (exit $rc)"
}
trap report EXIT

echo "== deps =="
# --tests: also python3-torch and python3-torchvision, for the real-model corpus subset.
bash tools/deps.sh --tests
phase_done deps

echo "== format of changed C++ files =="
bash tools/check_format.sh
phase_done format

# Warnings are errors in this build: CI is where a new warning must stop, not scroll past.
echo "== build (RelWithDebInfo) =="
bash tools/build.sh build -DKILN_WERROR=ON
phase_done build
echo "== PostgreSQL for the hub's store tests =="
KILN_TEST_PG_URL=$(bash tools/pg.sh)
export KILN_TEST_PG_URL
echo "$KILN_TEST_PG_URL"
# Cells minted by the tests go to a private cache, never the user's.
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-test-cache-XXXXXX)}"

echo "== tests =="
ctest --test-dir build --output-on-failure -j"$(nproc)" -LE slow
phase_done tests

if [ "${KILN_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== build (ASan + UBSan) =="
  # With KILN_WERROR too: at -O1 under the sanitizers g++ analyses differently than at -O2, and a
  # warning only this build sees still fails the run.
  bash tools/build.sh build-asan -DKILN_SANITIZE=ON -DKILN_WERROR=ON
  phase_done "sanitizer build"
  echo "== tests under ASan + UBSan =="
  # oneDNN's JIT and OpenMP runtime keep allocations alive until exit by design. The `tools`
  # tests (layering, format, function lengths, install steps) read the sources, not a build, so
  # the first pass has already run them.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -LE 'slow|tools'
  phase_done "sanitizer tests"
fi
