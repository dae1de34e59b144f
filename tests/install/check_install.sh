#!/usr/bin/env bash
# The installed package works from its prefix alone: `cmake --install BUILD --prefix P` into a
# temporary P, then the installed headers (no internal helper; pipesgd/errors.h compiles alone), then
# P/bin/pipesgd (--version, --help, a short train run of 2 workers) and
# P/bin/pipesgdrun (2 ranks import pipesgd.torch from P), with no PYTHONPATH and nothing of the build
# tree on any path.
#
#   tests/install/check_install.sh BUILD_DIR
#
# One line per check (`ok NAME` or `FAIL NAME: why`), then `N passed, M failed`; exit 0 only if none
# failed.
set -u
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 path/to/build" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/pipesgd-install.XXXXXX")
trap 'if [ -n "${KEEP_TMP:-}" ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi' EXIT
P=$TMP/prefix
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1: $2"; }
excerpt() { head -c "${2:-400}" "$1" | tr '\r\n' '^|'; }
# check NAME COMMAND...: passes if COMMAND exits 0 (its output in $TMP/NAME.{out,err}).
check() {
  local name=$1
  shift
  "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  local rc=$?
  if [ $rc -eq 0 ]; then pass "$name"; else fail "$name" "exit $rc [stderr: $(excerpt "$TMP/$name.err")] [stdout: $(excerpt "$TMP/$name.out" 200)]"; fi
  return $rc
}
# A clean environment: no PYTHONPATH, a PATH without the build tree, run from an empty directory.
clean() { env -u PYTHONPATH PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin OMP_NUM_THREADS=1 "$@"; }
mkdir -p "$TMP/cwd"
cd "$TMP/cwd" || exit 1

if ! check install cmake --install "$BUILD" --prefix "$P"; then
  echo "$PASSED passed, $FAILED failed"
  exit 1
fi
for file in bin/pipesgd bin/pipesgdrun; do
  if [ -x "$P/$file" ]; then pass "installed/$file"; else fail "installed/$file" "not an executable in $P"; fi
done

# The installed headers are the API and its exception classes, no internal helper (core/error.h's
# message builders and assertion macro). Word-bounded: the API's own join collective and
# "concatenated" are not helpers.
leaks=$(grep -rEn '\bconcat\b|\bjoin_and\b|\bjoin\(|PIPESGD_ASSERT|assertion_failed|pipesgd/core/error\.h' "$P/include" 2>&1)
if [ -z "$leaks" ] && [ ! -e "$P/include/pipesgd/core/error.h" ]; then
  pass installed-headers-no-internal-helpers
else
  fail installed-headers-no-internal-helpers "$(printf '%s' "$leaks" | head -c 400 | tr '\n' '|')"
fi
# pipesgd/errors.h alone (no LibTorch): the exception classes, catchable by their base.
cat >"$TMP/errors_consumer.cpp" <<'CPP'
#include <pipesgd/errors.h>
int main() {
  try {
    throw pipesgd::CommTimeoutError("rank 1 timed out", 1);
  } catch (const pipesgd::CommError& error) {
    return dynamic_cast<const pipesgd::CommTimeoutError&>(error).peer() == 1 ? 0 : 1;
  }
  return 2;
}
CPP
check errors-header-consumer c++ -std=c++17 -I"$P/include" "$TMP/errors_consumer.cpp" -o "$TMP/errors_consumer" &&
  check errors-header-consumer-runs "$TMP/errors_consumer"

check pipesgd-version clean "$P/bin/pipesgd" --version && grep -q "pipesgd" "$TMP/pipesgd-version.out" ||
  fail pipesgd-version-says-pipesgd "stdout: $(excerpt "$TMP/pipesgd-version.out")"
check pipesgd-help clean "$P/bin/pipesgd" --help && grep -q "train" "$TMP/pipesgd-help.out" ||
  fail pipesgd-help-lists-train "stdout: $(excerpt "$TMP/pipesgd-help.out")"
DATA=/usr/share/datasets/fashion-mnist
if [ -f "$DATA/train-images-idx3-ubyte.gz" ] || [ -f "$DATA/train-images-idx3-ubyte" ]; then
  TRAIN_DATA=(--data-dir "$DATA")
else
  TRAIN_DATA=(--data synthetic)  # the data set is not on this machine: the run itself still counts
fi
check pipesgd-train clean timeout -k 5 300 "$P/bin/pipesgd" train --workers 2 --iters 20 --quiet --no-eval \
  "${TRAIN_DATA[@]}" --out "$TMP/run" && [ -f "$TMP/run/summary.json" ] ||
  fail pipesgd-train-wrote-summary "no $TMP/run/summary.json"

# pipesgdrun from the prefix: the ranks import pipesgd.torch from P (not from the build tree).
allow=()
if [ "$(id -u)" -eq 0 ]; then allow=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); fi
check pipesgdrun-2-ranks clean "${allow[@]}" timeout -k 5 300 "$P/bin/pipesgdrun" -np 2 /usr/bin/python3 -c \
  "import os, pipesgd, pipesgd.torch as hvd; hvd.init(); os.write(1, f'[size {hvd.size()} from {pipesgd.__file__}]\n'.encode())"
if [ "$(grep -oF "[size 2 from $P/" "$TMP/pipesgdrun-2-ranks.out" | wc -l)" -eq 2 ]; then
  pass pipesgdrun-ranks-import-from-prefix
else
  fail pipesgdrun-ranks-import-from-prefix "expected '[size 2 from $P/...' twice: $(excerpt "$TMP/pipesgdrun-2-ranks.out")"
fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
