#!/usr/bin/env bash
# Runs the fixed short trainings of tests/checksums/training.txt and compares each run's weights
# checksum (summary.json) with the recorded one: training must stay bit for bit what it was.
#
#   scripts/check-training-checksums.sh [--record] [path/to/pipesgd]
#
# --record writes the checksums this build gives into the file instead of comparing. Prints one
# line per run (`ok`, `DIFF` or `FAIL`) and a summary; exits 0 only if every checksum matched.
# Compare on the machine the file was recorded on (see the file's header).
set -u
cd "$(dirname "$0")/.."
record=0
if [ "${1:-}" = "--record" ]; then record=1; shift; fi
bin=${1:-build/pipesgd}
list=tests/checksums/training.txt
[ -x "$bin" ] || { echo "check-training-checksums: $bin is not an executable (build first)" >&2; exit 2; }
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(--data synthetic --iters 30 --quiet --no-eval)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipesgd-checksums.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
out_list=$tmp/list
matched=0 differed=0 failed=0
while IFS= read -r line; do
  case $line in \#*|'') echo "$line" >>"$out_list"; continue ;; esac
  IFS='|' read -r name launcher arguments expected <<<"$line"
  name=$(echo "$name" | xargs); launcher=$(echo "$launcher" | xargs); expected=$(echo "$expected" | xargs)
  read -r -a args <<<"$arguments"
  dir=$tmp/$name
  case $launcher in
    threads) timeout 300 "$bin" train "${args[@]}" "${common[@]}" --out "$dir" </dev/null >"$tmp/$name.log" 2>&1 ;;
    mpi*) timeout 300 mpirun -np "${launcher#mpi}" --oversubscribe "$bin" train --transport mpi "${args[@]}" \
            "${common[@]}" --out "$dir" </dev/null >"$tmp/$name.log" 2>&1 ;;
    *) echo "check-training-checksums: unknown launcher '$launcher' in line: $line" >&2; exit 2 ;;
  esac
  rc=$?
  got=$(sed -n 's/.*"weights_checksum": *"\([0-9a-f]*\)".*/\1/p' "$dir/summary.json" 2>/dev/null)
  if [ $rc -ne 0 ] || [ -z "$got" ]; then
    failed=$((failed + 1))
    echo "FAIL $name (exit $rc): $(tail -c 300 "$tmp/$name.log" | tr '\n' '|')"
    got=FAILED
  elif [ $record -eq 1 ]; then
    echo "recorded $name $got"
  elif [ "$got" = "$expected" ]; then
    matched=$((matched + 1))
    echo "ok $name $got"
  else
    differed=$((differed + 1))
    echo "DIFF $name: $got, recorded $expected"
  fi
  echo "$name | $launcher | $(echo "$arguments" | xargs) | $got" >>"$out_list"
done <"$list"
if [ $record -eq 1 ]; then
  [ $failed -eq 0 ] || { echo "check-training-checksums: $failed runs failed; $list left unchanged" >&2; exit 1; }
  cp "$out_list" "$list"
  echo "wrote $list"
  exit 0
fi
echo "$matched matched, $differed differed, $failed failed"
[ $differed -eq 0 ] && [ $failed -eq 0 ]
