#!/usr/bin/env bash
# The real-model corpus in one command: installs the test packages (python3-torch,
# python3-torchvision), builds the kiln binary, makes every corpus model at every opset torch's
# exporter supports among 9, 11, 13 and 17 (tools/corpus.py: random weights, nothing downloaded,
# realistic input sizes), drives each through the kiln command line and writes docs/models.md.
#   bash tools/corpus.sh                 the whole corpus (about an hour on 2 loaded cores)
#   bash tools/corpus.sh --fast          the CI subset (the corpus_fast CTest), small inputs
# Extra arguments go to tools/corpus.py (--only NAME,..., --opsets 11,17, --jobs N, --threads N).
# Files are made under $KILN_CORPUS_DIR (default /tmp/kiln-corpus) and reused while corpus.py and
# torch are unchanged; cells go to a private cache there. Runs at nice 10.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh --tests
KILN_TARGETS=kiln bash tools/build.sh build >/dev/null
work="${KILN_CORPUS_DIR:-/tmp/kiln-corpus}"
mkdir -p "$work"
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-$work/cache}"
fast=0
for a in "$@"; do [ "$a" = --fast ] && fast=1; done
report=docs/models.md
[ "$fast" = 1 ] && report="$work/models-fast.md"
exec nice -n 10 /usr/bin/python3 tools/corpus.py --kiln build/kiln --work "$work" \
  --report "$report" "$@"
