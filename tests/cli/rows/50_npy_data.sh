# shellcheck shell=bash
# NumPy data (--data npy:DIR): a labelled 28x28 set trains the built-in models like the same pixels
# as IDX files do (uint8 x, float32 x/255 and the MNIST-format fixture give the same weights and
# losses); compare and plan take it; bad files and data that does not fit the model stop with one
# stderr line (exit 1 for the data, as the IDX errors; exit 2 for flags and a model that does not
# fit the data). Sourced by run_cli_tests.sh (uses $R, $TMP, $FX, run, row, pycheck, pass, fail,
# expect_success, expect_contains). The .npy files are written by Debian's numpy (/usr/bin/python3).

NPY=$TMP/npy
if ! /usr/bin/python3 - "$FX/good" "$NPY" <<'EOF'; then
import gzip, os, sys
import numpy as np

fixture, out = sys.argv[1], sys.argv[2]

def idx(name, header):
    with gzip.open(os.path.join(fixture, name + ".gz")) as f:
        return np.frombuffer(f.read()[header:], dtype=np.uint8)

# The pixels and labels of the MNIST-format fixture $FX/good (200 train, 50 test images).
train_x = idx("train-images-idx3-ubyte", 16).reshape(-1, 28, 28)
train_y = idx("train-labels-idx1-ubyte", 8).astype(np.int64)
test_x = idx("t10k-images-idx3-ubyte", 16).reshape(-1, 28, 28)
test_y = idx("t10k-labels-idx1-ubyte", 8).astype(np.int64)

def write(directory, **arrays):
    os.makedirs(os.path.join(out, directory), exist_ok=True)
    files = dict(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y)
    files.update(arrays)
    for name, array in files.items():
        if array is not None:
            np.save(os.path.join(out, directory, name + ".npy"), array)

def scaled(x):  # what the reader makes of uint8: x / 255 in float32
    return x.astype(np.float32) / np.float32(255)

write("u8")
write("f32", train_x=scaled(train_x), test_x=scaled(test_x))
write("u8-int32-labels", train_y=train_y.astype(np.int32), test_y=test_y.astype(np.int32))
write("count-mismatch", train_y=train_y[:-3])
write("f16", train_x=scaled(train_x).astype(np.float16))
write("i16", train_x=train_x.astype(np.int16))
write("missing-file", test_y=None)
write("truncated")
path = os.path.join(out, "truncated", "train_x.npy")
data = open(path, "rb").read()
open(path, "wb").write(data[: len(data) - 100])
rng = np.random.default_rng(5)
write("shape-3x4", train_x=rng.random((200, 3, 4), dtype=np.float32), test_x=rng.random((50, 3, 4), dtype=np.float32))
write("regression", train_y=rng.random((200, 2), dtype=np.float32), test_y=rng.random((50, 2), dtype=np.float32))
write("twelve-classes", train_y=np.arange(200) % 12)
EOF
  fail "npy/fixtures" "numpy fixtures could not be written (needs /usr/bin/python3 with python3-numpy)"
fi

NPY_RUN=(--workers 2 --batch 10 --iters 5 --quiet --no-eval)
run train --model mlp --data "npy:$NPY/u8" "${NPY_RUN[@]}" --out "$R/npy-u8" >"$R/npy-u8.out" 2>"$R/npy-u8.err"
expect_success "npy/train-uint8-exit-0" $? "$R/npy-u8.out" "$R/npy-u8.err"
expect_contains "npy/train-report-names-the-data" "$R/npy-u8.out" "(u8/train, 200 training examples)"
pycheck "npy/train-summary-names-the-data" "$R/npy-u8/summary.json" "$NPY/u8" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
data = s["configuration"]["data"]
assert data["set"] == "npy" and data["source"] == sys.argv[2], data
assert data["train_examples"] == 200 and data["test_examples"] == 50, data
assert s["iterations"] == 5 and s["model"] == "mlp", (s["iterations"], s["model"])
assert s["weights_checksum"] and 0 <= s["final_train_accuracy"] <= 1, s
EOF
run train --data "npy:$NPY/f32" "${NPY_RUN[@]}" --out "$R/npy-f32" >"$R/npy-f32.out" 2>"$R/npy-f32.err"
expect_success "npy/train-float32-exit-0" $? "$R/npy-f32.out" "$R/npy-f32.err"
run train --data "npy:$NPY/u8-int32-labels" "${NPY_RUN[@]}" --out "$R/npy-i32" >"$R/npy-i32.out" 2>"$R/npy-i32.err"
expect_success "npy/train-int32-labels-exit-0" $? "$R/npy-i32.out" "$R/npy-i32.err"
run train --data-dir "$FX/good" "${NPY_RUN[@]}" --out "$R/npy-idx" >"$R/npy-idx.out" 2>"$R/npy-idx.err"
expect_success "npy/train-idx-twin-exit-0" $? "$R/npy-idx.out" "$R/npy-idx.err"
# The same values train to the same weights, whichever file format or dtype holds them.
pycheck "npy/uint8-float32-int32-and-idx-train-alike" "$R/npy-u8" "$R/npy-f32" "$R/npy-i32" "$R/npy-idx" <<'EOF'
import json, sys
def run(d):
    s = json.load(open(d + "/summary.json"))
    losses = [json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"iteration"' in l]
    return s["weights_checksum"], losses
runs = [run(d) for d in sys.argv[1:]]
assert len(runs[0][1]) == 5, runs[0]
for d, r in zip(sys.argv[2:], runs[1:]):
    assert r == runs[0], f"{d}: {r} != {runs[0]}"
EOF

run compare --algos dsync,pipe --data "npy:$NPY/u8" --model softmax --workers 2 --batch 10 --iters 4 --quiet --no-eval \
  >"$R/npy-compare.out" 2>"$R/npy-compare.err"
expect_success "npy/compare-exit-0" $? "$R/npy-compare.out" "$R/npy-compare.err"
expect_contains "npy/compare-table" "$R/npy-compare.out" "on softmax (u8/train)" "samples/s"

# --- Bad files: exit 1 (data errors, as the IDX ones), one line naming the file.
row npy-count-mismatch 1 "x/y count mismatch: $NPY/count-mismatch/train_x.npy has 200 examples but" \
  train --data "npy:$NPY/count-mismatch" "${NPY_RUN[@]}"
row npy-float16-inputs 1 "train_x.npy: inputs of dtype float16 (<f2) are not accepted; expected float32 (<f4) or uint8" \
  train --data "npy:$NPY/f16" "${NPY_RUN[@]}"
row npy-int16-inputs 1 "train_x.npy: inputs of dtype int16 (<i2) are not accepted" \
  train --data "npy:$NPY/i16" "${NPY_RUN[@]}"
row npy-truncated 1 "data file $NPY/truncated/train_x.npy: truncated: shape [200, 28, 28] of uint8 (|u1) needs 156800 data bytes" \
  train --data "npy:$NPY/truncated" "${NPY_RUN[@]}"
row npy-missing-file 1 "data directory $NPY/missing-file: missing test_y.npy; --data npy:DIR must name a directory holding" \
  train --data "npy:$NPY/missing-file" "${NPY_RUN[@]}"
row npy-missing-dir 1 "data directory $NPY/absent does not exist; --data npy:DIR must name" \
  train --data "npy:$NPY/absent" "${NPY_RUN[@]}"
row npy-compare-truncated 1 "truncated" compare --algos dsync,pipe --data "npy:$NPY/truncated" "${NPY_RUN[@]}"

# --- Data that does not fit the built-in model: exit 2, naming the model and the data's shape.
row npy-shape-does-not-fit-mlp 2 \
  "model 'mlp' takes 784 features per example (28x28) and labels 0 to 9; the data --data npy:$NPY/shape-3x4 has examples of shape [3, 4] (12 features)" \
  train --data "npy:$NPY/shape-3x4" "${NPY_RUN[@]}"
row npy-regression-does-not-fit-cnn 2 "model 'cnn' takes 784 features per example (28x28) and labels 0 to 9; the data --data npy:$NPY/regression has regression targets (2 per example)" \
  train --data "npy:$NPY/regression" "${NPY_RUN[@]}" --model cnn
row npy-classes-do-not-fit-softmax 2 "has labels up to 11" \
  compare --algos dsync,pipe --data "npy:$NPY/twelve-classes" "${NPY_RUN[@]}" --model softmax
row npy-plan-shape-does-not-fit 2 "model 'mlp' takes 784 features" plan --data "npy:$NPY/shape-3x4" --quiet

# --- Flags.
row npy-with-data-dir 2 "--data-dir cannot be combined with --data npy:$NPY/u8" \
  train --data "npy:$NPY/u8" --data-dir "$FX/good" "${NPY_RUN[@]}"
row npy-empty-dir 2 "--data npy:DIR needs a directory after 'npy:'" train --data npy: "${NPY_RUN[@]}"
row npy-unknown-data 2 "unknown data set 'numpy' (expected fashion-mnist, synthetic or npy:DIR)" \
  train --data numpy "${NPY_RUN[@]}"
run train --help >"$R/npy-help.out" 2>&1
expect_contains "npy/help-says-npy" "$R/npy-help.out" "npy:DIR (DIR/train_x.npy" "uint8 (scaled by 1/255)"
