# shellcheck shell=bash
# The papers' forms by default for the asynchronous servers (--async-scale), DC-ASGD's lambda per
# variant (--dc-lambda), Pipe-SGD's end of training (--final-gradients) and Pipe-SGD's timing
# equations (Eq. 5 with a calibration's gamma, Eq. 6, Eq. 7): help, errors, summaries and reports.
# Sourced by run_cli_tests.sh (uses $R, $TMP, Q, run, row, pycheck, expect_success, expect_contains).

# Bad values: one line naming the flag and the valid values; options of other methods refused.
row async-scale-bad              2 "--async-scale must be 1 or 1/M, got '0.5'" train --algo asgd --async-scale 0.5 "${Q[@]}"
row async-scale-with-pssync      2 "--async-scale applies only to asgd and dcasgd, not 'pssync'" \
  train --algo pssync --async-scale 1/M "${Q[@]}"
row async-scale-with-odsgd       2 "--async-scale applies only to asgd and dcasgd, not 'odsgd'" \
  train --algo odsgd --async-scale 1 "${Q[@]}"
row final-gradients-bad          2 "--final-gradients must be apply or drop, got 'keep'" \
  train --algo pipe --final-gradients keep "${Q[@]}"
row final-gradients-with-dsync   2 "--final-gradients applies only to pipe, not 'dsync'" \
  train --algo dsync --final-gradients drop "${Q[@]}"

# --help states the defaults and which end of training is Alg. 1.
run train --help >"$R/defaults-help.out" 2>&1
expect_contains "help/defaults-stated" "$R/defaults-help.out" \
  "--async-scale" "1 (as MXNet's dist_async, the paper's ASGD baseline, applies every push) or 1/M" \
  "[asgd and dcasgd; default: 1]" \
  "default: 0.04 with --dc-variant c, 2 with --dc-variant a (OD-SGD paper Sec. 4)" \
  "default: 0.04 with dcasgd-c, 2 with dcasgd-a (OD-SGD paper Sec. 4)" \
  "--final-gradients" "drop (Pipe-SGD paper Alg. 1 as printed" "[pipe; default: apply]"

# Runs: summary.json and the report say what the run used.
ps_run() {  # NAME ARGS...
  local name=$1
  shift
  run train "$@" --data synthetic --iters 6 --workers 2 --no-eval --quiet --out "$R/$name" \
    >"$R/$name.out" 2>"$R/$name.err"
  expect_success "defaults/$name-exit-0" $? "$R/$name.out" "$R/$name.err"
}
ps_run asgd-default --algo asgd
expect_contains "defaults/asgd-default-report" "$R/asgd-default.out" \
  "the servers apply each push as it arrives with gradient scale 1 (--async-scale)."
ps_run asgd-inverse --algo asgd --async-scale 1/M
ps_run dcasgd-a --algo dcasgd --dc-variant a
expect_contains "defaults/dcasgd-a-report" "$R/dcasgd-a.out" \
  "gradient scale 1 (--async-scale); DC-ASGD-a delay compensation by the servers, lambda 2, m 0.95."
ps_run dcasgd-c-lambda --algo dcasgd --dc-lambda 0.5 --async-scale 1/M
ps_run odsgd-dcasgd-a --algo odsgd --warmup-iters 3 --local-updater dcasgd-a
pycheck "defaults/ps-summaries" "$R" <<'PY'
import json, sys
def s(name): return json.load(open(f"{sys.argv[1]}/{name}/summary.json"))
a = s("asgd-default")
assert a["async_scale"] == "1" and "delay_compensation" not in a, a.get("async_scale")
assert s("asgd-inverse")["async_scale"] == "1/M"
d = s("dcasgd-a")
assert d["async_scale"] == "1", d["async_scale"]
dc = d["delay_compensation"]
assert (dc["by"], dc["variant"], dc["lambda"]) == ("servers", "a", 2) and abs(dc["momentum"] - 0.95) < 1e-6, dc
c = s("dcasgd-c-lambda")
assert c["async_scale"] == "1/M" and c["delay_compensation"] == {"by": "servers", "variant": "c", "lambda": 0.5}, c
o = s("odsgd-dcasgd-a")
assert "async_scale" not in o, "odsgd's servers are synchronous"
assert o["delay_compensation"]["by"] == "local updater" and o["delay_compensation"]["variant"] == "a" \
    and o["delay_compensation"]["lambda"] == 2, o["delay_compensation"]
PY

# Pipe-SGD: the end of training and the timing equations. An emulated link gives Eq. 5; Eq. 7 always.
ps_run pipe-default --algo pipe --net 10gbe
expect_contains "defaults/pipe-default-report" "$R/pipe-default.out" \
  "End of training (--final-gradients apply): the aggregated gradients of the last 2 iterations were applied" \
  "drop is Pipe-SGD paper Alg. 1 as printed" "Eq. 5 (Pipe-SGD, sequential comm" \
  "Eq. 5 comm term (alpha 20 us, beta 0.8 ns/byte, gamma 0 ns/byte, S = 0; alpha and beta of the emulated link, gamma 0 without a calibration)" \
  "Eq. 7 scaling efficiency"
ps_run pipe-drop --algo pipe --final-gradients drop
expect_contains "defaults/pipe-drop-report" "$R/pipe-drop.out" \
  "End of training (--final-gradients drop)" "dropped, as Pipe-SGD paper Alg. 1 as printed"
pycheck "defaults/pipe-summaries" "$R" <<'PY'
import json, sys
def s(name): return json.load(open(f"{sys.argv[1]}/{name}/summary.json"))
p = s("pipe-default")
assert p["final_gradients"] == "apply", p["final_gradients"]
assert p["link_model_comm_eq5_s"] > 0 and p["link_model_gamma_s_per_byte"] == 0, p["link_model_comm_eq5_s"]
assert p["predicted_pipe_eq5_s"] == max(p["compute_s"], p["link_model_comm_eq5_s"]), p["predicted_pipe_eq5_s"]
se = p["scaling_efficiency_eq7"]
assert 0 < se <= 1, se
comm = p["mean"]["comm_s"]
assert abs(se - p["compute_s"] / max(p["compute_s"], comm)) < 1e-9, (se, p["compute_s"], comm)
d = s("pipe-drop")
assert d["final_gradients"] == "drop" and d["weights_checksum"] != p["weights_checksum"], d["weights_checksum"]
PY

# A calibration's gamma enters Eq. 5 of a run (no emulated link: its alpha, beta and gamma) and of
# plan's Pipe-SGD section, whose numbers are checked against the formula here.
python3 - "$R/calibration.json" <<'PY'
import json, sys
json.dump({"format": "pipesgd-allreduce-calibration/1", "transport": "local", "world_size": 2,
           "link": {"alpha": 2e-05, "beta": 1e-09, "gamma": 5e-10}}, open(sys.argv[1], "w"))
PY
ps_run pipe-calibrated --algo pipe --allreduce auto --calibration "$R/calibration.json"
# mlp: 784*500 + 500 + 500*500 + 500 + 500*10 + 10 = 648010 fp32 = 2592040 bytes; p = 2:
# Eq. 5 comm = 2(p-1)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ = 2α + n·β + n·γ/2.
pycheck "defaults/pipe-calibrated-eq5" "$R/pipe-calibrated/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
n = 648010 * 4
expected = 2 * 2e-05 + n * 1e-09 + n * 5e-10 / 2
assert abs(s["link_model_comm_eq5_s"] - expected) < 1e-12, (s["link_model_comm_eq5_s"], expected)
assert s["link_model_gamma_s_per_byte"] == 5e-10, s["link_model_gamma_s_per_byte"]
PY
expect_contains "defaults/pipe-calibrated-report" "$R/pipe-calibrated.out" \
  "Eq. 5 comm term (alpha 20 us, beta 1 ns/byte, gamma 0.5 ns/byte, S = 0; alpha, beta and gamma of the calibration)"

run plan --model softmax --workers 2 --data synthetic --profile-iters 2 --plans wfbp,single --quiet \
  --calibration "$R/calibration.json" --out "$R/plan-calibrated" >"$R/plan-calibrated.out" 2>"$R/plan-calibrated.err"
expect_success "defaults/plan-pipe-sgd-exit-0" $? "$R/plan-calibrated.out" "$R/plan-calibrated.err"
expect_contains "defaults/plan-pipe-sgd-section" "$R/plan-calibrated.out" \
  "Pipe-SGD (the paper's Eq. 5-7, K >= 2, ring allreduce, S = 0) from the calibration file's link parameters" \
  "Eq. 5" "pipelined, plan wfbp" "Eq. 6" "Eq. 7 scaling efficiency with sequential communication"
# softmax: 2 layers (weights, bias) so wfbp has L = 2 segments, single L = 1; p = 2.
pycheck "defaults/plan-pipe-sgd-numbers" "$R/plan-calibrated/plan.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["pipe_sgd"]
a, b, g, n = 2e-05, 1e-09, 5e-10, p["gradient_bytes"]
assert n == 7850 * 4, n
assert (p["alpha_s"], p["beta_s_per_byte"], p["gamma_s_per_byte"]) == (a, b, g), p
eq5 = 2 * a + n * b + n * g / 2
assert abs(p["sequential_comm_eq5_s"] - eq5) < 1e-15, (p["sequential_comm_eq5_s"], eq5)
compute = d["forward_s"] + d["backward_s"] + d["update_s"]
assert abs(p["compute_s"] - compute) < 1e-15, (p["compute_s"], compute)
assert p["sequential_iteration_eq5_s"] == max(p["compute_s"], p["sequential_comm_eq5_s"]), p
assert abs(p["scaling_efficiency_eq7"] - p["compute_s"] / max(p["compute_s"], eq5)) < 1e-12, p
rows = {r["plan"]: r for r in p["pipelined_eq6"]}
assert set(rows) == {"wfbp", "single"}, rows
for name, L in (("wfbp", 2), ("single", 1)):
    r = rows[name]
    assert r["segments"] == L, r
    eq6 = 2 * L * a + n * b + n * g / 2
    assert abs(r["comm_s"] - eq6) < 1e-15, (name, r["comm_s"], eq6)
    # The paper's Eq. 6, never below the whole compute (one compute thread runs all of backward).
    it = max(p["compute_s"], p["compute_s"] - d["backward_s"] + r["first_segment_backward_s"], eq6)
    assert abs(r["predicted_iteration_s"] - it) < 1e-15, (name, r, it)
# L = 1 (single: its one segment's backward is the whole backward) is Eq. 5.
assert abs(rows["single"]["predicted_iteration_s"] - p["sequential_iteration_eq5_s"]) < 1e-15, rows["single"]
PY
