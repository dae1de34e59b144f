#!/usr/bin/env bash
# A newcomer's day, after `bash scripts/build.sh` on a fresh clone (ctest's `newcomer` runs it on the
# build under test):
#   1. the README's commands, in order (tests/docs/run_doc_commands.py README.md);
#   2. the own-model path: a TorchScript model with batch norm saved from Python, numpy's default
#      float64 data, `train --out`, the trained model loaded back with torch.jit.load and its test
#      accuracy equal to the run's own final evaluation; `pipesgd export` of a checkpoint;
#   3. Ctrl-C: a run interrupted keeps its --out and says nothing it did not measure;
#   4. the install: `cmake --install` into a scratch prefix; that prefix's pipesgd and pipesgdrun
#      work without PYTHONPATH.
#
#   tests/docs/newcomer.sh BUILD_DIR
#
# Prints `ok STEP` / `FAIL STEP: why` and a summary; exits 1 if a step failed.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: newcomer.sh BUILD_DIR}" && pwd)
python=/usr/bin/python3
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d /tmp/pipesgd-newcomer.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1: $2"; }
pipesgd=$build/pipesgd

# 1. The README, in order.
if "$python" "$repo/tests/docs/run_doc_commands.py" --build "$build" "$repo/README.md" >readme.log 2>&1; then
  ok "readme-commands ($(tail -n 1 readme.log))"
else
  bad "readme-commands" "$(grep -E '^FAIL' readme.log | head -3 | tr '\n' '|')"
fi

# 2. My own model and my own data (torch.jit.script reads the class's source: a file, not stdin).
cat >net.py <<'EOF'
import os, numpy as np, torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 26 * 26, 10)
    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))
torch.manual_seed(0)
torch.jit.save(torch.jit.script(Net()), "net.pt")
rng = np.random.default_rng(0)
os.makedirs("data", exist_ok=True)
centers = rng.random((10, 28, 28))          # ten classes, each a noisy copy of its own image
for split, n in (("train", 400), ("test", 100)):
    y = rng.integers(0, 10, n)
    x = centers[y] + 4.0 * rng.random((n, 28, 28))                    # float64, numpy's default
    np.save(f"data/{split}_x.npy", x.reshape(n, 1, 28, 28))           # one channel, as the model takes
    np.save(f"data/{split}_y.npy", y)
EOF
if "$python" net.py >own-model.log 2>&1; then
  ok "own-model-saved-from-python"
else
  bad "own-model-saved-from-python" "$(tail -c 300 own-model.log)"
fi
"$pipesgd" train --model net.pt --data npy:data --algo dsync --workers 2 --batch 20 --epochs 2 --out mine \
  --checkpoint-dir ckpt --checkpoint-every 10 >train.out 2>train.err
status=$?
if ((status == 0)) && [[ -f mine/model.pt ]]; then ok "own-model-trains-and-writes-model.pt"
else bad "own-model-trains-and-writes-model.pt" "exit $status, $(ls mine 2>&1 | tr '\n' ' '), $(tail -c 300 train.err)"; fi
if "$python" - mine <<'EOF' >load.log 2>&1; then
import json, sys, numpy as np, torch
out = sys.argv[1]
model = torch.jit.load(f"{out}/model.pt").eval()
x = torch.from_numpy(np.load("data/test_x.npy")).float()
y = torch.from_numpy(np.load("data/test_y.npy"))
with torch.no_grad():
    accuracy = (model(x).argmax(1) == y).double().mean().item()
summary = json.load(open(f"{out}/summary.json"))
expected = summary["final_test_accuracy"]
assert abs(accuracy - expected) < 1e-9, f"loaded model's test accuracy {accuracy} != run's {expected}"
print(f"test accuracy {accuracy:.4f} from torch.jit.load, as the run's")
EOF
  ok "trained-model-loads-in-python ($(tail -n 1 load.log))"
else
  bad "trained-model-loads-in-python" "$(tail -c 400 load.log | tr '\n' '|')"
fi
checkpoint=$(ls ckpt/*.psgd 2>/dev/null | tail -n 1)
if [[ -n $checkpoint ]] && "$pipesgd" export "$checkpoint" --out exported.pt >export.log 2>&1 &&
   "$python" -c 'import torch, sys; torch.jit.load(sys.argv[1])' exported.pt 2>>export.log; then
  ok "export-a-checkpoint"
else
  bad "export-a-checkpoint" "checkpoint '${checkpoint}': $(tail -c 300 export.log)"
fi
if "$pipesgd" train --iter 50 >typo.out 2>typo.err; then bad "typo-suggests" "exit 0"
elif grep -q -- "--iters" typo.err; then ok "typo-suggests"
else bad "typo-suggests" "$(head -c 200 typo.err)"; fi

# 3. Ctrl-C, inside the first epoch: over an emulated 1 Gbit link an iteration takes milliseconds,
# so epoch 1 (1200 iterations) lasts far longer than the wait below, however idle the machine (on
# local links an idle machine finished epoch 1 before the interrupt landed).
"$pipesgd" train --algo pipe+int8 --workers 2 --epochs 3 --net 1gbe --out stopped >stop.out 2>stop.err &
pid=$!
for _ in $(seq 1 60); do [[ -s stopped/metrics.jsonl ]] && break; sleep 0.5; done
sleep 1
kill -INT "$pid"
wait "$pid"
status=$?
if ((status == 130)) && "$python" -c 'import json, sys; s = json.load(open(sys.argv[1])); assert s.get("interrupted"), s.get("interrupted")' stopped/summary.json 2>/dev/null &&
   ! grep -qE "Final train accuracy: 0\.00%|epoch [0-9]+/[0-9]+ done" stop.out stop.err; then
  ok "ctrl-c-keeps-out-and-says-only-what-was-measured"
else
  bad "ctrl-c-keeps-out-and-says-only-what-was-measured" "exit $status; $(tail -c 300 stop.out stop.err | tr '\n' '|')"
fi

# 4. The install.
prefix=$work/prefix
if cmake --install "$build" --prefix "$prefix" >install.log 2>&1 && [[ -x $prefix/bin/pipesgd && -x $prefix/bin/pipesgdrun ]]; then
  ok "install-has-pipesgd-and-pipesgdrun"
else
  bad "install-has-pipesgd-and-pipesgdrun" "$(tail -c 300 install.log)"
fi
if env -u PYTHONPATH "$prefix/bin/pipesgd" train --workers 2 --iters 20 --quiet --out installed >inst.out 2>inst.err; then
  ok "installed-pipesgd-trains"
else
  bad "installed-pipesgd-trains" "$(tail -c 300 inst.err)"
fi
if size=$(cd / && env -u PYTHONPATH "$prefix/bin/pipesgdrun" -np 2 "$python" -c \
     'import pipesgd.torch as hvd; hvd.init(); print(hvd.size()) if hvd.rank() == 0 else None' 2>run.err) &&
   [[ $(echo "$size" | tail -n 1) == 2 ]]; then
  ok "installed-pipesgdrun-imports-its-package"
else
  bad "installed-pipesgdrun-imports-its-package" "got '${size:-}': $(tail -c 300 run.err)"
fi

echo "$passed passed, $failed failed"
((failed == 0))
