# shellcheck shell=bash
# SAPipe's defaults (sourced by run_cli_tests.sh): --algo sapipe is the paper's SAPipe (SAPipe paper
# Sec. 5.1: weight prediction option 3, lambda 0.2) with the DC term as printed; --dc-bound on clamps
# the DC scalar (Theorem 3's condition per step) and the summary counts the clamps; sapipe+none is
# vanilla SAPipe; the help states the defaults.
SAPIPE_ARGS=(--data synthetic --iters 30 --workers 2 --stale-layers 2 --buckets wfbp --quiet --no-eval)

run train --algo sapipe "${SAPIPE_ARGS[@]}" --out "$R/sapipe-default" >"$R/sapipe-default.out" 2>"$R/sapipe-default.err"
expect_success "sapipe-defaults/default-exit-0" $? "$R/sapipe-default.out" "$R/sapipe-default.err"
expect_contains "sapipe-defaults/default-report" "$R/sapipe-default.out" \
  "compensation wp3 (lambda 0.2, DC term unbounded, as printed)"
pycheck "sapipe-defaults/default-summary" "$R/sapipe-default/summary.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["sapipe"]
assert r["compensation"] == "wp3" and r["dc_lambda"] == 0.2 and r["dc_bound"] is False, r
assert "bounded_compensations" not in r, r
PY

run train --algo sapipe "${SAPIPE_ARGS[@]}" --dc-bound on --dc-lambda 1e6 --out "$R/sapipe-bound" \
  >"$R/sapipe-bound.out" 2>"$R/sapipe-bound.err"
expect_success "sapipe-defaults/bound-exit-0" $? "$R/sapipe-bound.out" "$R/sapipe-bound.err"
pycheck "sapipe-defaults/bound-count" "$R/sapipe-bound/summary.json" "$R/sapipe-bound.out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["sapipe"]
assert r["compensation"] == "wp3" and r["dc_bound"] is True and r["dc_lambda"] == 1e6, r
count = r["bounded_compensations"]
assert count > 0, f"lambda 1e6 clamped {count} updates"
line = ("compensation wp3 (lambda 1e+06, --dc-bound on: the DC scalar clamped to Theorem 3's condition in "
        f"{count} predictions of rank 0)")
assert line in open(sys.argv[2]).read(), line
PY

run train --algo sapipe+none "${SAPIPE_ARGS[@]}" --out "$R/sapipe-none" >"$R/sapipe-none.out" 2>"$R/sapipe-none.err"
expect_success "sapipe-defaults/none-exit-0" $? "$R/sapipe-none.out" "$R/sapipe-none.err"
expect_contains "sapipe-defaults/none-report" "$R/sapipe-none.out" "compensation none, pipelined from iteration"
pycheck "sapipe-defaults/none-summary" "$R/sapipe-none/summary.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["sapipe"]
assert r["compensation"] == "none" and "dc_bound" not in r and "bounded_compensations" not in r, r
PY

row sapipe-dc-bound-value 2 "--dc-bound must be off or on, got 'yes'" train --algo sapipe --dc-bound yes "${Q[@]}"
row sapipe-dc-bound-none  2 "--dc-bound applies only to sapipe with --compensation dc or wp3 (the DC term's bound), not none" \
  train --algo sapipe+none --dc-bound on "${Q[@]}"
row sapipe-dc-bound-wp1   2 "--dc-bound applies only to sapipe with --compensation dc or wp3 (the DC term's bound), not wp1" \
  train --algo sapipe --compensation wp1 --dc-bound off "${Q[@]}"

# compare: --dc-bound reaches the entries with a DC term only.
run compare --algos sapipe+none,sapipe+dc --dc-bound on "${SAPIPE_ARGS[@]}" >"$R/sapipe-bound-compare.out" \
  2>"$R/sapipe-bound-compare.err"
expect_success "sapipe-defaults/compare-bound-exit-0" $? "$R/sapipe-bound-compare.out" "$R/sapipe-bound-compare.err"
expect_contains "sapipe-defaults/compare-bound-report" "$R/sapipe-bound-compare.out" \
  "sapipe+none: k = 2 of 3 layers stale" "(--stale-layers), compensation none, pipelined" \
  "compensation dc (lambda 0.2, --dc-bound on: the DC scalar clamped to Theorem 3's condition in"

run train --help >"$R/sapipe-help.out" 2>&1
pycheck "sapipe-defaults/help" "$R/sapipe-help.out" <<'PY'
import sys
text = open(sys.argv[1]).read()
lines = {line.split()[0]: line for line in text.splitlines() if line.strip().startswith("--")}
compensation, bound, lam = lines["--compensation"], lines["--dc-bound"], lines["--dc-lambda"]
assert "wp3 is the paper's default, Sec. 5.1" in compensation and "[sapipe; default: wp3]" in compensation, compensation
assert "1 - 1/sqrt(2)" in bound and "Theorem 3" in bound and "not in the paper" in bound, bound
assert "[sapipe with --compensation dc or wp3; default: off]" in bound, bound
assert "[sapipe; default: 0.2]" in lam, lam
PY
