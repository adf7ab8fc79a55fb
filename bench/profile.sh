#!/usr/bin/env bash
# Where a compiled cell's time goes: `perf record` over `kiln bench --engine compiled`, with the
# cell's own symbols and oneDNN's JIT kernels named, summed per kernel of the cell.
#
#   bench/profile.sh MODEL.onnx CLASS [THREADS] [RUNS]
#   e.g. bench/profile.sh bench/.models/<tag>/bert/model.onnx 'input_ids=[8,128]' 2
#
# The cell is minted first (so the profile holds runs only, no compile or proof). perf resolves
# oneDNN's JIT code through the map oneDNN writes with DNNL_JIT_PROFILE=2; the cell's .so is
# copied back to where the process loaded it from (a private directory removed at exit), so perf
# finds its symbols; generated kernels are `kiln_par_tramp<kiln_eN_run::{lambda#K}>`, numbered
# in source order, which the summary maps back to the kernel labels of `source/cell.cc`.
# Needs perf (linux-perf). Uses $KILN_CACHE_DIR like every kiln command.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$1"
CLASS="$2"
T="${3:-1}"
RUNS="${4:-20}"
KILN="${KILN:-build/kiln}"
command -v perf >/dev/null || { echo "profile.sh: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/kiln-profile.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

"$KILN" bench "$MODEL" --class "$CLASS" --engine compiled --mint-only --threads "$T" >/dev/null
DNNL_JIT_PROFILE=2 perf record -q -o "$WORK/perf.data" "$KILN" bench "$MODEL" --class "$CLASS" \
  --threads "$T" --engine compiled --runs "$RUNS" --warmup 2 --max-seconds 60 --json \
  > "$WORK/bench.json" 2>/dev/null
cat "$WORK/bench.json"
REF=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cell"])' "$WORK/bench.json")
KEY="${REF%@*}"
CACHE="${KILN_CACHE_DIR:-$HOME/.cache/kiln}"
mkdir -p "$WORK/cell"
tar -xf "$CACHE/cells/$KEY/cell.tar" -C "$WORK/cell"
LOADED=$(perf script -i "$WORK/perf.data" --show-mmap-events 2>/dev/null |
  grep -m1 -oE '/[^ ]*/cell\.so' || true)
if [ -n "$LOADED" ]; then
  mkdir -p "$(dirname "$LOADED")"
  cp "$WORK/cell/cell.so" "$LOADED"
fi
perf report -i "$WORK/perf.data" --no-children --sort dso,sym --stdio 2>/dev/null |
  grep -E '^ +[0-9.]+%' > "$WORK/report.txt" || true
[ -n "$LOADED" ] && rm -rf "$(dirname "$LOADED")"
python3 - "$WORK/report.txt" "$WORK/cell/source/cell.cc" <<'PY'
import re, sys
report, source = sys.argv[1], sys.argv[2]
# Lambda number -> kernel label, per entry function, in source order.
labels, entry, kernel, count = {}, None, None, {}
for line in open(source):
    m = re.match(r'extern "C" KILN_HIDDEN int (kiln_e\d+)_run\(', line)
    if m:
        entry = m.group(1)
        count[entry] = 0
    m = re.match(r'\s*// kernel \d+: (.*)', line)
    if m and entry:
        kernel = m.group(1)
    if entry and "auto kiln_body" in line:
        count[entry] += 1
        labels[(entry, count[entry])] = kernel
groups = {}
total = 0.0
for line in open(report):
    m = re.match(r'\s*([0-9.]+)%\s+(\[JIT\] tid \d+|\S+)\s+\[.\]\s+(.*)', line)
    if not m:
        continue
    pct, dso, sym = float(m.group(1)), m.group(2), m.group(3).strip()
    total += pct
    lm = re.search(r'(kiln_e\d+)_run::\{lambda\(long, long\)#(\d+)\}', sym)
    if lm:
        key = "cell loop: " + re.sub(r'\+\[.*\]', '+epilogue', labels.get((lm.group(1), int(lm.group(2))), "?"))
    elif "cell.so" in dso:
        key = "cell: " + sym
    elif dso.startswith("[JIT]"):
        key = "oneDNN JIT: " + sym
    elif "libdnnl" in dso:
        key = "libdnnl (outside JIT kernels: drivers, reorders)"
    elif "libgomp" in dso:
        key = "libgomp (OpenMP team: fork/join, barrier, spin)"
    elif "kernel" in dso:
        key = "kernel (page faults, scheduling, syscalls)"
    else:
        key = dso + ": " + sym
    groups[key] = groups.get(key, 0.0) + pct
print("\n| share of samples | where |\n|--:|---|")
for k, v in sorted(groups.items(), key=lambda kv: -kv[1])[:25]:
    print("| %5.1f%% | %s |" % (v, k))
print("\n(%.1f%% of samples listed; the rest under 0.05%% each)" % total)
PY
