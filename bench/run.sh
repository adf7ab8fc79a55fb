#!/usr/bin/env bash
# kiln's benchmark: kiln (eager, compiled) side by side with ONNX Runtime and PyTorch, per example
# model and shape class, at each thread count given (default: 1 2).
#
#   bench/run.sh [T ...]
#
# Environment knobs:
#   BENCH_MODELS    example names (default: every examples/*/ with a model.onnx)
#   BENCH_ENGINES   subset of "kiln ort torch" (default: all three)
#   BENCH_ARGS      timing options passed to every engine's harness, e.g. "--min-seconds 0.5"
#                   (ort_bench.js / torch_bench.py; default --warmup 5 --runs 30 --min-seconds 1
#                   --max-seconds 5)
#   KILN            the kiln binary (default build/kiln)
#
# Writes every JSON line to bench/results/<UTC stamp>.jsonl (first line: {"meta": ...}), stderr
# of every run to the matching .log, and prints the markdown report (bench/report.py).
set -uo pipefail

BENCH="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$BENCH")"
cd "$ROOT" || exit 1

THREADS=("$@")
[ ${#THREADS[@]} -eq 0 ] && THREADS=(1 2)
for t in "${THREADS[@]}"; do
  [[ "$t" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: thread count '$t' is not a positive integer" >&2; exit 2; }
done
ENGINES=" ${BENCH_ENGINES:-kiln ort torch} "
KILN="${KILN:-build/kiln}"
read -r -a TIMING <<< "${BENCH_ARGS:-}"
TORCH_PY=/usr/bin/python3   # Debian's python: has python3-torch (the pyenv python3 does not)

# PyTorch runs with OMP_WAIT_POLICY=PASSIVE: its idle OpenMP workers would otherwise spin against
# its OpenBLAS threads on 2 cores. Each engine runs alone in its own process, so the others keep
# their own defaults (kiln's oneDNN/OpenMP team and ORT's own pool spin briefly, then sleep);
# forcing PASSIVE on kiln makes every parallel region pay a futex wake-up (2x slower at T=2).
TORCH_ENV=(env OMP_WAIT_POLICY=PASSIVE)
unset OMP_WAIT_POLICY

NOTES=()
note() { NOTES+=("$*"); echo "run.sh: $*" >&2; }

# A python3 for the small helper scripts (no numpy needed).
PY=python3
command -v "$PY" >/dev/null 2>&1 && "$PY" -c 'import tomllib' 2>/dev/null || PY="$TORCH_PY"

# ---- dependencies -------------------------------------------------------------------------------
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

if [[ "$ENGINES" == *" ort "* ]]; then
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    note "node/npm not found: ONNX Runtime skipped (install Node.js 18+)"
    ENGINES="${ENGINES/ ort / }"
  elif [ ! -d "$BENCH/node_modules/onnxruntime-node" ]; then
    echo "run.sh: installing onnxruntime-node (npm ci in bench/)" >&2
    # The package's postinstall would fetch CUDA binaries from nuget.org; CPU needs none.
    if ! (cd "$BENCH" && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund >&2); then
      note "npm ci failed: ONNX Runtime skipped"
      ENGINES="${ENGINES/ ort / }"
    fi
  fi
fi

if [[ "$ENGINES" == *" torch "* ]]; then
  if ! "$TORCH_PY" -c 'import torch, numpy, onnx' 2>/dev/null; then
    echo "run.sh: installing python3-torch (apt-get)" >&2
    if ! as_root env DEBIAN_FRONTEND=noninteractive sh -c \
         'apt-get update -qq && apt-get install -y -qq python3-torch python3-numpy python3-onnx' >&2 \
       || ! "$TORCH_PY" -c 'import torch, numpy, onnx' 2>/dev/null; then
      note "python3-torch not available for $TORCH_PY: PyTorch skipped"
      ENGINES="${ENGINES/ torch / }"
    fi
  fi
fi

if [[ "$ENGINES" == *" kiln "* ]]; then
  if [ ! -x "$KILN" ]; then
    note "$KILN not built (tools/build.sh): kiln skipped"
    ENGINES="${ENGINES/ kiln / }"
  elif ! "$KILN" --help 2>&1 | grep -qE '^[[:space:]]+bench([[:space:]]|$)'; then
    note "$KILN has no 'bench' subcommand yet: kiln skipped"
    ENGINES="${ENGINES/ kiln / }"
  fi
fi

# ---- output -------------------------------------------------------------------------------------
mkdir -p "$BENCH/results"
STAMP="$(date -u +%Y%m%d-%H%M%S)"
OUT="$BENCH/results/$STAMP.jsonl"
LOG="$BENCH/results/$STAMP.log"
: > "$LOG"

meta() {
  local cpu git ort torchv
  cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
  git="$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')"
  ort="$(cd "$BENCH" && node -p "require('onnxruntime-node/package.json').version" 2>/dev/null || echo '-')"
  torchv="$("$TORCH_PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '-')"
  "$PY" - "$STAMP" "$(nproc)" "$cpu" "$git" "$ort" "$torchv" "${THREADS[*]}" "$ENGINES" <<'EOF'
import json, os, sys
stamp, nproc, cpu, git, ort, torchv, threads, engines = sys.argv[1:9]
m = {"date_utc": stamp, "cpus": int(nproc), "cpu": cpu, "git": git, "threads": threads,
     "engines": engines.split(), "onnxruntime-node": ort, "torch": torchv,
     "OMP_WAIT_POLICY": "PASSIVE for torch only",
     "loadavg_start": open("/proc/loadavg").read().split()[0]}
for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    if os.environ.get(k) is not None:
        m[k + " (environment)"] = os.environ[k]
print(json.dumps({"meta": m}))
EOF
}
meta > "$OUT"
load1="$(cut -d' ' -f1 /proc/loadavg)"
if awk -v l="$load1" 'BEGIN { exit !(l > 0.5) }'; then
  note "load average $load1 at start: something else is running, expect noisy numbers"
fi
[ -n "${OPENBLAS_CORETYPE:-}" ] && note "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE is set in this environment (recorded in the meta line)"

# ---- runs ---------------------------------------------------------------------------------------
# One process per engine and (model, class): peak-RSS numbers are per process.
run_one() {  # label, command...
  local label="$1"; shift
  local tmp rc
  tmp="$(mktemp)"
  echo "### $label: $*" >> "$LOG"
  "$@" > "$tmp" 2>> "$LOG"
  rc=$?
  grep -E '^\{' "$tmp" >> "$OUT"
  grep -E '^\{' "$tmp" | sed "s/^/  /" >&2
  [ $rc -ne 0 ] && note "$label failed (rc $rc; see $LOG)"
  rm -f "$tmp"
}

if [ -n "${BENCH_MODELS:-}" ]; then
  read -r -a MODELS <<< "$BENCH_MODELS"
else
  MODELS=()
  for d in examples/*/; do [ -f "$d/model.onnx" ] && MODELS+=("$(basename "$d")"); done
fi

start=$SECONDS
for t in "${THREADS[@]}"; do
  for m in "${MODELS[@]}"; do
    dir="examples/$m"
    mapfile -t CLASSES < <("$PY" "$BENCH/classes.py" "$dir" 2>>"$LOG")
    [ ${#CLASSES[@]} -eq 0 ] && { note "$m: no shape classes"; continue; }
    for c in "${CLASSES[@]}"; do
      echo "run.sh: T=$t $m $c" >&2
      if [[ "$ENGINES" == *" kiln "* ]]; then
        run_one "kiln $m $c T=$t" "$KILN" bench "$dir/model.onnx" --class "$c" --threads "$t" --json
      fi
      if [[ "$ENGINES" == *" ort "* ]]; then
        run_one "onnxruntime $m $c T=$t" node "$BENCH/ort_bench.js" --threads "$t" "${TIMING[@]}" \
          --class "$c" "$dir"
      fi
      if [[ "$ENGINES" == *" torch "* ]]; then
        for e in eager jit_frozen; do
          run_one "torch_$e $m $c T=$t" "${TORCH_ENV[@]}" "$TORCH_PY" "$BENCH/torch_bench.py" --engine "$e" \
            --threads "$t" "${TIMING[@]}" --class "$c" "$dir"
        done
      fi
    done
  done
done
load1="$(cut -d' ' -f1 /proc/loadavg)"
printf '{"meta": {"loadavg_end": "%s", "seconds": %d}}\n' "$load1" "$((SECONDS - start))" >> "$OUT"
echo "run.sh: benchmark took $((SECONDS - start)) s; results in ${OUT#"$ROOT"/}" >&2

echo
"$PY" "$BENCH/report.py" "$OUT"
if [ ${#NOTES[@]} -gt 0 ]; then
  echo
  echo "Notes:"
  for n in "${NOTES[@]}"; do echo "- $n"; done
fi
