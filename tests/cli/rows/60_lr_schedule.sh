# shellcheck shell=bash
# Learning-rate schedules (--lr-schedule, --lr-warmup; sourced by run_cli_tests.sh; uses $R, $TMP,
# run, row, pycheck, expect_success, expect_contains):
#  - every bad spec: one stderr line naming the flag, exit 2;
#  - a run records the schedule in summary.json's configuration and the report's header, and every
#    metrics.jsonl iteration's "lr" is the closed form of optim/lr_schedule.h (an allreduce method
#    and a parameter-server method);
#  - resuming a checkpoint under another schedule is refused with one line.

S=(--data synthetic --iters 3 --quiet --no-eval)  # a valid rest of a train command line

row lr-schedule-unknown        2 "--lr-schedule 'linear': unknown schedule 'linear'" train --lr-schedule linear "${S[@]}"
row lr-schedule-forms          2 "expected constant, step:EVERY_EPOCHS:GAMMA, multistep:E1,E2,...:GAMMA or cosine" \
  train --lr-schedule exp "${S[@]}"
row lr-schedule-step-parts     2 "step takes 2 parts"                        train --lr-schedule step:2 "${S[@]}"
row lr-schedule-step-every     2 "EVERY_EPOCHS must be >= 1, got 0"          train --lr-schedule step:0:0.5 "${S[@]}"
row lr-schedule-step-word      2 "EVERY_EPOCHS 'two' is not an integer"      train --lr-schedule step:two:0.5 "${S[@]}"
row lr-schedule-gamma-word     2 "GAMMA 'half' is not a number"              train --lr-schedule step:1:half "${S[@]}"
row lr-schedule-gamma-zero     2 "GAMMA must be in (0, 1], got 0"            train --lr-schedule step:1:0 "${S[@]}"
row lr-schedule-gamma-growth   2 "GAMMA must be in (0, 1], got 2"            train --lr-schedule multistep:1:2 "${S[@]}"
row lr-schedule-milestones     2 "strictly increasing, got 2 after 5"        train --lr-schedule multistep:5,2:0.1 "${S[@]}"
row lr-schedule-milestone-zero 2 "milestones are epochs >= 1, got 0"         train --lr-schedule multistep:0:0.1 "${S[@]}"
row lr-schedule-milestone-word 2 "milestone 'x' is not an integer"           train --lr-schedule multistep:1,x:0.1 "${S[@]}"
row lr-schedule-cosine-parts   2 "cosine takes no parts"                     train --lr-schedule cosine:10 "${S[@]}"
row lr-warmup-negative         2 "--lr-warmup must be in [0, 10000000] iterations, got -1" train --lr-warmup -1 "${S[@]}"
row lr-warmup-huge             2 "--lr-warmup must be in [0, 10000000] iterations" train --lr-warmup 99999999999 "${S[@]}"
row lr-schedule-compare        2 "--lr-schedule 'step:1'"                    compare --algos dsync,pipe --lr-schedule step:1 "${S[@]}"

# schedule_run NAME ARGS...: a run of the softmax model on synthetic data into $R/NAME.
schedule_run() {
  local name=$1
  shift
  run train --model softmax --data synthetic --no-eval --quiet --out "$R/$name" "$@" >"$R/$name.out" 2>"$R/$name.err"
  expect_success "lr-schedule/$name-runs" $? "$R/$name.out" "$R/$name.err"
}

# check_lr NAME SPEC WARMUP BASE: configuration and every iteration's lr against the closed form.
check_lr() {
  pycheck "lr-schedule/$1-configuration-and-metrics" "$R/$1" "$2" "$3" "$4" <<'PYEOF'
import json, math, struct, sys
out, spec, warmup, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = json.load(open(out + "/summary.json"))
c = s["configuration"]
assert c["learning_rate_schedule"] == spec, c["learning_rate_schedule"]
assert c["learning_rate_warmup_iterations"] == warmup, c["learning_rate_warmup_iterations"]
per_epoch, total = c["iterations_per_epoch"], c["iterations"]
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
def factor(t):
    parts = spec.split(":")
    epoch = t // per_epoch
    if parts[0] == "constant": d = 1.0
    elif parts[0] == "step": d = float(parts[2]) ** (epoch // int(parts[1]))
    elif parts[0] == "multistep": d = float(parts[2]) ** sum(1 for m in parts[1].split(",") if int(m) <= epoch)
    elif parts[0] == "cosine": d = (1 + math.cos(math.pi * t / total)) / 2
    if t < warmup: d *= (t + 1) / warmup
    return d
records = [json.loads(line) for line in open(out + "/metrics.jsonl")]
its = [r for r in records if r["type"] == "iteration"]
assert len(its) == total, (len(its), total)
distinct = set()
for r in its:
    t = r["iteration"]
    want = f32(f32(base) * factor(t))
    assert abs(r["lr"] - want) <= 1e-7 * want, (t, r["lr"], want)
    distinct.add(r["lr"])
assert len(distinct) > 3, f"the schedule never changed the rate: {sorted(distinct)}"
PYEOF
}

schedule_run multistep --algo pipe --workers 2 --batch 100 --epochs 3 --lr 0.2 --lr-schedule multistep:1,2:0.5 \
  --lr-warmup 7
check_lr multistep "multistep:1,2:0.5" 7 0.2
expect_contains "lr-schedule/multistep-report-header" "$R/multistep.out" "lr schedule multistep:1,2:0.5, warm-up 7 iterations"
schedule_run cosine-pssync --algo pssync --workers 2 --batch 100 --iters 40 --lr 0.05 --lr-schedule cosine
check_lr cosine-pssync cosine 0 0.05
schedule_run step-odsgd --algo odsgd --workers 2 --batch 100 --epochs 2 --warmup-iters 5 --lr-schedule step:1:0.1 \
  --lr-warmup 3
check_lr step-odsgd "step:1:0.1" 3 0.1
# The default: constant, lr the base rate in every record.
schedule_run constant --algo dsync --workers 2 --batch 100 --iters 5
pycheck "lr-schedule/constant-default" "$R/constant" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
assert s["configuration"]["learning_rate_schedule"] == "constant", s["configuration"]["learning_rate_schedule"]
assert s["configuration"]["learning_rate_warmup_iterations"] == 0
lrs = {json.loads(l)["lr"] for l in open(sys.argv[1] + "/metrics.jsonl") if json.loads(l)["type"] == "iteration"}
assert lrs == {0.1}, lrs
PYEOF

# Resuming under another schedule: one line, exit 2; under the same one it resumes.
run train --algo pipe --model softmax --workers 2 --batch 100 --data synthetic --epochs 2 --no-eval --quiet \
  --lr-schedule step:1:0.5 --checkpoint-dir "$R/lr-ckpt" --checkpoint-every 5 >"$R/lr-ckpt.out" 2>"$R/lr-ckpt.err"
expect_success "lr-schedule/checkpointed-run" $? "$R/lr-ckpt.out" "$R/lr-ckpt.err"
row lr-schedule-resume-other 2 "is of another run" train --algo pipe --model softmax --workers 2 --batch 100 \
  --data synthetic --epochs 2 --no-eval --quiet --lr-schedule step:1:0.25 --checkpoint-dir "$R/lr-ckpt" --resume
row lr-warmup-resume-other 2 "is of another run" train --algo pipe --model softmax --workers 2 --batch 100 \
  --data synthetic --epochs 2 --no-eval --quiet --lr-schedule step:1:0.5 --lr-warmup 4 --checkpoint-dir "$R/lr-ckpt" \
  --resume
run train --algo pipe --model softmax --workers 2 --batch 100 --data synthetic --epochs 2 --no-eval --quiet \
  --lr-schedule step:1:0.5 --checkpoint-dir "$R/lr-ckpt" --resume >"$R/lr-resume.out" 2>"$R/lr-resume.err"
expect_success "lr-schedule/resume-same-schedule" $? "$R/lr-resume.out" "$R/lr-resume.err"
