# shellcheck shell=bash
# TorchScript models (--model PATH.pt, --loss) in train, compare and plan, and their errors: one line,
# non-zero exit. The models come from examples/export_models.py run with Debian's /usr/bin/python3
# (python3-torch; scripts/install-deps.sh installs it); if that fails, the rows fail.
# Sourced by run_cli_tests.sh (uses $R, $TMP, Q, run, row, pycheck, expect_success, expect_contains).

TS=$TMP/torchscript
if /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/../../../examples/export_models.py" --test-models --out "$TS" \
  >"$R/torchscript-export.log" 2>&1; then
  pass "torchscript/export-models"
else
  fail "torchscript/export-models" "examples/export_models.py failed: $(excerpt "$R/torchscript-export.log")"
fi
echo "not a model" >"$TS/corrupt.pt"

# Errors.
row ts-missing-file    1 "cannot read model file '$TS/missing.pt'" train --model "$TS/missing.pt" "${Q[@]}"
row ts-corrupt-file    1 "model file '$TS/corrupt.pt' is not a TorchScript module" train --model "$TS/corrupt.pt" "${Q[@]}"
row ts-state-dict      1 "model file '$TS/state_dict.pt' is not a TorchScript module" \
  train --model "$TS/state_dict.pt" "${Q[@]}"
row ts-no-parameters   2 "model file '$TS/no_parameters.pt' has no trainable parameters" \
  train --model "$TS/no_parameters.pt" "${Q[@]}"
row ts-too-few-logits  2 "outputs Float [2, 5] for a batch of 2 but --loss cross-entropy needs logits [2, C] with C >= 10" \
  train --model "$TS/five_logits.pt" "${Q[@]}"
row ts-forward-fails   2 "forward on an input of shape [2, 1, 28, 28] failed" train --model "$TS/regression.pt" "${Q[@]}"
row ts-mse-labelled    2 "--loss mse needs regression targets" train --model "$TS/mlp.pt" --loss mse "${Q[@]}"
row ts-loss-unknown    2 "--loss must be cross-entropy, nll or mse, got 'hinge'" train --model "$TS/mlp.pt" --loss hinge "${Q[@]}"
row ts-nll-builtin     2 "--loss nll needs a TorchScript --model PATH.pt; the built-in model 'mlp' is a cross-entropy" \
  train --model mlp --loss nll "${Q[@]}"
row ts-compare-missing 1 "cannot read model file" compare --algos dsync,pipe --model "$TS/missing.pt" "${Q[@]}"
row ts-plan-missing    1 "cannot read model file" plan --model "$TS/missing.pt" --data synthetic --workers 2 --quiet
row ts-plan-mse-builtin 2 "--loss mse needs a TorchScript" plan --model cnn --loss mse --data synthetic --workers 2 --quiet

# --help of every command that takes --model lists --loss and says what a .pt is.
for command in train compare plan; do
  run "$command" --help >"$R/ts-help-$command.out" 2>&1
  expect_contains "torchscript/help-$command" "$R/ts-help-$command.out" "--loss" "PATH.pt" "torch.jit.save" \
    "do not depend on --seed"
done

# Runs.
run train --model "$TS/mlp.pt" --algo pipe --data synthetic --iters 6 --workers 2 --quiet --out "$R/ts-train" \
  >"$R/ts-train.out" 2>"$R/ts-train.err"
expect_success "torchscript/train-mlp-pt" $? "$R/ts-train.out" "$R/ts-train.err"
run train --model "$TS/mlp_logsoftmax.pt" --loss nll --data synthetic --iters 4 --workers 3 --quiet --no-eval \
  --out "$R/ts-nll" >"$R/ts-nll.out" 2>"$R/ts-nll.err"
expect_success "torchscript/train-nll-3-workers" $? "$R/ts-nll.out" "$R/ts-nll.err"
TIMEOUT=180 run compare --model "$TS/gru.pt" --algos dsync,pipe+int8,sapipe+wp3 --data synthetic --iters 6 --workers 2 \
  --quiet --no-eval --out "$R/ts-compare" >"$R/ts-compare.out" 2>"$R/ts-compare.err"
expect_success "torchscript/compare-gru-pt" $? "$R/ts-compare.out" "$R/ts-compare.err"
TIMEOUT=180 run plan --model "$TS/transformer.pt" --data synthetic --workers 2 --profile-iters 2 --quiet \
  --out "$R/ts-plan" >"$R/ts-plan.out" 2>"$R/ts-plan.err"
expect_success "torchscript/plan-transformer-pt" $? "$R/ts-plan.out" "$R/ts-plan.err"
expect_contains "torchscript/plan-names-model" "$R/ts-plan.out" "pipesgd plan: $TS/transformer.pt ("
pycheck "torchscript/summaries" "$R" "$TS" <<'PY'
import json, sys
r, ts = sys.argv[1:3]
s = json.load(open(f"{r}/ts-train/summary.json"))
model = s["configuration"]["model"] if "configuration" in s else s["model"]
assert model["name"] == f"{ts}/mlp.pt", model
assert model["parameters"] == 648010 and model["segments"] == 3, model
n = json.load(open(f"{r}/ts-nll/summary.json"))
assert n["configuration"]["model"]["name"] == f"{ts}/mlp_logsoftmax.pt"
c = json.load(open(f"{r}/ts-compare/compare.json"))
assert len(c["runs"] if isinstance(c, dict) and "runs" in c else c) == 3, str(c)[:200]
PY

# SAPipe pipelines a model without a forward hook: the synchronous layers' pending updates are applied
# before the next forward starts (torchscript_model.h); 22 iterations pass its start-up (8) and
# profiling (10).
TIMEOUT=180 run train --model "$TS/transformer.pt" --algo sapipe+wp3 --data synthetic --iters 22 --workers 2 --quiet \
  --no-eval >"$R/ts-sapipe.out" 2>"$R/ts-sapipe.err"
expect_success "torchscript/sapipe-pipelines" $? "$R/ts-sapipe.out" "$R/ts-sapipe.err"
expect_contains "torchscript/sapipe-report" "$R/ts-sapipe.out" "SAPipe partial staleness: k = " "pipelined from iteration 18"
if grep -qF "never pipelined" "$R/ts-sapipe.out"; then fail "torchscript/sapipe-pipelined" "the run never pipelined"; else pass "torchscript/sapipe-pipelined"; fi

# --loss mse end to end: regression.pt (inputs [batch, 4], output [batch, 1]) on float32 targets
# y = x . w + 0.5 in npy files; the loss falls and no accuracy is reported (null).
MSE=$TMP/mse-data
if /usr/bin/python3 - "$MSE" >"$R/mse-data.log" 2>&1 <<'PY'
import os, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)
w = np.array([0.5, -1.0, 0.25, 2.0], dtype=np.float32)
for split, n in (("train", 512), ("test", 128)):
    x = rng.standard_normal((n, 4)).astype(np.float32)
    np.save(f"{d}/{split}_x.npy", x)
    np.save(f"{d}/{split}_y.npy", (x @ w + 0.5).astype(np.float32).reshape(n, 1))
os.makedirs(d + "-labels", exist_ok=True)
for split, n in (("train", 64), ("test", 16)):
    np.save(f"{d}-labels/{split}_x.npy", rng.standard_normal((n, 4)).astype(np.float32))
    np.save(f"{d}-labels/{split}_y.npy", rng.integers(0, 3, n))
PY
then pass "torchscript/mse-data"; else fail "torchscript/mse-data" "numpy data: $(excerpt "$R/mse-data.log")"; fi
run train --model "$TS/regression.pt" --loss mse --data "npy:$MSE" --iters 20 --workers 2 --quiet --out "$R/ts-mse" \
  >"$R/ts-mse.out" 2>"$R/ts-mse.err"
expect_success "torchscript/train-mse-regression" $? "$R/ts-mse.out" "$R/ts-mse.err"
pycheck "torchscript/mse-loss-falls-no-accuracy" "$R/ts-mse" <<'PY'
import json, sys
d = sys.argv[1]
s = json.load(open(f"{d}/summary.json"))
assert s["final_train_accuracy"] is None and s["final_test_accuracy"] is None, (s["final_train_accuracy"], s["final_test_accuracy"])
losses = [r["loss"] for r in map(json.loads, open(f"{d}/metrics.jsonl")) if r["type"] == "iteration"]
assert len(losses) == 20, len(losses)
first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
assert last < 0.5 * first, f"mse loss did not fall: first {first}, last {last}"
epochs = [r for r in map(json.loads, open(f"{d}/metrics.jsonl")) if r["type"] == "epoch"]
assert epochs and epochs[-1]["train_accuracy"] is None and epochs[-1]["test_loss"] > 0, epochs[-1]
PY
# The loss and the data disagree: one line, non-zero exit.
row ts-mse-on-labels   2 "--loss mse needs regression targets" \
  train --model "$TS/regression.pt" --loss mse --data "npy:$MSE-labels" --iters 2 --workers 2 --quiet
row ts-ce-on-targets   2 "--loss cross-entropy" \
  train --model "$TS/regression.pt" --data "npy:$MSE" --iters 2 --workers 2 --quiet
