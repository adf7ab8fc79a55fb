#!/usr/bin/env bash
# The format gate of tools/test.sh (and so of CI): every C++ file a change adds or modifies must be
# byte for byte what clang-format (Debian's, with the repository's .clang-format) makes of it.
# Files the change does not touch are not checked, so the rule is the developers' guide's own:
# clang-format the files you touch.
#
# The change is the difference between a base commit and the working tree (uncommitted edits and
# untracked files included). The base is the first of these that applies:
#   $KILN_FORMAT_BASE            a commit, branch or tag named by hand
#   merge-base with origin/main  (or the local main) when HEAD is not already on it: a branch
#                                under review, with everything it changed since it forked
#   HEAD~1                       a commit on main itself; for a merge commit, its first parent,
#                                so the merged branch's whole change
#   HEAD                         a checkout with a single commit: only uncommitted edits
# Works in the repository that holds the current directory (tools/check_format_test.sh runs it in
# scratch repositories). Exit 0 when every changed file is formatted (or none changed), 1 naming
# each file that is not, 2 when the check cannot run.
set -euo pipefail
clang_format="${CLANG_FORMAT:-clang-format}"
if ! command -v "$clang_format" >/dev/null 2>&1; then
  echo "check_format: '$clang_format' is not installed (bash tools/deps.sh --tests installs it)" >&2
  exit 2
fi
if ! root=$(git rev-parse --show-toplevel 2>/dev/null); then
  echo "check_format: $(pwd) is not a git checkout, so no change to check" >&2
  exit 2
fi
cd "$root"
if ! head=$(git rev-parse -q --verify HEAD); then
  echo "check_format: no commit yet; nothing to compare against"
  exit 0
fi

base="${KILN_FORMAT_BASE:-}"
how="KILN_FORMAT_BASE"
if [ -z "$base" ]; then
  for upstream in origin/main main; do
    git rev-parse -q --verify "$upstream" >/dev/null || continue
    mb=$(git merge-base HEAD "$upstream" 2>/dev/null) || continue
    if [ "$mb" != "$head" ]; then
      base=$mb
      how="merge base with $upstream"
    fi
    break
  done
fi
if [ -z "$base" ]; then
  if base=$(git rev-parse -q --verify 'HEAD~1'); then
    how="HEAD~1"
  else
    base=$head
    how="HEAD (a single commit: only uncommitted edits)"
  fi
fi
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
  echo "check_format: base '$base' is not a commit" >&2
  exit 2
fi

mapfile -t files < <({
  git diff --name-only --diff-filter=d "$base" --
  git ls-files --others --exclude-standard
} | grep -E '\.(cc|h|cpp|hpp|cxx|hh)$' | sort -u)
echo "check_format: ${#files[@]} changed C++ file(s) against $how ($(git rev-parse --short "$base"))"

bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! out=$("$clang_format" --dry-run --Werror "$f" 2>&1); then
    bad+=("$f")
    echo "check_format: $f is not clang-formatted:"
    printf '%s\n' "$out" | head -n 6 | sed 's/^/  /'
  fi
done
if [ "${#bad[@]}" -gt 0 ]; then
  echo "check_format: ${#bad[@]} file(s) not formatted; fix with: clang-format -i ${bad[*]}"
  exit 1
fi
