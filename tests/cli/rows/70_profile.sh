# shellcheck shell=bash
# `pipesgd profile` (sourced by run_cli_tests.sh; uses $R, $TMP, $TS, DATA_ARGS, run, row, pycheck,
# help_lists_flags, expect_success, expect_contains):
#  - bad input: one stderr line, exit 2 (no --out, unknown model, --iters 0, an --out that cannot be
#    written or is a directory, a batch larger than the data);
#  - the built-in mlp: the file is a valid profile (format, version, its 3 layers with their exact
#    parameter counts, every time > 0, the codecs none, bf16 and int8), stdout has the table, stderr
#    the progress line;
#  - a TorchScript model (55_torchscript.sh's export): its layers, and a source that says the forward
#    was split by backward times (TorchScript models report no forward progress).

row profile-no-out          2 "--out is required"          profile --model mlp --iters 3
row profile-model-unknown   2 "unknown model 'nope'"       profile --model nope --iters 3 --out "$R/nope.json"
row profile-iters-zero      2 "--iters must be in [1, "    profile --model mlp --iters 0 --out "$R/zero.json"
row profile-out-unwritable  2 "--out '$TMP/regular-file': cannot create directory" \
  profile --model mlp --iters 3 --out "$TMP/regular-file/prof.json"
row profile-workers-zero    2 "--workers must be in [1, 256]" profile --model mlp --iters 3 --workers 0 --out "$R/w0.json"
row profile-out-directory   2 "is a directory; give a file name" profile --model mlp --iters 3 --out "$R"
row profile-batch-too-large 2 "--batch 20000 is larger than the training set" \
  profile --model mlp --data synthetic --batch 20000 --iters 3 --out "$R/big.json"

row profile-in-run-one-worker 2 "--in-run needs --workers >= 2" profile --model mlp --iters 3 --in-run --out "$R/r1.json"
row profile-net-without-in-run 2 "--net is --in-run's network; add --in-run" \
  profile --model mlp --iters 3 --workers 2 --net 10gbe --out "$R/n.json"
row profile-in-run-bad-net  2 "--net" profile --model mlp --iters 3 --workers 2 --in-run --net warp9 --out "$R/n.json"
help_lists_flags profile --model --loss --data --data-dir --batch --seed --iters --workers --in-run --net --out --quiet -- profile
run --help >"$R/profile-top-help.out" 2>&1
expect_contains "profile/top-level-help" "$R/profile-top-help.out" "profile"
run frob >"$R/profile-unknown-command.out" 2>&1
expect_contains "profile/unknown-command-lists-it" "$R/profile-unknown-command.out" "plan, profile, simulate, advise"

# The built-in mlp (on the small fixture, batch 5, when Fashion-MNIST is not installed).
run profile --model mlp --iters 3 "${DATA_ARGS[@]}" --out "$R/profile-mlp.json" \
  >"$R/profile-mlp.out" 2>"$R/profile-mlp.err"
expect_success "profile/mlp-exit-0" $? "$R/profile-mlp.out" "$R/profile-mlp.err"
expect_contains "profile/mlp-table" "$R/profile-mlp.out" "layers" "parameters" "forward ms" "backward ms" \
  "update ms" "data ms" "648010" "encode ns/byte" "decode_add ns/byte" "method work" "sapipe:wp3" \
  "wrote $R/profile-mlp.json"
expect_contains "profile/mlp-progress" "$R/profile-mlp.err" "profiling mlp (3 layers, 648010 parameters)"
if grep -q $'\r' "$R/profile-mlp.err"; then fail "profile/progress-plain-lines" "carriage return"; else pass "profile/progress-plain-lines"; fi
pycheck "profile/mlp-file" "$R/profile-mlp.json" "${DATA_ARGS[*]}" <<'PY'
import json, socket, sys
p = json.load(open(sys.argv[1]))
batch = 5 if "--batch 5" in sys.argv[2] else 25
assert p["format"] == "pipesgd-profile" and p["version"] == 1, p
assert p["model"] == "mlp" and p["batch"] == batch, (p["model"], p["batch"])
assert p["source"].startswith(f"measured by pipesgd profile on {socket.gethostname()}, "), p["source"]
assert f", 3 iterations, batch {batch}" in p["source"], p["source"]
assert "forward" not in p["source"], p["source"]  # the mlp reports its forward progress
layers = p["layers"]
assert [l["name"] for l in layers] == ["fc1", "fc2", "fc3"], layers
assert [l["parameters"] for l in layers] == [784 * 500 + 500, 500 * 500 + 500, 500 * 10 + 10], layers
for l in layers:
    assert l["forward_seconds"] > 0 and l["backward_seconds"] > 0, l
assert p["data_seconds"] > 0 and p["update_seconds"] > 0, p
assert set(p["codecs"]) == {"none", "bf16", "int8"}, p["codecs"]
for name, cost in p["codecs"].items():
    assert set(cost) == {"encode", "decode", "decode_add"}, (name, cost)
    assert all(v > 0 for v in cost.values()), (name, cost)
assert set(p["method_costs"]) == {"sapipe:" + c for c in ("none", "dc", "wp1", "wp2", "wp3")}, p.get("method_costs")
assert all(v > 0 for v in p["method_costs"].values()), p["method_costs"]
PY
run profile --model mlp --iters 2 --data synthetic --quiet --out "$R/profile-quiet/mlp.json" \
  >"$R/profile-quiet.out" 2>"$R/profile-quiet.err"
expect_success "profile/quiet-creates-directory" $? "$R/profile-quiet.out" "$R/profile-quiet.err"
if [ -s "$R/profile-quiet.err" ]; then fail "profile/quiet-means-no-stderr" "stderr: $(excerpt "$R/profile-quiet.err")"; else pass "profile/quiet-means-no-stderr"; fi

# Two replicas at once (as two workers of a run compute): the same layers, a source that says so.
run profile --model mlp --iters 2 --data synthetic --workers 2 --out "$R/profile-two.json" \
  >"$R/profile-two.out" 2>"$R/profile-two.err"
expect_success "profile/two-replicas-exit-0" $? "$R/profile-two.out" "$R/profile-two.err"
expect_contains "profile/two-replicas-progress" "$R/profile-two.err" "on 2 replicas at once, 1 thread each"
expect_contains "profile/two-replicas-table" "$R/profile-two.out" "2 replicas at once, their mean"
pycheck "profile/two-replicas-file" "$R/profile-two.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert [(l["name"], l["parameters"]) for l in p["layers"]] == [("fc1", 392500), ("fc2", 250500), ("fc3", 5010)], p["layers"]
assert ", 2 iterations, batch 25, 2 replicas at once (the mean of their medians)" in p["source"], p["source"]
assert all(l["forward_seconds"] > 0 and l["backward_seconds"] > 0 for l in p["layers"]), p["layers"]
PY

# A TorchScript model: the exported mlp.pt (same layers as the built-in mlp), no forward hook.
run profile --model "$TS/mlp.pt" --data synthetic --iters 2 --quiet --out "$R/profile-ts.json" \
  >"$R/profile-ts.out" 2>"$R/profile-ts.err"
expect_success "profile/torchscript-exit-0" $? "$R/profile-ts.out" "$R/profile-ts.err"
pycheck "profile/torchscript-file" "$R/profile-ts.json" "$TS/mlp.pt" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["model"] == sys.argv[2], p["model"]
assert [(l["name"], l["parameters"]) for l in p["layers"]] == [("fc1", 392500), ("fc2", 250500), ("fc3", 5010)], p["layers"]
assert "the model reports no forward progress" in p["source"], p["source"]
assert all(l["forward_seconds"] > 0 and l["backward_seconds"] > 0 for l in p["layers"]), p["layers"]
assert set(p["codecs"]) == {"none", "bf16", "int8"}, p["codecs"]
PY

# Through a run: 2 workers of D-Sync over emulated 10GbE measure each layer's backward, the forward
# and the update (the layer-wise profiling phase); the source says so, the layers are the same.
run profile --model mlp --iters 4 --data synthetic --workers 2 --in-run --net 10gbe --out "$R/profile-in-run.json" \
  >"$R/profile-in-run.out" 2>"$R/profile-in-run.err"
expect_success "profile/in-run-exit-0" $? "$R/profile-in-run.out" "$R/profile-in-run.err"
expect_contains "profile/in-run-progress" "$R/profile-in-run.err" "running 2 workers of D-Sync over network"
expect_contains "profile/in-run-table" "$R/profile-in-run.out" "backward, forward and update: means of a 2-worker D-Sync run"
pycheck "profile/in-run-file" "$R/profile-in-run.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert [(l["name"], l["parameters"]) for l in p["layers"]] == [("fc1", 392500), ("fc2", 250500), ("fc3", 5010)], p["layers"]
assert "means of a 2-worker D-Sync run over network " in p["source"], p["source"]
assert all(l["forward_seconds"] > 0 and l["backward_seconds"] > 0 for l in p["layers"]), p["layers"]
assert p["update_seconds"] > 0, p
PY
