# shellcheck shell=bash
# The trained model comes back: train's --out model.pt and checkpoint-<i>-model.pt beside each
# checkpoint set, and `pipesgd export CHECKPOINT --out model.pt`, read back by torch.jit.load in
# Debian's /usr/bin/python3 (python3-torch) as the independent oracle: its predictions on the test set
# give exactly the run's final evaluation, its parameters are the run's final weights (summary.json's
# weights_checksum), its BatchNorm statistics are rank 0's trained ones, and an export of a checkpoint
# is the model written at that checkpoint, bit for bit. Errors: one line, exit 1 for a bad file, 2 for
# usage. Sourced by run_cli_tests.sh (uses $R, $TMP, $FX, run, row, pass, fail, expect_success).

EX=$TMP/export
mkdir -p "$EX"
# bn.pt: conv 3x3 (4 channels) + BatchNorm + ReLU + max-pool 2 + Linear 784-10, for [batch, 1, 28, 28];
# mlp.pt: another model, for the wrong-model rows. (torch.jit.script reads the classes' source: a file.)
cat >"$EX/make_models.py" <<'PY'
import sys
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 14 * 14, 10)
    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.bn(self.conv(x))), 2).flatten(1))
class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 10)
    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))
torch.jit.script(Net()).save(sys.argv[1] + "/bn.pt")
torch.jit.script(Mlp()).save(sys.argv[1] + "/mlp.pt")
PY
if /usr/bin/python3 "$EX/make_models.py" "$EX" >"$R/export-models.log" 2>&1; then pass "export/models"; else fail "export/models" "torch.jit.script: $(excerpt "$R/export-models.log")"; fi

# A TorchScript model given by a relative path (the run records its directory; export runs elsewhere)
# and a built-in with BatchNorm, each with a checkpoint halfway.
EXD=(--data-dir "$FX/good" --workers 2 --batch 10 --quiet)
(cd "$EX" && run train --model bn.pt --iters 6 "${EXD[@]}" --out "$R/export-ts" --checkpoint-every 3 \
  --checkpoint-dir "$R/export-ts-ck") >"$R/export-ts.out" 2>"$R/export-ts.err"
expect_success "export/train-torchscript" $? "$R/export-ts.out" "$R/export-ts.err"
expect_contains "export/train-says-model-pt" "$R/export-ts.out" "/export-ts/{metrics.jsonl,summary.json,model.pt}"
run train --model resnet --iters 8 "${EXD[@]}" --out "$R/export-resnet" --checkpoint-every 4 \
  --checkpoint-dir "$R/export-resnet-ck" >"$R/export-resnet.out" 2>"$R/export-resnet.err"
expect_success "export/train-resnet" $? "$R/export-resnet.out" "$R/export-resnet.err"

# softmax (pure C++, written as TorchScript too); its checkpoint models are pruned with their sets (the 2
# newest sets are kept: 6 and 8).
run train --model softmax --iters 10 "${EXD[@]}" --out "$R/export-softmax" --checkpoint-every 2 \
  --checkpoint-dir "$R/export-softmax-ck" >"$R/export-softmax.out" 2>"$R/export-softmax.err"
expect_success "export/train-softmax" $? "$R/export-softmax.out" "$R/export-softmax.err"
models=$(cd "$R/export-softmax-ck" 2>/dev/null && echo checkpoint-*-model.pt)
if [ "$models" = "checkpoint-000000000006-model.pt checkpoint-000000000008-model.pt" ]; then
  pass "export/checkpoint-models-pruned-with-their-sets"
else
  fail "export/checkpoint-models-pruned-with-their-sets" "models left: $models"
fi

TS_CK=$R/export-ts-ck/checkpoint-000000000003
RN_CK=$R/export-resnet-ck/checkpoint-000000000004
run export "$TS_CK-rank0.psgd" --out "$R/export-ts-3.pt" >"$R/export-ts-3.out" 2>"$R/export-ts-3.err"
expect_success "export/checkpoint-torchscript" $? "$R/export-ts-3.out" "$R/export-ts-3.err"
run export "$RN_CK-shared.psgd" --out "$R/export-resnet-4.pt" >"$R/export-resnet-4.out" 2>"$R/export-resnet-4.err"
expect_success "export/checkpoint-resnet-shared-part" $? "$R/export-resnet-4.out" "$R/export-resnet-4.err"
run export "$R/export-resnet-ck" --out "$R/export-resnet-dir.pt" >"$R/export-resnet-dir.out" 2>"$R/export-resnet-dir.err"
expect_success "export/checkpoint-resnet-dir" $? "$R/export-resnet-dir.out" "$R/export-resnet-dir.err"

# The oracle: one interpreter for every check (prints ok/FAIL lines).
/usr/bin/python3 - "$FX/good" "$R" "$EX" >"$R/export-check.out" 2>&1 <<'PY'
import gzip, json, sys
import numpy as np
import torch

fx, r, ex = sys.argv[1:4]
torch.set_num_threads(1)

def report(name, ok, why=""):
    print(f"ok export/{name}" if ok else f"FAIL export/{name}: {why}")

def idx(name, header):
    with gzip.open(f"{fx}/{name}.gz") as f:
        return np.frombuffer(f.read()[header:], dtype=np.uint8).copy()

# The test set as pipesgd reads it: pixel / 255 in float32; the final evaluation runs rank 0's model in
# eval mode on it (one chunk: 50 examples), with LibTorch's graph optimizer off for TorchScript.
x = torch.from_numpy(idx("t10k-images-idx3-ubyte", 16)).float().div(255.0)
y = torch.from_numpy(idx("t10k-labels-idx1-ubyte", 8)).long()

def fnv(tensors):  # core/checksum.h over the flat weights
    h = 14695981039346656037
    for w in np.concatenate([t.detach().contiguous().view(-1).numpy().view(np.uint32) for t in tensors]).tolist():
        h = ((h ^ w) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h

def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t

def same_state(a, b):
    a, b = a.state_dict(), b.state_dict()
    return a.keys() == b.keys() and all(torch.equal(bits(a[k]), bits(b[k])) for k in a)

def final_model(name, out, shape, earlier):
    s = json.load(open(f"{r}/{out}/summary.json"))
    m = torch.jit.load(f"{r}/{out}/model.pt")
    report(f"{name}-model-pt-eval-mode", not m.training, "model.pt is saved in train mode")
    m.eval()
    with torch.jit.optimized_execution(False), torch.no_grad():
        correct = int((m(x.view(shape)).argmax(1) == y).sum())
    expected = round(s["final_test_accuracy"] * len(y))
    report(f"{name}-model-pt-accuracy", correct == expected,
           f"torch.jit.load's model predicts {correct} of {len(y)} right, the run's final evaluation {expected}")
    checksum = fnv([p for _, p in m.named_parameters()])
    report(f"{name}-model-pt-final-weights", checksum == int(s["weights_checksum"], 16),
           f"parameters' checksum {checksum:x}, summary.json's weights_checksum {s['weights_checksum']}")
    state, before = m.state_dict(), earlier.state_dict()
    unchanged = [k for k, v in state.items() if not k.endswith("num_batches_tracked") and torch.equal(v, before[k])]
    report(f"{name}-model-pt-trained", not unchanged, f"equal to {earlier_name[name]}: {unchanged}")
    counts = {k: int(v) for k, v in state.items() if k.endswith("num_batches_tracked")}
    if name != "softmax":
        report(f"{name}-model-pt-batchnorm-of-rank-0", counts and set(counts.values()) == {s["iterations"]},
               f"num_batches_tracked {counts}, the run had {s['iterations']} iterations")

earlier_name = {"torchscript": f"{ex}/bn.pt", "resnet": "checkpoint-000000000004-model.pt",
                "softmax": "checkpoint-000000000006-model.pt"}
try:
    ts_ck = torch.jit.load(f"{r}/export-ts-ck/checkpoint-000000000003-model.pt")
    rn_ck = torch.jit.load(f"{r}/export-resnet-ck/checkpoint-000000000004-model.pt")
    final_model("torchscript", "export-ts", (-1, 1, 28, 28), torch.jit.load(f"{ex}/bn.pt"))
    final_model("resnet", "export-resnet", (-1, 784), rn_ck)
    final_model("softmax", "export-softmax", (-1, 784),
                torch.jit.load(f"{r}/export-softmax-ck/checkpoint-000000000006-model.pt"))
    # pipesgd export of a checkpoint: the model written at that checkpoint, parameters and buffers bit for bit.
    report("export-equals-checkpoint-model-torchscript", same_state(torch.jit.load(f"{r}/export-ts-3.pt"), ts_ck),
           "export-ts-3.pt differs from checkpoint-000000000003-model.pt")
    for file in ("export-resnet-4.pt", "export-resnet-dir.pt"):
        report(f"export-equals-checkpoint-model-resnet/{file}", same_state(torch.jit.load(f"{r}/{file}"), rn_ck),
               f"{file} differs from checkpoint-000000000004-model.pt")
    # The built-in's TorchScript takes images too.
    with torch.no_grad():
        report("resnet-takes-images", torch.equal(rn_ck.eval()(x.view(-1, 784)), rn_ck(x.view(-1, 1, 28, 28))),
               "[N, 784] and [N, 1, 28, 28] inputs disagree")
except Exception as error:
    print(f"FAIL export/oracle: {type(error).__name__}: {error}")
PY
while IFS= read -r line; do
  case $line in
    "ok "*) pass "${line#ok }" ;;
    "FAIL "*) rest=${line#FAIL }; fail "${rest%%: *}" "${rest#*: }" ;;
    *) fail "export/oracle" "$(excerpt "$R/export-check.out")"; break ;;
  esac
done <"$R/export-check.out"
[ -s "$R/export-check.out" ] || fail "export/oracle" "no output from /usr/bin/python3"

# Bad input: one line, exit 1 for a bad file, 2 for usage.
echo "not a checkpoint" >"$EX/not-a-checkpoint.psgd"
row export-missing-file     1 "cannot open" export "$EX/missing.psgd" --out "$EX/x.pt"
row export-not-a-checkpoint 1 "checkpoint '$EX/not-a-checkpoint.psgd'" export "$EX/not-a-checkpoint.psgd" --out "$EX/x.pt"
row export-torchscript-file 1 "checkpoint '$EX/bn.pt'" export "$EX/bn.pt" --out "$EX/x.pt"
row export-empty-dir        1 "no valid checkpoint with a rank0 part in '$EX'" export "$EX" --out "$EX/x.pt"
row export-wrong-builtin    2 "model 'cnn' (61706 parameters" export "$RN_CK-rank0.psgd" --model cnn --out "$EX/x.pt"
row export-wrong-torchscript 2 "model file '$EX/mlp.pt' has the layers" \
  export "$TS_CK-rank0.psgd" --model "$EX/mlp.pt" --out "$EX/x.pt"
row export-unknown-model    2 "unknown model 'vgg'" export "$RN_CK-rank0.psgd" --model vgg --out "$EX/x.pt"
row export-missing-model-file 1 "cannot read model file '$EX/gone.pt'" \
  export "$TS_CK-rank0.psgd" --model "$EX/gone.pt" --out "$EX/x.pt"
row export-no-out           2 "--out" export "$RN_CK-rank0.psgd"
row export-out-dir-missing  2 "$EX/no-such-dir" export "$RN_CK-rank0.psgd" --out "$EX/no-such-dir/x.pt"
if [ -e "$EX/x.pt" ]; then fail "export/errors-write-nothing" "$EX/x.pt exists"; else pass "export/errors-write-nothing"; fi
