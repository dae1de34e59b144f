#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang into ./build-fuzz and fuzzes each for
# SECONDS_PER_TARGET seconds (default 20) on a copy of its seed corpus fuzz/corpus/<target>/ (the
# repository's corpus is never written). Prints one summary line per target; exits non-zero if any
# target crashed, leaked, timed out or ran out of memory. Findings are kept in
# build-fuzz/findings/<target>/ (see fuzz/README.md). Needs clang and libFuzzer (scripts/install-deps.sh).
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: SECONDS_PER_TARGET must be a positive integer, got '$seconds'" >&2
  exit 2
fi
for tool in clang clang++ cmake; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fuzz: $tool not found; run scripts/install-deps.sh" >&2
    exit 2
  fi
done

build=build-fuzz
echo "fuzz: building fuzz/ into $build with clang"
CC=clang CXX=clang++ cmake -S fuzz -B "$build" >/dev/null
cmake --build "$build" -j"$(nproc)" >"$build/build.log" 2>&1 || { cat "$build/build.log" >&2; exit 1; }

# Symbolized stacks in reports; UBSan reports abort (they are compiled non-recoverable anyway).
if symbolizer=$(command -v llvm-symbolizer || command -v llvm-symbolizer-14); then
  export ASAN_SYMBOLIZER_PATH="$symbolizer"
fi
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# Leaks inside LibTorch itself (the TorchScript target links Debian's uninstrumented library) are not ours.
export LSAN_OPTIONS="suppressions=$PWD/fuzz/lsan-suppressions.txt${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

mapfile -t targets <"$build/fuzz_targets.txt"
failed=0
failed_count=0
summary=()
for target in "${targets[@]}"; do
  [[ -n "$target" ]] || continue
  work="$build/run/$target"
  findings="$build/findings/$target"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$findings"
  seeds=0
  if [[ -d "fuzz/corpus/$target" ]]; then
    cp -R "fuzz/corpus/$target/." "$work/corpus/"
    seeds=$(find "$work/corpus" -type f | wc -l)
  fi
  log="$work/fuzz.log"
  touch "$work/started"  # artifacts newer than this are this run's findings
  echo "fuzz: $target: ${seconds}s from $seeds seeds (log $log)"
  status=0
  # The outer timeout only guards against libFuzzer itself never stopping.
  timeout --kill-after=10 $((seconds + 120)) "$build/${target}_fuzzer" "$work/corpus" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$findings/" >"$log" 2>&1 || status=$?

  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  [[ -n "$execs" ]] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#' || true)
  [[ -n "$execs" ]] || execs=0
  corpus_size=$(find "$work/corpus" -type f | wc -l)
  artifacts=$(find "$findings" -type f -newer "$work/started" 2>/dev/null | sort | paste -sd ' ' -)
  if [[ $status -eq 0 && -n "$done_line" && -z "$artifacts" ]]; then
    echo "    $done_line"
    line="fuzz: $target: ok, $execs execs in ${seconds}s, corpus $seeds -> $corpus_size, no findings"
  else
    failed=1
    failed_count=$((failed_count + 1))
    # The first sanitizer/libFuzzer SUMMARY names the kind; a target's own check names the problem.
    kind=$(grep -m 1 -E '^SUMMARY: ' "$log" | sed 's/^SUMMARY: //' || true)
    check=$(grep -m 1 -E "^${target}_fuzzer: " "$log" || true)
    [[ -z "$check" ]] || kind="${kind:+$kind: }$check"
    [[ $status -ne 124 && $status -ne 137 ]] || kind="libFuzzer did not stop (killed by timeout)"
    echo "---- $target: last lines of $log ----" >&2
    tail -n 60 "$log" >&2
    line="fuzz: $target: FINDING (exit $status: ${kind:-unknown}), $execs execs; reproducer: ${artifacts:-none written} (run: $build/${target}_fuzzer <file>)"
  fi
  echo "$line"
  summary+=("$line")
done

echo "fuzz: summary"
printf '%s\n' "${summary[@]}" | tee "$build/summary.txt"
if ((failed)); then
  echo "fuzz: findings are in $build/findings/ (fuzz/README.md says what to do with them)" >&2
fi
echo "fuzz: $((${#summary[@]} - failed_count)) passed, $failed_count failed"
exit "$failed"
