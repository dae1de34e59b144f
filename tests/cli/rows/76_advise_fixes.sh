# shellcheck shell=bash
# `pipesgd advise`, `simulate` and `plan` on the shipped profiles (sourced by run_cli_tests.sh after
# 75_simulate.sh; uses $R, $TMP, $FX, $P, run, pass, fail, pycheck, expect_success, expect_contains):
#  - a candidate that cannot be built (more servers than the model has segments) is skipped with a
#    note, never fatal;
#  - the collective level is chosen by cost: AlexNet at 16 workers is simulated with the modelled
#    collectives (the message level took minutes), says so, and shows progress on stderr (none under
#    --quiet);
#  - a configuration that trades accuracy is recommended only for at least --min-gain over the
#    fastest that trades none, and the output says which and why;
#  - the device the profile stands for, and how to change it;
#  - the printed command lines run (the executable's path, or `pipesgd` if PATH finds this one);
#  - plan: no predicted iteration is shorter than the compute it contains.

PROFILES=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../profiles" && pwd)

# 1. More servers than segments: skipped, one line each; the others ranked.
run advise --profile "$PROFILES/mnist-mlp.json" --workers 64 --net 10gbe --quiet >"$R/adv-mlp64.out" 2>"$R/adv-mlp64.err"
expect_success "advise-fixes/unbuildable-exit-0" $? "$R/adv-mlp64.out" "$R/adv-mlp64.err"
expect_contains "advise-fixes/unbuildable-skipped" "$R/adv-mlp64.out" \
  "skipped pssync --servers 4: parameter server: 4 servers exceed the model's 3 parameter segments" \
  "skipped odsgd --servers 8: " "recommended: "

# 2. AlexNet at 16 workers: the modelled collectives by cost, progress on stderr (a bound on a hang,
# not a timing: the message level took minutes here).
run advise --profile "$PROFILES/alexnet.json" --workers 16 >"$R/adv-alex16.out" 2>"$R/adv-alex16.err"
expect_success "advise-fixes/alexnet-16-completes" $? "$R/adv-alex16.out" "$R/adv-alex16.err"
expect_contains "advise-fixes/alexnet-16-level" "$R/adv-alex16.out" \
  "collectives: modelled for 30 simulations (e.g. auto: message level would cost" \
  "over its budget of 1e+09; --collectives messages forces it"
expect_contains "advise-fixes/alexnet-16-progress" "$R/adv-alex16.err" \
  "advising for 16 workers: AlexNet" "[1/46] dsync, 16 workers, modelled collectives" "[46/46] "
run advise --profile "$PROFILES/alexnet.json" --workers 16 --methods dsync --codecs none --quiet \
  >"$R/adv-alex16q.out" 2>"$R/adv-alex16q.err"
if [ $? -eq 0 ] && [ ! -s "$R/adv-alex16q.err" ]; then
  pass "advise-fixes/quiet-silences-progress"
else
  fail "advise-fixes/quiet-silences-progress" "stderr: $(excerpt "$R/adv-alex16q.err")"
fi

# 3. --min-gain: VGG-16 at 32 workers is compute-bound: Pipe-SGD gains ~0.01%, synchronous recommended.
run advise --profile "$PROFILES/vgg16.json" --workers 32 --methods dsync,pipe --codecs none --quiet \
  >"$R/adv-vgg.out" 2>"$R/adv-vgg.err"
expect_success "advise-fixes/min-gain-small-exit-0" $? "$R/adv-vgg.out" "$R/adv-vgg.err"
expect_contains "advise-fixes/min-gain-small" "$R/adv-vgg.out" \
  "pipe --staleness-k 2 is 0.01% faster than dsync+optimal; below the 5% minimum (--min-gain) to trade accuracy for speed, so recommending dsync+optimal" \
  "recommended: dsync+optimal, " "no accuracy trade"
# AlexNet at 16 workers on 10 GbE is communication-bound: Pipe-SGD is well past 5%, and recommended...
run advise --profile "$PROFILES/alexnet.json" --workers 16 --methods dsync,pipe --codecs none --quiet \
  >"$R/adv-alexpipe.out" 2>"$R/adv-alexpipe.err"
expect_success "advise-fixes/min-gain-large-exit-0" $? "$R/adv-alexpipe.out" "$R/adv-alexpipe.err"
expect_contains "advise-fixes/min-gain-large" "$R/adv-alexpipe.out" \
  "at least the 5% minimum (--min-gain) to trade accuracy for speed" "recommended: pipe --staleness-k 2, " \
  "fastest without an accuracy trade: dsync+optimal"
# ... unless the minimum is higher than its gain.
run advise --profile "$PROFILES/alexnet.json" --workers 16 --methods dsync,pipe --codecs none --quiet --min-gain 500% \
  >"$R/adv-alexmin.out" 2>"$R/adv-alexmin.err"
expect_contains "advise-fixes/min-gain-flag" "$R/adv-alexmin.out" "below the 500% minimum (--min-gain)" \
  "recommended: dsync+optimal, "
row advise-bad-min-gain 2 "--min-gain 'lots'" advise --profile "$PROFILES/alexnet.json" --min-gain lots

# 4. The device the profile stands for, and how to change it.
expect_contains "advise-fixes/device-advise" "$R/adv-vgg.out" \
  "compute: the profile's times are for one GK210 GPU of an Nvidia Tesla K80" "--compute-scale X" "pipesgd profile"
run simulate --profile "$PROFILES/resnet50.json" --workers 4 --algos dsync --quiet --compute-scale 0.1 \
  >"$R/sim-device.out" 2>"$R/sim-device.err"
expect_success "advise-fixes/device-simulate-exit-0" $? "$R/sim-device.out" "$R/sim-device.err"
expect_contains "advise-fixes/device-simulate" "$R/sim-device.out" \
  "compute: the profile's times for one GK210 GPU of an Nvidia Tesla K80" "x 0.1 (--compute-scale)"
pycheck "advise-fixes/device-field" "$PROFILES" <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    profile = json.load(open(path))
    assert isinstance(profile.get("device"), str) and profile["device"], path
PY

# 5. The printed command lines run: the executable's own path here (build/pipesgd is not on PATH)...
run advise --profile "$P" --workers 2 --codecs none --methods dsync,pipe --iters 4 --quiet >"$R/adv-cmd.out" 2>"$R/adv-cmd.err"
expect_success "advise-fixes/command-exit-0" $? "$R/adv-cmd.out" "$R/adv-cmd.err"
expect_contains "advise-fixes/command-path" "$R/adv-cmd.out" "mpirun -np 2 $BIN train --transport mpi" \
  "threads on one machine: $BIN train --workers 2"
CMD_DATA=()
[ -d "$REAL_DATA" ] && [ -n "$(ls "$REAL_DATA" 2>/dev/null)" ] || CMD_DATA=(--data-dir "$FX/good")
if python3 - "$R/adv-cmd.out" >"$TMP/advise-command.args" <<'PY'; then
import shlex, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, line in enumerate(lines) if line.startswith("recommended: "))
line = next(l for l in lines[start:] if l.strip().startswith("threads on one machine: "))
for word in shlex.split(line.split("threads on one machine: ", 1)[1]):
    print(word)
PY
  mapfile -t CMD <"$TMP/advise-command.args"
  # The printed program is $BIN itself: run it under the same limits as every run here.
  if [ "${CMD[0]}" = "$BIN" ]; then
    run "${CMD[@]:1}" --iters 2 "${CMD_DATA[@]}" >"$R/adv-cmd-run.out" 2>"$R/adv-cmd-run.err"
    expect_success "advise-fixes/command-runs" $? "$R/adv-cmd-run.out" "$R/adv-cmd-run.err"
  else
    fail "advise-fixes/command-runs" "the printed program is '${CMD[0]}', not $BIN"
  fi
else
  fail "advise-fixes/command-runs" "no threads command after 'recommended:' in $(excerpt "$R/adv-cmd.out")"
fi
# ... and plain `pipesgd` when PATH finds this very executable.
mkdir -p "$TMP/onpath"
ln -sf "$BIN" "$TMP/onpath/pipesgd"
PATH="$TMP/onpath:$PATH" run advise --profile "$P" --workers 2 --codecs none --methods dsync --iters 4 --quiet \
  >"$R/adv-path.out" 2>"$R/adv-path.err"
expect_contains "advise-fixes/command-on-path" "$R/adv-path.out" "  mpirun -np 2 pipesgd train --transport mpi" \
  "threads on one machine: pipesgd train --workers 2"

# 6. plan: Pipe-SGD's pipelined iteration is never shorter than the compute it contains (the paper's
# Eq. 6 counts only the first segment's backward); a compute-bound MLP shows it.
run plan --model mlp --data synthetic --profile-iters 2 --batch 256 --net 100gbe --workers 2 --plans wfbp,single,optimal \
  --quiet --out "$R/plan-compute" >"$R/plan-compute.out" 2>"$R/plan-compute.err"
expect_success "advise-fixes/plan-exit-0" $? "$R/plan-compute.out" "$R/plan-compute.err"
pycheck "advise-fixes/plan-not-below-compute" "$R/plan-compute/plan.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["pipe_sgd"]
compute = d["forward_s"] + d["backward_s"] + d["update_s"]
assert abs(p["compute_s"] - compute) < 1e-12, (p["compute_s"], compute)
for r in p["pipelined_eq6"]:
    assert r["predicted_iteration_s"] >= compute * (1 - 1e-12), ("pipelined", r, compute)
    assert r["predicted_iteration_s"] == max(compute, r["comm_s"]), r
for r in d["plans"]:
    assert r["predicted_iteration_s"] >= compute * (1 - 1e-12), ("bucket plan", r, compute)
assert p["sequential_iteration_eq5_s"] >= compute
PY
