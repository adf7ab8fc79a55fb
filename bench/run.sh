#!/usr/bin/env bash
# kiln's benchmark: kiln (eager, compiled) side by side with ONNX Runtime and PyTorch, per model
# and shape class, at each thread count given (default: 1 2), one engine per process.
#
#   bench/run.sh [T ...]
#
# Two sets of models:
#   realistic (default)  bench/models.py's models of real sizes (ResNet-50, MobileNetV3-Large, a
#                        BERT-base-like encoder, a UNet denoiser with attention, a wide MLP),
#                        exported by torch at bench time into bench/.models/<hash>/ (never
#                        committed; reused while models.py and torch are unchanged). Also
#                        measures the kernel library's SGEMM peak at each T (for GFLOP/s) and
#                        kiln's x86-64-v4 (AVX-512) cell variant beside the fleet default.
#   examples             examples/*/ (the tiny models the tests use)
#
# Environment knobs:
#   BENCH_SET       realistic | examples
#   BENCH_MODELS    model names (default: every model of the set)
#   BENCH_ENGINES   subset of "kiln ort torch" (default: all three)
#   BENCH_ARGS      timing options passed to the peers' harnesses, e.g. "--min-seconds 0.5"
#                   (ort_bench.js / torch_bench.py; default --warmup 5 --runs 30 --min-seconds 1
#                   --max-seconds 5)
#   BENCH_KILN_SM   extra sm levels to mint and time kiln compiled at (realistic set; default
#                   x86-64-v4 when this CPU runs it; "" for none)
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
SET="${BENCH_SET:-realistic}"
[[ "$SET" == realistic || "$SET" == examples ]] ||
  { echo "run.sh: BENCH_SET=$SET: expected realistic or examples" >&2; exit 2; }
KILN="${KILN:-build/kiln}"
read -r -a TIMING <<< "${BENCH_ARGS:-}"
TORCH_PY=/usr/bin/python3   # Debian's python: has python3-torch (the pyenv python3 does not)

# PyTorch runs with OMP_WAIT_POLICY=PASSIVE: its idle OpenMP workers would otherwise spin against
# its other threads on 2 cores. Each engine runs alone in its own process, so the others keep
# their own defaults: ORT's own pool; kiln's one OpenMP team (shared by oneDNN and its generated
# loops), whose barrier spin the kiln binary shortens itself (cli/main.cc).
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

need_py="import torch, numpy, onnx"
apt_py="python3-torch python3-numpy python3-onnx"
if [ "$SET" = realistic ]; then
  need_py="$need_py, torchvision"
  apt_py="$apt_py python3-torchvision"
fi
if [[ "$ENGINES" == *" torch "* || "$SET" == realistic ]]; then
  if ! "$TORCH_PY" -c "$need_py" 2>/dev/null; then
    echo "run.sh: installing $apt_py (apt-get)" >&2
    if ! as_root env DEBIAN_FRONTEND=noninteractive sh -c \
         "apt-get update -qq && apt-get install -y -qq $apt_py" >&2 \
       || ! "$TORCH_PY" -c "$need_py" 2>/dev/null; then
      if [ "$SET" = realistic ]; then
        echo "run.sh: the realistic set is exported by torch: $apt_py needed for $TORCH_PY" >&2
        exit 1
      fi
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
  "$PY" - "$STAMP" "$(nproc)" "$cpu" "$git" "$ort" "$torchv" "${THREADS[*]}" "$ENGINES" "$SET" <<'PYEOF'
import json, os, sys
stamp, nproc, cpu, git, ort, torchv, threads, engines, bset = sys.argv[1:10]
m = {"date_utc": stamp, "set": bset, "cpus": int(nproc), "cpu": cpu, "git": git,
     "threads": threads, "engines": engines.split(), "onnxruntime-node": ort, "torch": torchv,
     "OMP_WAIT_POLICY": "PASSIVE for torch only",
     "loadavg_start": open("/proc/loadavg").read().split()[0]}
for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
          "KILN_SM_CEILING", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "GLIBC_TUNABLES"):
    if os.environ.get(k) is not None:
        m[k + " (environment)"] = os.environ[k]
print(json.dumps({"meta": m}))
PYEOF
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

start=$SECONDS
if [ "$SET" = examples ]; then
  if [ -n "${BENCH_MODELS:-}" ]; then
    read -r -a MODELS <<< "$BENCH_MODELS"
  else
    MODELS=()
    for d in examples/*/; do [ -f "$d/model.onnx" ] && MODELS+=("$(basename "$d")"); done
  fi
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
            run_one "torch_$e $m $c T=$t" "${TORCH_ENV[@]}" "$TORCH_PY" "$BENCH/torch_bench.py" \
              --engine "$e" --threads "$t" "${TIMING[@]}" --class "$c" "$dir"
          done
        fi
      done
    done
  done
else
  # ---- the realistic set ------------------------------------------------------------------------
  tag="$(sha256sum "$BENCH/models.py" | cut -c1-12)-$("$TORCH_PY" -c 'import torch; print(torch.__version__)')"
  MODELS_DIR="${BENCH_MODELS_DIR:-$BENCH/.models/$tag}"
  read -r -a ONLY <<< "${BENCH_MODELS:-}"
  echo "run.sh: exporting the realistic set into ${MODELS_DIR#"$ROOT"/}" >&2
  if ! nice -n 10 "$TORCH_PY" "$BENCH/models.py" export "$MODELS_DIR" "${ONLY[@]}" 2>>"$LOG"; then
    echo "run.sh: bench/models.py export failed (see $LOG)" >&2
    exit 1
  fi
  # One {"model_info": ...} line per (model, class): its multiply-adds and what the report checks.
  mapfile -t JOBS < <("$PY" "$BENCH/report.py" --jobs "$MODELS_DIR" "${ONLY[@]}")
  [ ${#JOBS[@]} -eq 0 ] && { echo "run.sh: no models in $MODELS_DIR" >&2; exit 1; }
  for j in "${JOBS[@]}"; do printf '%s\n' "${j%%$'\t'*}" >> "$OUT"; done

  # Cell variants: the fleet default (the sm ceiling, x86-64-v3) and, where this CPU runs it,
  # x86-64-v4 (AVX-512 in the generated loops; the kernel library picks its ISA at run time).
  if [ -z "${BENCH_KILN_SM+set}" ]; then
    BENCH_KILN_SM=""
    if grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo &&
       grep -qw avx512vl /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo; then
      BENCH_KILN_SM="x86-64-v4"
    fi
  fi
  read -r -a VARIANTS <<< "$BENCH_KILN_SM"

  if [[ "$ENGINES" == *" kiln "* ]]; then
    for t in "${THREADS[@]}"; do
      run_one "oneDNN sgemm peak T=$t" "$KILN" bench --sgemm-peak --threads "$t" --json
    done
    # Mint every cell first (compile, strict gate, fence), so each timed process only binds it
    # from the local store and its peak memory holds no proof runs.
    for j in "${JOBS[@]}"; do
      IFS=$'\t' read -r _ m c <<< "$j"
      for sm in "" "${VARIANTS[@]}"; do
        echo "run.sh: mint $m $c ${sm:-(default sm)}" >&2
        echo "### mint $m $c ${sm:-(default sm)}" >> "$LOG"
        if ! env ${sm:+KILN_SM_CEILING="$sm"} "$KILN" bench "$MODELS_DIR/$m/model.onnx" --class "$c" \
               --engine compiled --mint-only --threads 2 >> "$LOG" 2>&1; then
          note "kiln mint $m $c ${sm:-(default sm)} failed (see $LOG)"
        fi
      done
    done
  fi

  KT=(--warmup 3 --runs 30 --max-seconds 5)
  for t in "${THREADS[@]}"; do
    for j in "${JOBS[@]}"; do
      IFS=$'\t' read -r _ m c <<< "$j"
      dir="$MODELS_DIR/$m"
      echo "run.sh: T=$t $m $c" >&2
      if [[ "$ENGINES" == *" kiln "* ]]; then
        for e in eager compiled; do
          run_one "kiln_$e $m $c T=$t" "$KILN" bench "$dir/model.onnx" --class "$c" --threads "$t" \
            --engine "$e" "${KT[@]}" --json
        done
        for sm in "${VARIANTS[@]}"; do
          label="kiln_compiled_${sm##*-}"
          run_one "$label $m $c T=$t" env KILN_SM_CEILING="$sm" "$KILN" bench "$dir/model.onnx" \
            --class "$c" --threads "$t" --engine compiled "${KT[@]}" --json --label "$label"
        done
      fi
      if [[ "$ENGINES" == *" ort "* ]]; then
        run_one "onnxruntime $m $c T=$t" node "$BENCH/ort_bench.js" --threads "$t" "${TIMING[@]}" \
          --class "$c" "$dir"
      fi
      if [[ "$ENGINES" == *" torch "* ]]; then
        for e in eager jit_frozen; do
          run_one "torch_$e $m $c T=$t" "${TORCH_ENV[@]}" "$TORCH_PY" "$BENCH/torch_bench.py" \
            --engine "$e" --threads "$t" "${TIMING[@]}" --class "$c" "$dir"
        done
      fi
    done
  done
fi
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
