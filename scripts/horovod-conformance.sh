#!/usr/bin/env bash
# Horovod's own PyTorch test suite (its test/parallel/test_torch.py) run against pipesgd.torch: a
# measurement of how much of Horovod's API pipesgd.torch honours, and with --min-pass-rate a gate
# (ctest's horovod_conformance, tests/python/CMakeLists.txt). The suite is reference material kept
# OUTSIDE the repository, in ../shared/conformance/horovod beside the repository root (see its
# README.md); it is never copied into the repository. At each run this script copies test_torch.py
# and utils/ into a fresh temporary directory, changes the one line `import horovod.torch as hvd` to
# `import pipesgd.torch as hvd`, guards utils/common.py's import of horovod.runner.util.threads
# (unused by test_torch.py), and starts one pytest per rank under mpirun. Builds and installs
# nothing: give the build directory that holds python/ (the pipesgd.torch package).
#
#   bash scripts/horovod-conformance.sh [--ranks N[,N...]] [--mode whole|each|both] [--each]
#        [--each-ranks N[,N...]] [--timeout S] [--test-timeout S] [--total-timeout S]
#        [--min-pass-rate P [--min-pass-rate-ranks N[,N...]]] [--build DIR] [--out DIR] [-k EXPR]
#        [--suite-file PATH | --suite DIR] [--if-present]
#
# Whole file (--mode whole, the default): one launch,
#   mpirun -np N --oversubscribe --bind-to none /usr/bin/python3 -m pytest -p no:cacheprovider -v -rA
#          --color=no --junitxml=OUT/rank-R.xml test_torch.py
# every rank running the whole file, its output in OUT/rank-R.log (R: OMPI_COMM_WORLD_RANK), mpirun's
# own in OUT/mpirun.log. The launch is stopped after --timeout seconds (default 1500); a rank stopped
# that way writes no XML, and its results are read from what it streamed (the test it was running
# shows as `stopped`, the ones after it as `not reached`).
# Each test alone (--mode each, or --each): one launch per test (node id
#   test_torch.py::TorchTests::NAME), each stopped after --test-timeout seconds (default 120), all of
#   them within --timeout seconds (the tests left when it runs out show as `not run`); logs in
#   OUT/each/NAME/. A collective that a rank never joins fails there alone instead of putting the
#   ranks out of step for the rest of the file.
# --mode both: the whole file at every rank count, then each test alone at every rank count (the
#   whole-file runs first: --min-pass-rate judges them); each run gets its own --timeout and its own
#   summary. --each-ranks N[,N...]: with --mode both, each test alone only at these of the --ranks
#   (default: all of them); the whole file still runs at every one.
# --ranks N: ranks (default 2). A comma list (--ranks 1,2,3) runs each rank count in turn, in the
#   order given; then each rank count's logs go to OUT/ranks-N/ (laid out as OUT is for one rank
#   count) and every summary is headed by its rank count and mode ("2 ranks, whole file").
# --total-timeout S: every launch of the run (all rank counts and modes) within S seconds (default: no
#   bound but the others); what is left when it runs out shows as `not run`. A caller with its own
#   limit (ctest's TIMEOUT) gives this a minute or two less, so that the summary is still printed.
# --build DIR: default build. --out DIR: default /tmp/horovod-conformance (its rank-*, mpirun.log,
#   summary.txt, each/ and ranks-*/ are replaced). -k EXPR: pytest's -k, a subset (in both modes).
# --suite-file PATH: Horovod's test_torch.py (default ../shared/conformance/horovod/test_torch.py
#   from the repository root); its utils/ (utils/common.py) is the one beside it or, as in Horovod's
#   own tree (test/parallel/test_torch.py, test/utils/), the one beside its directory.
#   --suite DIR: the same as --suite-file DIR/test_torch.py.
# --if-present: when the suite file is missing, print "horovod-conformance: skipped: PATH not found
#   (...)" and exit 0 instead of 2 (for CI, whose machines may not hold the suite).
# --min-pass-rate P (0 to 1, e.g. 0.9): after the summaries, for every rank count run whole file,
#   print one line per rank: passed / the tests that did not skip (failed, errors, stopped, not
#   reached and not run all count against it), and exit 1 if any rank of any rank count is below P.
#   Needs --mode whole or both. --min-pass-rate-ranks N[,N...]: judge only these of the --ranks
#   (default: all of them); the others' lines are printed, marked not judged.
# Environment of every rank: PYTHONPATH=BUILD/python plus the copy's utils/, OMP_NUM_THREADS=1, and
# PIPESGD_TIMEOUT=30 (seconds a wait on a peer may take; an environment value is kept) so that a
# collective one rank never joins fails in 30 s instead of pipesgd.torch's default 120. A rank whose
# pytest ends with status 1 (tests ran, some failed) exits 0, so that mpirun neither spends a second
# aborting the job nor ends the ranks still running; any other status reaches mpirun as it is. Once
# every rank's pytest has finished (its results written), a launch whose ranks have not all exited 5 s
# later (a rank's pipesgd.torch shutdown waiting PIPESGD_TIMEOUT for a peer that has left) is ended
# there; the summary names those launches.
# Needs /usr/bin/python3 with torch, pytest, mock and cloudpickle (python3-mock, python3-cloudpickle:
# bash scripts/install-deps.sh) and mpirun (openmpi-bin). As root, mpirun gets --allow-run-as-root.
#
# Prints, per rank count and mode, per rank the counts passed / failed / skipped / errors (and stopped
# / not reached / not run), the failing tests with the first line of each reason, and the failures
# grouped by that line; with more than one rank count or mode, an overview of the counts of all of
# them at the end; the same goes to OUT/summary.txt (and each rank count's to OUT/ranks-N/summary.txt).
# Exit status: 0 when the suite ran (whatever its results: it measures) or was skipped by
# --if-present; 1 when a rank's pass rate is below --min-pass-rate; 2 for bad arguments or missing
# prerequisites.
set -euo pipefail
# The whole script is one block, read before it runs: editing the file during a run cannot change it.
{
repo=$(cd "$(dirname "$0")/.." && pwd)
ranks_list=2
each_ranks_list=
judged_ranks_list=
mode=whole
timeout_s=1500
test_timeout_s=120
total_timeout_s=
min_pass_rate=
if_present=0
build=$repo/build
out=/tmp/horovod-conformance
select=
suite_file=$repo/../shared/conformance/horovod/test_torch.py
python=/usr/bin/python3

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "horovod-conformance: $*" >&2; exit 2; }
whole_number() { if ! [[ $2 =~ ^[0-9]+$ ]] || (($2 < 1)); then die "$1 must be a whole number >= 1, got '$2'"; fi; }
rank_counts() {
  local n list
  [[ $2 =~ ^[0-9]+(,[0-9]+)*$ ]] || die "$1 must be a whole number or a comma list of them (1,2,3), got '$2'"
  IFS=, read -r -a list <<<"$2"
  for n in "${list[@]}"; do whole_number "$1" "$n"; done
  [ "$(printf '%s\n' "${list[@]}" | sort -u | wc -l)" -eq "${#list[@]}" ] || die "$1 lists a rank count twice: '$2'"
}

while (($#)); do
  case $1 in
    --ranks) rank_counts --ranks "${2-}"; ranks_list=$2; shift 2 ;;
    --each-ranks) rank_counts --each-ranks "${2-}"; each_ranks_list=$2; shift 2 ;;
    --min-pass-rate-ranks) rank_counts --min-pass-rate-ranks "${2-}"; judged_ranks_list=$2; shift 2 ;;
    --mode)
      case ${2-} in whole|each|both) mode=$2 ;; *) die "--mode must be whole, each or both, got '${2-}'" ;; esac
      shift 2 ;;
    --each) mode=each; shift ;;
    --timeout) whole_number --timeout "${2-}"; timeout_s=$2; shift 2 ;;
    --test-timeout) whole_number --test-timeout "${2-}"; test_timeout_s=$2; shift 2 ;;
    --total-timeout) whole_number --total-timeout "${2-}"; total_timeout_s=$2; shift 2 ;;
    --min-pass-rate)
      [[ ${2-} =~ ^(0*\.[0-9]+|0+(\.[0-9]*)?|1(\.0*)?)$ ]] || die "--min-pass-rate must be a number from 0 to 1, got '${2-}'"
      min_pass_rate=$2; shift 2 ;;
    --if-present) if_present=1; shift ;;
    --build) [ -n "${2-}" ] || die "--build needs a directory"; build=$2; shift 2 ;;
    --out) [ -n "${2-}" ] || die "--out needs a directory"; out=$2; shift 2 ;;
    -k) [ -n "${2-}" ] || die "-k needs an expression"; select=$2; shift 2 ;;
    --suite) [ -n "${2-}" ] || die "--suite needs a directory"; suite_file=${2%/}/test_torch.py; shift 2 ;;
    --suite-file) [ -n "${2-}" ] || die "--suite-file needs the path of test_torch.py"; suite_file=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
IFS=, read -r -a ranks_all <<<"$ranks_list"
if [ -n "$each_ranks_list" ]; then
  [ "$mode" = both ] || die "--each-ranks applies to --mode both"
  for n in ${each_ranks_list//,/ }; do
    [[ ,$ranks_list, == *",$n,"* ]] || die "--each-ranks $each_ranks_list: $n is not one of --ranks $ranks_list"
  done
else
  each_ranks_list=$ranks_list
fi
if [ -n "$min_pass_rate" ] && [ "$mode" = each ]; then
  die "--min-pass-rate is judged on the whole-file runs: give --mode whole or --mode both"
fi
if [ -n "$judged_ranks_list" ]; then
  [ -n "$min_pass_rate" ] || die "--min-pass-rate-ranks needs --min-pass-rate"
  for n in ${judged_ranks_list//,/ }; do
    [[ ,$ranks_list, == *",$n,"* ]] || die "--min-pass-rate-ranks $judged_ranks_list: $n is not one of --ranks $ranks_list"
  done
else
  judged_ranks_list=$ranks_list
fi

# --- Prerequisites.
suite_file=$(realpath -m "$suite_file")
if [ ! -f "$suite_file" ]; then
  if ((if_present)); then
    echo "horovod-conformance: skipped: $suite_file not found (Horovod's suite is kept outside the repository, see the header of scripts/horovod-conformance.sh and docs/contributing.md)"
    exit 0
  fi
  die "Horovod's suite not found: $suite_file (test_torch.py); give --suite-file PATH (or --if-present)"
fi
suite_utils=
for candidate in "$(dirname "$suite_file")/utils" "$(dirname "$(dirname "$suite_file")")/utils"; do
  if [ -f "$candidate/common.py" ]; then suite_utils=$candidate; break; fi
done
[ -n "$suite_utils" ] ||
  die "utils/common.py of Horovod's suite not found beside $suite_file nor beside its directory"
case $build in /*) ;; *) build=$PWD/$build ;; esac
[ -d "$build/python/pipesgd/torch" ] ||
  die "$build/python/pipesgd/torch not found: build first (bash scripts/build.sh) or give --build DIR"
command -v mpirun >/dev/null || die "mpirun not found: install openmpi-bin (bash scripts/install-deps.sh)"
command -v timeout >/dev/null || die "timeout (coreutils) not found"
[ -x "$python" ] || die "$python not found"
missing=()
for module in torch pytest mock cloudpickle numpy packaging; do
  "$python" -c "import $module" 2>/dev/null || missing+=("$module")
done
if ((${#missing[@]})); then
  die "$python lacks the module(s) ${missing[*]}: run bash scripts/install-deps.sh (it installs python3-mock, python3-cloudpickle and the rest)"
fi
PYTHONPATH=$build/python "$python" -c "import pipesgd.torch" 2>/dev/null ||
  die "PYTHONPATH=$build/python $python cannot import pipesgd.torch: build it (bash scripts/build.sh)"
started=$(date +%s)
total_deadline=
if [ -n "$total_timeout_s" ]; then total_deadline=$((started + total_timeout_s)); fi

# --- A fresh copy of the suite, adapted to pipesgd.torch (never kept: removed on exit).
work=$(mktemp -d "${TMPDIR:-/tmp}/horovod-conformance-suite.XXXXXX")
pids_file=$work/pids
# Ranks that outlive their mpirun (stopped by the timeout): ended by the process ids they recorded.
stop_leftover_ranks() {
  [ -f "$pids_file" ] || return 0
  local pid
  while read -r pid; do
    # Still one of ours: a process of that id whose working directory is the copy of the suite.
    if [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$work/parallel" ]; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done <"$pids_file"
  : >"$pids_file"
}
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local pid
  for pid in "${watcher_pid:-}" "${launcher_pid:-}"; do
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  stop_leftover_ranks
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$work/parallel" "$work/utils"
cp "$suite_file" "$work/parallel/test_torch.py"
cp -r "$suite_utils/." "$work/utils/"
chmod -R u+w "$work"
"$python" - "$work" <<'EOF' || die "could not adapt the copy of the suite (has test_torch.py or utils/common.py changed?)"
import pathlib, sys
work = pathlib.Path(sys.argv[1])

def edit(path, old, new):
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"{path.name}: expected the line {old!r} once, found it {text.count(old)} times")
    path.write_text(text.replace(old, new))

edit(work / "parallel" / "test_torch.py", "\nimport horovod.torch as hvd\n", "\nimport pipesgd.torch as hvd\n")
edit(work / "utils" / "common.py", "\nfrom horovod.runner.util.threads import in_thread\n",
     "\ntry:\n    from horovod.runner.util.threads import in_thread\nexcept ImportError:  # not installed: "
     "used only by helpers test_torch.py does not call\n    in_thread = None\n")
EOF

# Each rank also streams its results as they come (one JSON line per test: outcome and the first line
# of the reason) to the file named by CONFORMANCE_RESULTS, so that a launch stopped by the timeout,
# which writes no JUnit XML, still tells what each rank did and why. Its pytest's status 1 (some tests
# failed) becomes 0 (the header says why); the stream keeps the real one.
cat >"$work/parallel/conftest.py" <<'CONFTEST'
import json
import os

_PATH = os.environ.get("CONFORMANCE_RESULTS")


def _write(record):
    if _PATH:
        with open(_PATH, "a") as f:
            f.write(json.dumps(record) + "\n")


def _first_line(text):
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def pytest_runtest_logstart(nodeid, location):
    _write({"test": nodeid.split("::")[-1], "event": "start"})


def pytest_runtest_logreport(report):
    if report.when != "call" and report.passed:
        return
    if report.skipped:
        outcome = "skipped"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        reason = str(reason).removeprefix("Skipped: ")  # as the JUnit XML has it
    else:
        outcome = {"call": "passed" if report.passed else "failed"}.get(report.when, "error")
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = crash.message if crash is not None else report.longreprtext
    _write({"test": report.nodeid.split("::")[-1], "event": report.when, "outcome": outcome,
            "reason": _first_line(reason)})


def pytest_sessionfinish(session, exitstatus):
    _write({"event": "sessionfinish", "exitstatus": int(exitstatus)})
    if int(exitstatus) == 1:  # pytest.ExitCode.TESTS_FAILED: the session itself ran to its end
        session.exitstatus = 0
CONFTEST

# The tests, in file order (TorchTests' methods named test*), for --each and the `not reached` count.
"$python" - "$work/parallel/test_torch.py" >"$work/tests" <<'EOF'
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
for node in tree.body:
    if isinstance(node, ast.ClassDef) and node.name == "TorchTests":
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                print(item.name)
EOF

# --- The environment and the launch.
export PYTHONPATH="$build/python:$work/utils${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1
export PIPESGD_TIMEOUT=${PIPESGD_TIMEOUT:-30}
pytest_flags=(-p no:cacheprovider -v -rA --color=no)
if [ -n "$select" ]; then pytest_flags+=(-k "$select"); fi
# The tests run: all of them, or those -k chooses (the node ids pytest collects for it).
if [ -n "$select" ]; then
  (cd "$work/parallel" && "$python" -m pytest -p no:cacheprovider -q --collect-only -k "$select" test_torch.py \
    2>/dev/null | sed -n 's/^test_torch\.py::TorchTests::\([A-Za-z0-9_]*\)$/\1/p') >"$work/selected"
else
  cp "$work/tests" "$work/selected"
fi
mapfile -t tests <"$work/selected"
# Each rank: its own log and JUnit XML, named by its rank; its process id recorded for the clean-up.
# shellcheck disable=SC2016  # expanded by each rank's bash
rank_wrapper='r=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}; prefix=$1; pids=$2; shift 2
echo $$ >>"$pids"; export CONFORMANCE_RESULTS=$prefix-$r.jsonl
exec "$@" --junitxml="$prefix-$r.xml" >"$prefix-$r.log" 2>&1'

# seconds_left OWN_LIMIT: the seconds a launch may take, OWN_LIMIT cut to what --total-timeout leaves.
seconds_left() {
  local left=$1
  if [ -n "$total_deadline" ]; then
    local total_left=$((total_deadline - $(date +%s)))
    if ((total_left < left)); then left=$total_left; fi
  fi
  echo "$left"
}

# launch DIR SECONDS PYTEST_ARGS...: one mpirun of $ranks ranks; DIR gets rank-R.{log,xml,jsonl},
# mpirun.log, rc, seconds, and `cut` when the launch was ended after its sessions (see below).
# Once every rank's pytest session has finished (its results written), the ranks get $exit_grace_s s to
# exit; a launch still running then (a rank's pipesgd.torch shutdown waiting PIPESGD_TIMEOUT for a peer
# that has left) is ended there instead of after the wait: no result is lost, and the summary says so.
exit_grace_s=5
launcher_pid=
watcher_pid=
launch() {
  local dir=$1 seconds=$2 start rc
  shift 2
  mkdir -p "$dir"
  start=$(date +%s.%N)
  (cd "$work/parallel" &&
    exec timeout -k 15 "$seconds" mpirun "${mpirun_flags[@]}" bash -c "$rank_wrapper" rank-wrapper "$dir/rank" \
      "$pids_file" "$python" -m pytest "${pytest_flags[@]}" "$@") >"$dir/mpirun.log" 2>&1 &
  launcher_pid=$!
  (
    finished=0
    while sleep 0.5; do
      for ((r = 0; r < ranks; r++)); do
        grep -qs '"sessionfinish"' "$dir/rank-$r.jsonl" || continue 2
      done
      finished=$((finished + 1))
      if ((finished * 5 >= exit_grace_s * 10)); then
        echo "every rank's pytest had finished and a rank had not exited $exit_grace_s s later (e.g. pipesgd.torch's shutdown waiting on a peer that had left): ended there, no result lost" >"$dir/cut"
        kill -TERM "$launcher_pid" 2>/dev/null
        exit 0
      fi
    done
  ) &
  watcher_pid=$!
  set +e
  wait "$launcher_pid"
  rc=$?
  kill "$watcher_pid" 2>/dev/null
  wait "$watcher_pid" 2>/dev/null
  set -e
  launcher_pid='' watcher_pid=''
  stop_leftover_ranks
  echo "$rc" >"$dir/rc"
  awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f\n", e - s }' >"$dir/seconds"
}

# --- The summary of one rank count and mode, per rank, from each rank's JUnit XML (or its results
# stream when it wrote none); also written as JSON (counts per rank) for the overview and the gate.
cat >"$work/summary.py" <<'EOF'
import collections, json, os, re, sys
import xml.etree.ElementTree as ET

ranks, each, tests_file, selected_file, counts_file = int(sys.argv[1]), sys.argv[2] == "1", *sys.argv[3:6]
runs = sys.argv[6:]
all_tests = [line.strip() for line in open(tests_file) if line.strip()]
selected = [line.strip() for line in open(selected_file) if line.strip()]
ORDER = ["passed", "failed", "skipped", "error", "stopped", "not reached", "not run"]
SEVERITY = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}

def first_line(text, limit=200):
    for line in (text or "").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""

def from_xml(path):
    """{test: (outcome, reason)} from a JUnit XML; None when absent or unreadable."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    results = {}
    for case in root.iter("testcase"):
        name = case.get("name", "")
        outcome, reason = "passed", ""
        for child in case:
            tag = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
            if tag is None:
                continue
            why = first_line(child.get("message")) or first_line(child.text)
            if tag == "skipped" and child.get("type") == "pytest.xfail":
                tag = "passed"
            if SEVERITY[tag] > SEVERITY[outcome]:
                outcome, reason = tag, why
        if name in results and SEVERITY[results[name][0]] > SEVERITY[outcome]:
            continue  # a second entry (e.g. a teardown error) keeps the worse outcome
        results[name] = (outcome, reason)
    return results

def from_stream(path, seconds):
    """{test: (outcome, reason)} from a rank's JSON lines (conftest.py), for a launch stopped before
    pytest wrote its XML; None when the rank wrote none."""
    results, running = {}, None
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by the kill
        if "test" not in record:
            continue  # the session's end
        name = record["test"]
        if record.get("event") == "start":
            running = name
            continue
        running = None
        outcome, reason = record.get("outcome", "error"), record.get("reason", "")
        if name not in results or SEVERITY[outcome] > SEVERITY[results[name][0]]:
            results[name] = (outcome, reason)
    if running is not None and running not in results:
        results[running] = ("stopped", f"running when the launch ended (after {seconds} s)")
    return results

def read(path, default=""):
    try:
        return open(path).read().strip()
    except OSError:
        return default

per_rank = [dict() for _ in range(ranks)]
sources = [collections.Counter() for _ in range(ranks)]
for run in runs:
    seconds, rc = read(os.path.join(run, "seconds"), "?"), read(os.path.join(run, "rc"), "?")
    expected = [os.path.basename(run)] if each else selected
    for r in range(ranks):
        results = per_rank[r]
        if os.path.exists(os.path.join(run, "not-run")):
            for name in expected:
                results[name] = ("not run", read(os.path.join(run, "not-run")))
            continue
        got = from_xml(os.path.join(run, f"rank-{r}.xml"))
        if rc in ("124", "137"):
            ended = f"the launch was stopped by the timeout after {seconds} s"
        else:
            ended = f"the rank's pytest ended early (mpirun exit {rc} after {seconds} s)"
        if got is not None:
            sources[r]["xml"] += 1
        else:
            got = from_stream(os.path.join(run, f"rank-{r}.jsonl"), seconds)
            sources[r]["stream" if got is not None else "nothing"] += 1
            if got is None:
                got = {}
            if each and not got:
                got = {expected[0]: ("stopped", ended)}
        results.update(got)
        if not each:  # the whole file: the tests this rank never started
            for name in expected:
                results.setdefault(name, ("not reached", "never started: " + ended))

counts = [collections.Counter(o for o, _ in per_rank[r].values()) for r in range(ranks)]
with open(counts_file, "w") as f:
    json.dump({"ranks": ranks, "mode": "each" if each else "whole",
               "counts": [{o: c.get(o, 0) for o in ORDER} for c in counts]}, f)

print()
print(f"{'rank':<6}" + "".join(f"{o:>12}" for o in ORDER) + "   source")
for r in range(ranks):
    source = ", ".join(f"{n} {k}" for k, n in sources[r].items())
    print(f"{r:<6}" + "".join(f"{counts[r].get(o, 0):>12}" for o in ORDER) + f"   {source}")

UNRUN = ("not reached", "not run")
bad = collections.OrderedDict()
for name in all_tests + sorted({n for rr in per_rank for n in rr} - set(all_tests)):
    per = [(r, *per_rank[r][name]) for r in range(ranks) if name in per_rank[r]]
    worst = [(r, o, why) for r, o, why in per if o not in ("passed", "skipped") + UNRUN]
    if worst:
        bad[name] = worst + [(r, o, why) for r, o, why in per if o in UNRUN]

if bad:
    print(f"\ntests that failed, errored or were stopped on a rank ({len(bad)}): NAME [rank: outcome] first line of the reason")
    for name, worst in bad.items():
        ranks_text = ", ".join(f"{r}: {o}" for r, o, _ in worst)
        reasons = []
        for _, o, why in worst:
            if why and why not in reasons and o not in UNRUN:
                reasons.append(why)
        print(f"  {name} [{ranks_text}] {' | '.join(reasons) if reasons else '(no reason recorded)'}")
    groups = collections.OrderedDict()  # numbers (ranks, tags, sizes, seconds) as '#'
    for name, worst in bad.items():
        r, o, why = worst[0]
        groups.setdefault((o, re.sub(r"\d+", "#", why) or "(no reason recorded)"), []).append(name)
    print(f"\nby reason (outcome and first line on the lowest rank concerned, numbers as #; {len(groups)} reasons):")
    for (o, why), names in sorted(groups.items(), key=lambda item: -len(item[1])):
        print(f"  {len(names):3d} x {o}: {why}")
        print(f"        {', '.join(names)}")

for r in range(ranks):
    unrun = collections.OrderedDict()
    for name, (o, why) in per_rank[r].items():
        if o in UNRUN:
            unrun.setdefault((o, why), []).append(name)
    for (o, why), names in unrun.items():
        shown = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
        print(f"\nrank {r}: {len(names)} tests {o} ({why}): {shown}")

cut = [run for run in runs if os.path.exists(os.path.join(run, "cut"))]
if cut:
    names = ", ".join(os.path.basename(run) if each else "the whole file" for run in cut)
    print(f"\n{len(cut)} launch(es) where {read(os.path.join(cut[0], 'cut'))}: {names}")

skips = collections.Counter(why for o, why in per_rank[0].values() if o == "skipped") if ranks else {}
if skips:
    print("\nskipped on rank 0, by reason:")
    for why, n in skips.most_common():
        print(f"  {n:3d} x {why or '(no reason)'}")
EOF

# --- The overview of every rank count and mode, and the gate of --min-pass-rate.
cat >"$work/overview.py" <<'EOF'
import json, sys
overview, min_rate, judged, files = sys.argv[1] == "1", sys.argv[2], sys.argv[3].split(","), sys.argv[4:]
ORDER = ["passed", "failed", "skipped", "error", "stopped", "not reached", "not run"]
ranks_text = lambda n: f"{n} rank" + ("s" if n > 1 else "")
runs = [json.load(open(path)) for path in files]
if overview:
    print("\noverview (per rank count, mode and rank):")
    print(f"{'ranks':<7}{'mode':<7}{'rank':<6}" + "".join(f"{o:>12}" for o in ORDER))
    for run in runs:
        for r, counts in enumerate(run["counts"]):
            print(f"{run['ranks']:<7}{run['mode']:<7}{r:<6}" + "".join(f"{counts[o]:>12}" for o in ORDER))
if min_rate:
    threshold = float(min_rate)
    print(f"\npass rate of the whole-file runs (passed / tests that did not skip), at least {min_rate} on every rank:")
    below = []
    for run in runs:
        if run["mode"] != "whole":
            continue
        for r, counts in enumerate(run["counts"]):
            ran = sum(counts.values()) - counts["skipped"]
            rate = counts["passed"] / ran if ran else 0.0
            verdict = "ok" if ran and rate >= threshold else "BELOW"
            if str(run["ranks"]) not in judged:
                verdict = f"(not judged: --min-pass-rate-ranks {','.join(judged)})"
            elif verdict != "ok":
                below.append(f"{ranks_text(run['ranks'])} rank {r}")
            shown = f"{rate:.3f}" if ran else "none (no test that did not skip)"
            print(f"  {ranks_text(run['ranks'])}, rank {r}: {counts['passed']} / {ran} = {shown}  {verdict}")
    if below:
        print(f"horovod-conformance: pass rate below {min_rate} on {len(below)} rank(s): {', '.join(below)}")
        sys.exit(1)
    print(f"horovod-conformance: every rank at {','.join(judged)} ranks passes at least {min_rate} of the tests that did not skip")
EOF

mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out"/rank-*.log "$out"/rank-*.xml "$out"/rank-*.jsonl "$out/mpirun.log" "$out/rc" "$out/seconds" \
  "$out/not-run" "$out"/counts-*.json "$out/summary.txt" "$out/each" "$out"/ranks-*
multi=0
if ((${#ranks_all[@]} > 1)); then multi=1; fi
{
  echo "suite: $suite_file ($(wc -l <"$work/tests") tests${select:+, ${#tests[@]} chosen by -k}), utils/ from $suite_utils, copied to $work"
  echo "pipesgd.torch: $build/python; ranks ${ranks_list//,/, }; mode $mode$([ "$mode" = both ] && [ "$each_ranks_list" != "$ranks_list" ] && echo " (each test alone at ranks ${each_ranks_list//,/, } only)"); PIPESGD_TIMEOUT=$PIPESGD_TIMEOUT OMP_NUM_THREADS=1"
  if ((multi)); then echo "logs: $out/ranks-N for each rank count N, summary.txt of all in $out"; else echo "logs: $out"; fi
} | tee "$out/summary.txt"

counts_files=()
# The runs, (mode, rank count) in turn: with --mode both every whole-file run first (the ones
# --min-pass-rate judges, so that each test alone cannot use up --total-timeout before them).
plan=()
for this_mode in whole each; do
  if [ "$mode" != both ] && [ "$mode" != "$this_mode" ]; then continue; fi
  for ranks in "${ranks_all[@]}"; do
    if [ "$this_mode" = each ] && [[ ,$each_ranks_list, != *",$ranks,"* ]]; then continue; fi
    plan+=("$this_mode:$ranks")
  done
done
for step in "${plan[@]}"; do
  this_mode=${step%%:*} ranks=${step#*:}
  ranks_text="$ranks ranks"
  if ((ranks == 1)); then ranks_text="1 rank"; fi
  if ((multi)); then dir=$out/ranks-$ranks; else dir=$out; fi
  mkdir -p "$dir"
  summaries=("$out/summary.txt")
  if [ "$dir" != "$out" ]; then summaries+=("$dir/summary.txt"); fi
  mpirun_flags=(-np "$ranks" --oversubscribe --bind-to none -x PYTHONPATH -x OMP_NUM_THREADS -x PIPESGD_TIMEOUT)
  if [ "$(id -u)" -eq 0 ]; then mpirun_flags+=(--allow-run-as-root); fi
  if [ "$this_mode" = whole ]; then
    title="$ranks_text, whole file"
    echo
    echo "== $title: one pytest per rank (timeout ${timeout_s} s): mpirun -np $ranks ... pytest ${pytest_flags[*]} test_torch.py"
    rm -f "$dir/not-run" "$dir/cut"
    left=$(seconds_left "$timeout_s")
    if ((left < 10)); then
      echo "the --total-timeout of $total_timeout_s s ran out" >"$dir/not-run"
      echo "not run: the --total-timeout of $total_timeout_s s ran out"
    else
      launch "$dir" "$left" test_torch.py
      echo "mpirun exit status $(cat "$dir/rc") after $(cat "$dir/seconds") s$([ -f "$dir/cut" ] && echo ", ended ${exit_grace_s} s after the sessions")"
    fi
    runs=("$dir")
  else
    title="$ranks_text, each test alone"
    deadline=$(($(date +%s) + timeout_s))
    echo
    echo "== $title: ${#tests[@]} launches of mpirun -np $ranks (each within ${test_timeout_s} s, all within ${timeout_s} s)"
    runs=()
    i=0
    for name in "${tests[@]}"; do
      i=$((i + 1))
      test_dir=$dir/each/$name
      left=$(seconds_left $((deadline - $(date +%s))))
      if ((left < 10)); then
        mkdir -p "$test_dir"
        if [ -n "$total_deadline" ] && ((total_deadline - $(date +%s) < 10)); then
          echo "the --total-timeout of $total_timeout_s s ran out" >"$test_dir/not-run"
        else
          echo "the --timeout of $timeout_s s ran out" >"$test_dir/not-run"
        fi
        runs+=("$test_dir")
        continue
      fi
      launch "$test_dir" "$((left < test_timeout_s ? left : test_timeout_s))" "test_torch.py::TorchTests::$name"
      runs+=("$test_dir")
      outcomes=$(for ((r = 0; r < ranks; r++)); do
        o=$(sed -n "s/^test_torch\.py::TorchTests::$name \(PASSED\|FAILED\|SKIPPED\|ERROR\|XFAIL\|XPASS\).*/\1/p" \
          "$test_dir/rank-$r.log" 2>/dev/null | head -1)
        printf ' r%d %s' "$r" "${o:-none}"
      done)
      printf '[%d/%d] %s:%s (%s s, exit %s%s)\n' "$i" "${#tests[@]}" "$name" "$outcomes" "$(cat "$test_dir/seconds")" \
        "$(cat "$test_dir/rc")" "$([ -f "$test_dir/cut" ] && echo ", ended ${exit_grace_s} s after the sessions")"
    done
  fi
  counts_file=$dir/counts-$this_mode.json
  { echo; echo "== $title: summary"; } | tee -a "${summaries[@]}"
  "$python" "$work/summary.py" "$ranks" "$([ "$this_mode" = each ] && echo 1 || echo 0)" "$work/tests" \
    "$work/selected" "$counts_file" "${runs[@]}" | tee -a "${summaries[@]}"
  counts_files+=("$counts_file")
done

overview=0
if ((${#counts_files[@]} > 1)); then overview=1; fi
set +e
"$python" "$work/overview.py" "$overview" "$min_pass_rate" "$judged_ranks_list" "${counts_files[@]}" |
  tee -a "$out/summary.txt"
gate=${PIPESTATUS[0]}
set -e
echo "full logs and summary.txt in $out (took $(($(date +%s) - started)) s)"
if ((gate != 0)); then exit 1; fi
exit 0
}
