#!/usr/bin/env bash
# Runs one libFuzzer target of fuzz/ (docs/reliability.md): niced, with its dictionary, growing a
# scratch corpus seeded from fuzz/corpus/<target>/ (the committed seeds are never written to).
# Usage: fuzz/run.sh TARGET SECONDS [BUILD_DIR=build-fuzz] [WORK_DIR=/tmp/kiln-fuzz]
# Output: WORK_DIR/TARGET.log; a crash input lands in WORK_DIR/TARGET-artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$1"
seconds="$2"
build="${3:-build-fuzz}"
work="${4:-/tmp/kiln-fuzz}"
mkdir -p "$work/$target-corpus" "$work/$target-artifacts"
dict=()
[[ -f "fuzz/dict/$target.dict" ]] && dict=(-dict="fuzz/dict/$target.dict")
# -timeout: an input that takes 10 s is a hang; -rss_limit_mb: 2 GiB is libFuzzer's default, made
# explicit because an allocation a few bytes of input can ask for beyond it is a finding.
exec nice -n 19 "$build/fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" \
  -artifact_prefix="$work/$target-artifacts/" "$work/$target-corpus" "fuzz/corpus/$target" \
  >"$work/$target.log" 2>&1
