#!/usr/bin/env bash
# The check_format CTest (label tools): tools/check_format.sh run in scratch git repositories, so
# the format gate of CI is itself shown to fail, and to name the file, when a changed C++ file is
# not formatted; and to leave alone an unformatted file the change did not touch.
#   check_format_test.sh CHECK_FORMAT_SH CLANG_FORMAT_FILE
set -euo pipefail
check=$(realpath "$1")
style=$(realpath "$2")
scratch=$(mktemp -d /tmp/kiln-check-format-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
git init -q -b main .
git config user.name kiln-test
git config user.email kiln-test@localhost
cp "$style" .clang-format

formatted='int Add(int a, int b) { return a + b; }'
unformatted='int  Add( int a,int b ){return a+b;}'
failures=0
# expect RC NEEDLE...: runs the check; the exit code must be RC and the output must hold every
# NEEDLE ("!X" means it must not hold X).
expect() {
  local want_rc=$1 rc=0 out
  shift
  out=$(bash "$check" 2>&1) || rc=$?
  if [ "$rc" != "$want_rc" ]; then
    echo "FAIL: exit $rc, expected $want_rc; output:"
    printf '%s\n' "$out"
    failures=$((failures + 1))
    return
  fi
  for needle in "$@"; do
    if [[ "$needle" == '!'* ]]; then
      if grep -qF -- "${needle#!}" <<<"$out"; then
        echo "FAIL: output holds '${needle#!}':"
        printf '%s\n' "$out"
        failures=$((failures + 1))
      fi
    elif ! grep -qF -- "$needle" <<<"$out"; then
      echo "FAIL: output lacks '$needle':"
      printf '%s\n' "$out"
      failures=$((failures + 1))
    fi
  done
}

# A single commit that holds an unformatted file: nothing changed since, nothing to refuse.
printf '%s\n' "$unformatted" >old.cc
printf '%s\n' "$formatted" >a.cc
git add . && git commit -qm one
expect 0 "single commit"

# The next commit adds an unformatted file: refused, naming it and not the untouched old.cc.
printf '%s\n' "$unformatted" >b.cc
git add b.cc && git commit -qm two
expect 1 "b.cc is not clang-formatted" "!old.cc"

# Formatting it in a further commit passes (the base is HEAD~1 on main).
printf '%s\n' "$formatted" >b.cc
git commit -qam three
expect 0 "against HEAD~1"

# Uncommitted edits and untracked files are part of the change.
printf '%s\n' "$unformatted" >a.cc
printf '%s\n' "$unformatted" >c.h
expect 1 "a.cc is not clang-formatted" "c.h is not clang-formatted"
git checkout -q a.cc
rm c.h

# A branch under review is checked from where it forked from origin/main, every commit of it,
# not just its last.
git update-ref refs/remotes/origin/main HEAD
git checkout -qb topic
printf '%s\n' "$unformatted" >d.cc
git add d.cc && git commit -qm four
printf '%s\n' "$formatted" >e.cc
git add e.cc && git commit -qm five
expect 1 "merge base with origin/main" "d.cc is not clang-formatted" "!e.cc is not"

if [ "$failures" -gt 0 ]; then
  echo "check_format_test: $failures failure(s)"
  exit 1
fi
echo "check_format_test: ok"
