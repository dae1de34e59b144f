#!/usr/bin/env bash
# End-to-end tests of the `pipesgd` command line.
#
#   tests/cli/run_cli_tests.sh path/to/pipesgd
#
# Prints one line per check (`ok <name>` or `FAIL <name>: why`) and, last, exactly one summary line
# `N passed, M failed`. Exits 0 only if nothing failed. Needs bash, coreutils `timeout`, python3 and,
# for the real-data runs, the Fashion-MNIST files in /usr/share/datasets/fashion-mnist (the data
# fixtures fall back to generated images when those are missing).
set -u

# shellcheck source=cli_test_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh"
cli_test_setup pipesgd-cli-tests "$@"
mkdir -p "$TMP/runs"

# ---------------------------------------------------------------------------------------------------
# Data fixtures: small MNIST-format directories, good and broken (200 train / 50 test images).
FX=$TMP/fixtures
python3 - "$REAL_DATA" "$FX" <<'EOF' || { echo "FAIL setup: fixture generation failed"; echo "0 passed, 1 failed"; exit 1; }
import gzip, os, random, struct, sys

real, out = sys.argv[1], sys.argv[2]
TRAIN, TEST = 200, 50

def source(name, header, count, item):
    path = os.path.join(real, name + ".gz")
    if os.path.exists(path):
        with gzip.open(path) as f:
            data = f.read(header + count * item)
        return data[header:]
    rng = random.Random(len(name))
    if item == 1:
        return bytes(rng.randrange(10) for _ in range(count))
    return bytes(rng.randrange(256) for _ in range(count * item))

train_images = source("train-images-idx3-ubyte", 16, TRAIN, 784)
train_labels = source("train-labels-idx1-ubyte", 8, TRAIN, 1)
test_images = source("t10k-images-idx3-ubyte", 16, TEST, 784)
test_labels = source("t10k-labels-idx1-ubyte", 8, TEST, 1)

def images(count, pixels, rows=28, cols=28, magic=b"\x00\x00\x08\x03"):
    return magic + struct.pack(">III", count, rows, cols) + pixels

def labels(count, values):
    return b"\x00\x00\x08\x01" + struct.pack(">I", count) + values

def good():
    return {
        "train-images-idx3-ubyte": images(TRAIN, train_images),
        "train-labels-idx1-ubyte": labels(TRAIN, train_labels),
        "t10k-images-idx3-ubyte": images(TEST, test_images),
        "t10k-labels-idx1-ubyte": labels(TEST, test_labels),
    }

def write(directory, files, gz=False):
    os.makedirs(os.path.join(out, directory), exist_ok=True)
    for name, data in files.items():
        if name.endswith(".gz") or gz:
            path = os.path.join(out, directory, name if name.endswith(".gz") else name + ".gz")
            with open(path, "wb") as f:
                f.write(gzip.compress(data))
        else:
            with open(os.path.join(out, directory, name), "wb") as f:
                f.write(data)

write("good", good(), gz=True)

files = good()  # images header says 200, the file holds 150
files["train-images-idx3-ubyte"] = images(TRAIN, train_images[: 150 * 784])
write("truncated", files)

files = good()  # byte-swapped magic, as a little-endian writer would produce
files["train-images-idx3-ubyte"] = images(TRAIN, train_images, magic=b"\x03\x08\x00\x00")
write("bad-magic", files)

files = good()  # 200 images, 180 labels
files["train-labels-idx1-ubyte"] = labels(180, train_labels[:180])
write("count-mismatch", files)

files = good()  # gzip stream cut in the middle
compressed = gzip.compress(files.pop("train-images-idx3-ubyte"))
write("gzip-cut", files)
with open(os.path.join(out, "gzip-cut", "train-images-idx3-ubyte.gz"), "wb") as f:
    f.write(compressed[: len(compressed) // 2])

files = good()
del files["t10k-labels-idx1-ubyte"]
write("missing-file", files)

files = good()  # label 10 at index 7
bad = bytearray(train_labels)
bad[7] = 10
files["train-labels-idx1-ubyte"] = labels(TRAIN, bytes(bad))
write("bad-label", files)

files = good()  # valid 10x10 images: the models expect 28x28
files["train-images-idx3-ubyte"] = images(TRAIN, bytes(TRAIN * 100), 10, 10)
files["t10k-images-idx3-ubyte"] = images(TEST, bytes(TEST * 100), 10, 10)
write("small-images", files)
EOF
touch "$TMP/regular-file"

# What every part uses: a valid rest of a train command line, the runs' directory, the data.
Q=(--data synthetic --iters 3 --quiet --no-eval)
R=$TMP/runs
have_real_data=0
[ -e "$REAL_DATA/train-images-idx3-ubyte.gz" ] || [ -e "$REAL_DATA/train-images-idx3-ubyte" ] && have_real_data=1
DATA_ARGS=()
[ $have_real_data -eq 1 ] || DATA_ARGS=(--data-dir "$FX/good" --batch 5)

# The topic files rows/NN_*.sh whose NN is in [from, to], in name order.
rows_files() {  # FROM TO
  local file number
  for file in "$(dirname "${BASH_SOURCE[0]}")"/rows/*.sh; do
    [ -e "$file" ] || continue
    number=$(basename "$file")
    number=$((10#${number%%_*}))
    if [ "$number" -ge "$1" ] && [ "$number" -le "$2" ]; then echo "$file"; fi
  done
}

# PIPESGD_CLI_PART (ctest runs the suite as two tests, each far from its timeout): "main" runs the
# sections below and the topic files rows/10-39_*; "rows" only the topic files rows/40-99_*, which
# use nothing of the others but the fixtures and the settings above; unset or "all", everything.
case ${PIPESGD_CLI_PART:-all} in
  all | main) ;;
  rows)
    for rows_file in $(rows_files 40 99); do
      # shellcheck disable=SC1090
      . "$rows_file"
    done
    cli_test_finish
    exit ;;
  *) cli_test_abort "PIPESGD_CLI_PART must be all, main or rows, got '$PIPESGD_CLI_PART'" ;;
esac

# ---------------------------------------------------------------------------------------------------
# 1. Malformed inputs. Exit 2: usage errors (UsageError, CLI11 parse errors); exit 1: data/runtime.

row algo-unknown            2 "unknown algorithm 'pipes'" train --algo pipes "${Q[@]}"
row algo-empty-name         2 "'+int8'"                   train --algo +int8 "${Q[@]}"
row algo-two-codecs         2 "more than one codec"       train --algo pipe+int8+bf16 "${Q[@]}"
row codec-unknown           2 "unknown codec 'zstd'"      train --codec zstd "${Q[@]}"
row allreduce-unknown       2 "--allreduce 'butterfly': expected ring" train --allreduce butterfly "${Q[@]}"
row calibration-needs-auto  2 "--calibration is only used by --allreduce auto" train --calibration x.json "${Q[@]}"
row calibration-missing     1 "cannot open" train --allreduce auto --calibration /nonexistent/c.json "${Q[@]}"
row bench-unknown-algorithm 2 "--algos 'butterfly'"      bench allreduce --algos butterfly --sizes 4K
row calibrate-one-rank      2 "at least 2 ranks"         calibrate --workers 1 --sizes 4K
row segment-bytes-word      2 "--segment-bytes 'fast'"    train --segment-bytes fast "${Q[@]}"
row segment-bytes-tiny      2 "at least 4 bytes"          train --segment-bytes 2 "${Q[@]}"
row bench-segment-bytes     2 "--segment-bytes '1X'"      bench allreduce --segment-bytes 1X --sizes 4K
row algo-codec-unknown      2 "'zstd'"                    train --algo pipe+zstd "${Q[@]}"
row model-unknown           2 "unknown model 'vgg'"       train --model vgg "${Q[@]}"
row staleness-zero          2 "--staleness-k"             train --algo pipe --staleness-k 0 "${Q[@]}"
row workers-zero            2 "--workers must be in"    train "${Q[@]}" --workers 0
row workers-negative        2 "--workers must be in"    train "${Q[@]}" --workers -3
row workers-not-a-number    2 "four"                      train "${Q[@]}" --workers four
row workers-too-large-int   2 "99999999999"               train "${Q[@]}" --workers 99999999999
row net-unknown-preset      2 "--net '7gbe'"              train --net 7gbe "${Q[@]}"
row net-bw-not-a-number     2 "--net 'bw=fast'"           train --net bw=fast "${Q[@]}"
row net-latency-unit        2 "parsecs"                   train --net bw=1Gbit,lat=3parsecs "${Q[@]}"
row net-zero-bandwidth      2 "--net"                     train --net bw=0Gbit "${Q[@]}"
row net-unknown-key         2 "--net"                     train --net bw=1Gbit,jitter=3us "${Q[@]}"
row lr-zero                 2 "--lr"                      train --lr 0 "${Q[@]}"
row lr-nan                  2 "--lr"                      train --lr nan "${Q[@]}"
row momentum-above-one      2 "--momentum"                train --momentum 1.5 "${Q[@]}"
row weight-decay-negative   2 "--weight-decay"            train --weight-decay -1 "${Q[@]}"
row batch-zero              2 "--batch"                   train --batch 0 "${Q[@]}"
row batch-negative          2 "--batch"                   train --batch -1 "${Q[@]}"
row batch-overflow          2 "batch"                     train --batch 4611686018427387904 --data synthetic --iters 3 --workers 4 --quiet --no-eval
row epochs-zero             2 "--epochs"                  train --epochs 0 --data synthetic --workers 2 --quiet --no-eval
row iters-negative          2 "--iters must be in"      train --data synthetic --iters -5 --workers 2 --quiet --no-eval
row iters-huge              1,2 "--iters"                 train --data synthetic --iters 1000000000000 --workers 2 --quiet --no-eval
row epochs-huge             1,2 "--epochs"                train --data synthetic --epochs 99999999999999999 --workers 2 --quiet --no-eval
row warmup-negative         2 "--warmup"                  train --algo pipe --warmup-epochs -1 "${Q[@]}"
row unknown-flag            2 "--frobnicate"              train --frobnicate "${Q[@]}"
row unexpected-positional   2 "extra"                     train extra "${Q[@]}"
row unknown-subcommand      2 "frob"                      frob
row data-unknown            2 "imagenet"                  train --data imagenet --iters 3 --quiet
row data-synthetic-with-dir 2 "--data-dir"                train --data synthetic --data-dir /tmp --iters 3 --quiet
row data-dir-nonexistent    1 "/nonexistent"              train --data-dir /nonexistent --iters 3 --quiet
row data-dir-is-a-file      1 "not a directory"           train --data-dir "$TMP/regular-file" --iters 3 --quiet
row data-missing-file       1 "t10k-labels-idx1-ubyte"    train --data-dir "$FX/missing-file" --iters 3 --quiet
row data-truncated-images   1 "truncated"                 train --data-dir "$FX/truncated" --iters 3 --quiet
row data-wrong-magic        1 "not an IDX file"           train --data-dir "$FX/bad-magic" --iters 3 --quiet
row data-count-mismatch     1 "count mismatch"            train --data-dir "$FX/count-mismatch" --iters 3 --quiet
row data-gzip-cut-off       1 "cut off"                   train --data-dir "$FX/gzip-cut" --iters 3 --quiet
row data-label-out-of-range 1 "label at index 7"          train --data-dir "$FX/bad-label" --iters 3 --quiet
row data-wrong-image-size   1,2 "784"                     train --data-dir "$FX/small-images" --workers 2 --iters 3 --quiet
row out-under-regular-file  2 "--out"                     train "${Q[@]}" --out "$TMP/regular-file/run"
row comm-timeout-zero       2 "--comm-timeout"            train --comm-timeout 0 "${Q[@]}"
row comm-timeout-negative   2 "--comm-timeout"            train --comm-timeout -5 "${Q[@]}"
row compare-empty-entry     2 "empty entry"               compare --algos dsync,,pipe "${Q[@]}"
row compare-empty-list      2 "empty"                     compare --algos "" "${Q[@]}"
row compare-unknown-algo    2 "'pipes'"                   compare --algos dsync,pipes "${Q[@]}"
row bench-no-subcommand     2 "subcommand"                bench
row servers-with-dsync      2 "--servers applies only to the parameter-server methods pssync, asgd, dcasgd and odsgd, not 'dsync'" \
  train --servers 2 --algo dsync "${Q[@]}"
row servers-with-pipe       2 "--servers applies only" train --servers 1 --algo pipe "${Q[@]}"
row servers-negative        2 "--servers must be in"      train --algo pssync --servers -1 "${Q[@]}"
# The mlp has 3 parameter segments (one per layer): a 4th server would own nothing (ShardPlan).
row servers-too-many        2 "--servers 4 exceeds the model's 3 parameter segments" \
  train --algo pssync --servers 4 "${Q[@]}"
row servers-codec           2 "a codec, which applies only to dsync, pipe" train --algo asgd+int8 "${Q[@]}"
row odsgd-codec             2 "a codec, which applies only to dsync, pipe" train --algo odsgd+bf16 "${Q[@]}"
# DC-ASGD, OD-SGD's local updater and the warm-up: bad values, and flags given to a method they do
# not concern (train rejects them; compare applies them where they belong).
row dc-variant-unknown      2 "--dc-variant must be c (DC-ASGD-c, constant lambda) or a" \
  train --algo dcasgd --dc-variant b "${Q[@]}"
row dc-variant-with-pssync  2 "--dc-variant applies only to dcasgd, not 'pssync'" \
  train --algo pssync --dc-variant a "${Q[@]}"
row dc-lambda-negative      2 "--dc-lambda must be >= 0, got -1" train --algo dcasgd --dc-lambda -1 "${Q[@]}"
row dc-lambda-with-odsgd-sgd 2 "--dc-lambda applies only to dcasgd, odsgd with --local-updater" \
  train --algo odsgd --dc-lambda 0.1 "${Q[@]}"
row dc-momentum-with-c      2 "--dc-momentum applies only to dcasgd --dc-variant a" \
  train --algo dcasgd --dc-momentum 0.5 "${Q[@]}"
row dc-momentum-one         2 "--dc-momentum must be in [0, 1), got 1" \
  train --algo dcasgd --dc-variant a --dc-momentum 1 "${Q[@]}"
row local-updater-unknown   2 "--local-updater must be sgd, dcasgd-c or dcasgd-a, got 'adam'" \
  train --algo odsgd --local-updater adam "${Q[@]}"
row local-updater-with-asgd 2 "--local-updater applies only to odsgd, not 'asgd'" \
  train --algo asgd --local-updater sgd "${Q[@]}"
row local-lr-zero           2 "--local-lr must be > 0, got 0" train --algo odsgd --local-lr 0 "${Q[@]}"
row warmup-with-dsync       2 "--warmup-iters applies only to pipe, odsgd and sapipe, not 'dsync'" \
  train --algo dsync --warmup-iters 5 "${Q[@]}"
# Layer-wise communication: bucket plans and their flags.
row buckets-unknown         2 'unknown bucket plan "fastest"' train --buckets fastest "${Q[@]}"
row buckets-with-pipe       2 "--buckets applies only to dsync" train --algo pipe --buckets wfbp "${Q[@]}"
row buckets-and-spec-plan   2 "--buckets wfbp and the method's bucket plan 'optimal': give one" \
  train --algo dsync+optimal --buckets wfbp "${Q[@]}"
row plan-suffix-on-pipe     2 "unknown option 'optimal' in method 'pipe+optimal'" train --algo pipe+optimal "${Q[@]}"
row wfbp-other-plan         2 "method 'wfbp' is dsync with the wfbp plan; for the optimal plan use dsync+optimal" \
  train --algo wfbp+optimal "${Q[@]}"
row profile-iters-no-plan   2 "--profile-iters applies only to layer-wise communication" \
  train --profile-iters 3 "${Q[@]}"
row profile-iters-zero      2 "--profile-iters must be in [1, 10000000], got 0" \
  train --algo wfbp --profile-iters 0 "${Q[@]}"
row replan-negative         2 "--replan-every must be in [0, 10000000] (0: never), got -2" \
  train --algo mgwfbp --replan-every -2 "${Q[@]}"
row fixed-plan-zero         2 'bucket plan "fixed:0": the size must be a number of MiB > 0' \
  train --algo dsync+fixed:0 "${Q[@]}"
row plan-unknown-plan       2 'unknown bucket plan "bogus"' plan --plans wfbp,bogus --data synthetic
row plan-workers-zero       2 "--workers must be in"      plan --workers 0 --data synthetic
row plan-profile-zero       2 "--profile-iters must be in" plan --profile-iters 0 --data synthetic
# SAPipe and the optimizer.
row stale-layers-word       2 "--stale-layers must be auto or a layer count" \
  train --algo sapipe --stale-layers some "${Q[@]}"
row stale-layers-too-many   2 "(the model has 3 layers), got '4'" train --algo sapipe --stale-layers 4 "${Q[@]}"
row stale-layers-with-pipe  2 "--stale-layers applies only to sapipe, not 'pipe'" \
  train --algo pipe --stale-layers 1 "${Q[@]}"
row compensation-unknown    2 "unknown --compensation 'dcx' (expected none, dc, wp1, wp2, wp3)" \
  train --algo sapipe --compensation dcx "${Q[@]}"
row compensation-with-dsync 2 "--compensation applies only to sapipe and auto with policy stale or any, not 'dsync'" \
  train --compensation dc "${Q[@]}"
row compensation-twice      2 "method 'sapipe+dc+wp1' names more than one compensation" \
  train --algo sapipe+dc+wp1 "${Q[@]}"
row compensation-flag-and-spec 2 "--compensation wp1 and the method's compensation 'dc': give one" \
  train --algo sapipe+dc --compensation wp1 "${Q[@]}"
row compensation-on-pipe    2 "unknown option 'dc' in method 'pipe+dc'" train --algo pipe+dc "${Q[@]}"
row optimizer-unknown       2 "unknown optimizer 'rmsprop' (expected sgd, adam)" train --optimizer rmsprop "${Q[@]}"
row optimizer-adam-ps       2 "the parameter-server methods run SGD on their servers" \
  train --algo pssync --optimizer adam "${Q[@]}"
row adam-with-momentum      2 "--momentum is SGD's; Adam's first-moment decay is --adam-beta1" \
  train --optimizer adam --momentum 0.9 "${Q[@]}"
row adam-beta1-one          2 "--adam-beta1 must be in [0, 1), got 1" train --optimizer adam --adam-beta1 1 "${Q[@]}"
row adam-eps-zero           2 "--adam-eps must be > 0, got 0" train --optimizer adam --adam-eps 0 "${Q[@]}"
# Reliability: --on-nonfinite, --check-consistency, --inject-fault (train/fault_injection.h).
row on-nonfinite-unknown    2 "--on-nonfinite must be stop or skip" train --on-nonfinite maybe "${Q[@]}"
row check-consistency-negative 2 "--check-consistency" train --check-consistency -1 "${Q[@]}"
row check-consistency-asgd  2 "differ by design"          train --algo asgd --check-consistency 5 "${Q[@]}"
row inject-fault-no-iter    2 "'iter' is missing"         train --inject-fault rank=1 "${Q[@]}"
row inject-fault-not-worker 2 "is not a worker"           train --inject-fault rank=9,iter=1,kind=crash "${Q[@]}"
row inject-fault-past-run   2 "past the run"              train --inject-fault rank=1,iter=99999999,kind=crash "${Q[@]}"
row inject-fault-bad-kind   2 "kind must be crash, hang or slow" train --inject-fault rank=1,iter=1,kind=explode "${Q[@]}"
row inject-fault-bad-at     2 "at must be iteration, checkpoint, allreduce or push" train --inject-fault rank=1,iter=1,kind=crash,at=backward "${Q[@]}"
row inject-fault-push-dsync 2 "at=push: 'dsync' runs no parameter servers" train --algo dsync --inject-fault rank=1,iter=1,kind=crash,at=push "${Q[@]}"
row inject-fault-allreduce-pssync 2 "at=allreduce: 'pssync' pushes to parameter servers" \
  train --algo pssync --inject-fault rank=1,iter=1,kind=crash,at=allreduce "${Q[@]}"
# Runtime failures (exit 1, one line): a diverging run stops at the first non-finite gradient, naming
# the layer; a crashed worker makes the others time out within --comm-timeout, naming the iteration.
row nonfinite-stops         1 "non-finite gradient (NaN or Inf) in layer" \
  train --data synthetic --iters 20 --lr 1e4 --quiet --no-eval
row fault-crash-times-out   1 "at iteration" \
  train --data synthetic --iters 20 --inject-fault rank=1,iter=3,kind=crash --comm-timeout 2 --quiet --no-eval
if grep -qF "timed out" "$TMP/rows/fault-crash-times-out.err"; then
  pass "error/fault-crash-times-out-says-timed-out"
else
  fail "error/fault-crash-times-out-says-timed-out" "stderr: $(excerpt "$TMP/rows/fault-crash-times-out.err")"
fi
# Mid-operation: worker 1 dies after sending part of iteration 3's allreduce; the others still name
# the iteration within --comm-timeout.
row fault-crash-mid-allreduce 1 "at iteration" \
  train --data synthetic --iters 20 --inject-fault rank=1,iter=3,kind=crash,at=allreduce --comm-timeout 2 --quiet --no-eval
if grep -qE "timed out|failed" "$TMP/rows/fault-crash-mid-allreduce.err"; then
  pass "error/fault-crash-mid-allreduce-says-timed-out"
else
  fail "error/fault-crash-mid-allreduce-says-timed-out" "stderr: $(excerpt "$TMP/rows/fault-crash-mid-allreduce.err")"
fi
# parse_sizes accepts any multiple of 4 bytes (3K = 3072 is valid), so the odd size is 6 bytes.
row bench-size-not-multiple-of-4 2 "multiple of 4"        bench allreduce --sizes 6
row bench-size-unit         2 "'4X'"                      bench allreduce --sizes 4X
row bench-size-empty-entry  2 "--sizes"                   bench allreduce --sizes 4K,
row bench-size-too-large    2 "--sizes"                   bench allreduce --sizes 5G
row bench-codec-unknown     2 "unknown codec 'lz4'"       bench allreduce --codecs none,lz4
row bench-repeats-zero      2 "--repeats"                 bench allreduce --repeats 0
row bench-warmup-negative   2 "--warmup"                  bench allreduce --warmup -1
row bench-workers-zero      2 "--workers"                 bench allreduce --workers 0
row bench-net-unknown       2 "--net '7gbe'"              bench allreduce --net 7gbe
row bench-comm-timeout-zero 2 "--comm-timeout"            bench allreduce --comm-timeout 0
# One behaviour across subcommands (rows without --quiet: a single stderr line shows that the input
# was refused before any work, which would have printed progress).
row out-is-a-regular-file   2 "--out '$TMP/regular-file': cannot create directory" \
  train --data synthetic --iters 3 --no-eval --out "$TMP/regular-file"
row plan-out-is-a-regular-file 2 "--out '$TMP/regular-file'" plan --data synthetic --out "$TMP/regular-file"
row bench-out-is-a-regular-file 2 "--out '$TMP/regular-file'" bench allreduce --sizes 4K --out "$TMP/regular-file"
row calibrate-out-is-a-regular-file 2 "--out '$TMP/regular-file'" \
  calibrate --workers 2 --sizes 4K,64K --repeats 1 --out "$TMP/regular-file"
row calibrate-one-size      2 "--sizes: calibrate fits each algorithm's a + b*M" calibrate --workers 2 --sizes 4K
row calibrate-two-timings   2 "got 2 size(s) x 1 algorithm(s)" calibrate --workers 2 --sizes 4K,8K --algos ring
# A method option a method does not take is refused for every method, and an option named twice
# with two values (the spec's +int8 and --codec bf16) is an error.
row staleness-with-dsync    2 "--staleness-k applies only to pipe and auto with policy stale or any, not 'dsync'" \
  train --algo dsync --staleness-k 3 "${Q[@]}"
row codec-with-pssync       2 "--codec applies only to dsync, pipe, wfbp, synceasgd, mgwfbp, sapipe and auto with policy lossy or any, not 'pssync'" \
  train --algo pssync --codec bf16 "${Q[@]}"
row allreduce-with-asgd     2 "--allreduce applies only to" train --algo asgd --allreduce tree "${Q[@]}"
row codec-spec-and-flag     2 "--codec bf16 and the method's codec 'int8': give one" \
  train --algo pipe+int8 --codec bf16 "${Q[@]}"
row compare-flag-for-none   2 "none of the compared methods" compare --algos dsync,pssync --staleness-k 3 "${Q[@]}"
row calibration-with-pssync 2 "--calibration applies only to" \
  train --algo pssync --calibration x.json "${Q[@]}"

# Values that must either work or be rejected as usage errors naming the flag, never fail oddly.
either_works_or_rejected() {  # NAME FLAG ARGS...
  local name=$1 flag=$2
  shift 2
  local out="$TMP/rows/$name.out" err="$TMP/rows/$name.err"
  run "$@" >"$out" 2>"$err"
  local rc=$?
  if [ "$rc" -eq 0 ] && ! grep -qE "$CRASH_PATTERN" "$out" "$err"; then
    pass "limits/$name"
    return
  fi
  WHY=()
  check_error_contract "$rc" 2 "$flag" "$out" "$err"
  if [ ${#WHY[@]} -eq 0 ]; then
    pass "limits/$name"
  else
    fail "limits/$name" "neither ran (exit 0) nor was rejected as a usage error naming $flag: $(join_why) [pipesgd $* -> stderr: $(excerpt "$err")]"
  fi
}
either_works_or_rejected comm-timeout-huge "--comm-timeout" train --comm-timeout 1e300 "${Q[@]}"
# ~317 years: a "never time out" value that fits in the int64 milliseconds.
either_works_or_rejected comm-timeout-1e10 "--comm-timeout" train --comm-timeout 1e10 "${Q[@]}"
either_works_or_rejected bench-comm-timeout-huge "--comm-timeout" \
  bench allreduce --comm-timeout 1e300 --workers 4 --sizes 4K,64K --repeats 3 --codecs none
# K slots of full-size gradients: a K far beyond the run must not exhaust memory (3 GB cap here).
either_works_or_rejected staleness-huge "--staleness-k" train --algo pipe --staleness-k 100000 "${Q[@]}"

# ---------------------------------------------------------------------------------------------------
# 2. Help.
run --help >"$TMP/help.out" 2>"$TMP/help.err"
rc=$?
if [ $rc -eq 0 ] && grep -qw train "$TMP/help.out" && grep -qw compare "$TMP/help.out" &&
   grep -qw bench "$TMP/help.out" && grep -qw plan "$TMP/help.out" && grep -qw calibrate "$TMP/help.out"; then
  pass "help/top-level"
else
  fail "help/top-level" "exit $rc, stdout: $(excerpt "$TMP/help.out")"
fi

# help_lists_flags NAME FLAGS... -- COMMAND...: COMMAND --help exits 0 and names every flag.
help_lists_flags() {
  local name=$1
  shift
  local flags=()
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  local out="$TMP/$name-help.out"
  run "$@" --help >"$out" 2>&1
  local rc=$? missing=() flag
  for flag in "${flags[@]}"; do
    grep -qE -- "(^|[ ,])$flag([ =,]|$)" "$out" || missing+=("$flag")
  done
  if [ $rc -eq 0 ] && [ ${#missing[@]} -eq 0 ]; then
    pass "help/$name-lists-every-flag"
  else
    fail "help/$name-lists-every-flag" "exit $rc, missing: ${missing[*]:-none}"
  fi
}
TRAIN_FLAGS=(--algo --workers --model --data --data-dir --epochs --iters --seed --lr --momentum
             --weight-decay --batch --staleness-k --warmup-epochs --warmup-iters --codec --net
             --comm-timeout --out --quiet --no-eval --servers --transport --allreduce --calibration
             --segment-bytes --dc-variant --dc-lambda --dc-momentum --local-updater --local-lr
             --buckets --profile-iters --replan-every --trace --trace-iters)
help_lists_flags train "${TRAIN_FLAGS[@]}" -- train
help_lists_flags compare --algos "${TRAIN_FLAGS[@]:1}" -- compare
help_lists_flags plan --model --workers --net --calibration --allreduce --codec --batch --data --data-dir \
  --seed --plans --profile-iters --out --quiet -- plan
help_lists_flags bench-allreduce --workers --net --codecs --sizes --repeats --warmup --comm-timeout --out --quiet \
  -- bench allreduce
help_lists_flags calibrate --workers --net --algos --sizes --repeats --warmup --comm-timeout --out --quiet -- calibrate

row no-subcommand 2 "subcommand"   # no arguments at all

# ---------------------------------------------------------------------------------------------------
# 3. Real runs.

# 3a. pipe+int8 on Fashion-MNIST (or on the small fixture if the package is missing).
run train --algo pipe+int8 --iters 30 --workers 2 --quiet "${DATA_ARGS[@]}" --out "$R/pipe-int8" \
  >"$R/pipe-int8.out" 2>"$R/pipe-int8.err"
rc=$?
expect_success "train/pipe+int8-exit-0" $rc "$R/pipe-int8.out" "$R/pipe-int8.err"
pycheck "train/pipe+int8-metrics.jsonl" "$R/pipe-int8/metrics.jsonl" <<'EOF'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
iterations = [r for r in records if r.get("type") == "iteration"]
epochs = [r for r in records if r.get("type") == "epoch"]
assert len(iterations) == 30, f"{len(iterations)} iteration records, expected 30"
assert len(epochs) >= 1, "no epoch record"
keys = ["update_s", "forward_s", "backward_s", "wait_s", "comm_s", "iteration_s", "loss"]
for r in iterations:
    missing = [k for k in keys if k not in r]
    assert not missing, f"iteration {r.get('iteration')} lacks {missing}"
    assert all(isinstance(r[k], (int, float)) for k in keys), f"non-numeric value in {r}"
assert [r.get("iteration") for r in iterations] == list(range(30)), "iteration numbers are not 0..29"
EOF
pycheck "train/pipe+int8-summary.json" "$R/pipe-int8/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert s.get("method") == "pipe+int8", f"method {s.get('method')!r}"
assert s.get("codec") == "int8", f"codec {s.get('codec')!r}"
assert s.get("workers") == 2, f"workers {s.get('workers')!r}"
assert s.get("iterations") == 30, f"iterations {s.get('iterations')!r}"
assert s.get("throughput_samples_per_s", 0) > 0, "throughput_samples_per_s not > 0"
for key in ["predicted_pipe_eq4_s", "predicted_dsync_eq2_s", "final_test_accuracy"]:
    assert key in s, f"no {key}"
assert s["predicted_pipe_eq4_s"] > 0 and s["predicted_dsync_eq2_s"] >= s["predicted_pipe_eq4_s"], \
    f"Eq. 2 {s['predicted_dsync_eq2_s']} / Eq. 4 {s['predicted_pipe_eq4_s']}"
assert 0 <= s["final_test_accuracy"] <= 1, f"final_test_accuracy {s['final_test_accuracy']}"
EOF
expect_contains "train/report-table" "$R/pipe-int8.out" \
  update forward backward "exposed wait" "comm thread" "samples/s" "Eq. 2" "Eq. 4"
if [ -s "$R/pipe-int8.err" ]; then
  fail "train/quiet-means-no-stderr" "stderr: $(excerpt "$R/pipe-int8.err")"
else
  pass "train/quiet-means-no-stderr"
fi

# 3b. Progress on a non-tty stderr: plain lines, no carriage returns.
run train --epochs 1 --data synthetic --workers 2 --batch 100 >"$R/progress.out" 2>"$R/progress.err"
rc=$?
expect_success "progress/exit-0" $rc "$R/progress.out" "$R/progress.err"
if grep -q $'\r' "$R/progress.err"; then
  fail "progress/no-carriage-returns" "stderr has \\r: $(excerpt "$R/progress.err")"
elif ! grep -qE 'epoch 1/1: [0-9]+/[0-9]+ iterations' "$R/progress.err" ||
     ! grep -q 'epoch 1/1 done' "$R/progress.err"; then
  fail "progress/no-carriage-returns" "no plain progress lines: $(excerpt "$R/progress.err")"
else
  pass "progress/no-carriage-returns"
fi

# 3c. compare.
run compare --algos dsync,pipe,pipe+bf16 --iters 20 --data synthetic --workers 2 --quiet \
  --out "$R/compare" >"$R/compare.out" 2>"$R/compare.err"
rc=$?
expect_success "compare/exit-0" $rc "$R/compare.out" "$R/compare.err"
pycheck "compare/compare.json" "$R/compare/compare.json" <<'EOF'
import json, sys
records = json.load(open(sys.argv[1]))
assert isinstance(records, list) and len(records) == 3, f"expected a list of 3, got {records!r:.100}"
methods = [r.get("method") for r in records]
assert methods == ["dsync", "pipe", "pipe+bf16"], f"methods {methods}"
for r in records:
    for key in ["throughput_samples_per_s", "iteration_s", "breakdown", "final_test_accuracy"]:
        assert key in r, f"{r.get('method')}: no {key}"
    assert r["throughput_samples_per_s"] > 0, f"{r['method']}: throughput not > 0"
    assert isinstance(r["breakdown"], dict) and "comm_s" in r["breakdown"], f"{r['method']}: breakdown"
EOF
pycheck "compare/per-method-summaries" "$R/compare" <<'EOF'
import glob, json, os, sys
found = {}
for path in glob.glob(os.path.join(sys.argv[1], "*", "summary.json")):
    found[json.load(open(path)).get("method")] = path
    assert os.path.exists(os.path.join(os.path.dirname(path), "metrics.jsonl")), f"no metrics.jsonl by {path}"
missing = [m for m in ["dsync", "pipe", "pipe+bf16"] if m not in found]
assert not missing, f"no summary.json for {missing} (found {sorted(found)})"
EOF
expect_contains "compare/table" "$R/compare.out" dsync pipe pipe+bf16 "samples/s" speedup

# 3d. The parameter-server methods (server threads after the workers).
run train --algo pssync --data synthetic --iters 5 --workers 2 --servers 1 --quiet \
  >"$R/pssync.out" 2>"$R/pssync.err"
rc=$?
expect_success "train/pssync-exit-0" $rc "$R/pssync.out" "$R/pssync.err"
expect_contains "train/pssync-report-says-servers" "$R/pssync.out" "2 workers + 1 server" \
  ", parameter server,"
run compare --algos dsync,pssync,asgd --iters 5 --data synthetic --workers 3 --servers 2 --quiet \
  --no-eval >"$R/ps-compare.out" 2>"$R/ps-compare.err"
rc=$?
expect_success "compare/ps-methods-exit-0" $rc "$R/ps-compare.out" "$R/ps-compare.err"
expect_contains "compare/ps-methods-table" "$R/ps-compare.out" pssync asgd "samples/s"
# OD-SGD reports its timing model (Eq. 1-3) measured on its warm-up; DC-ASGD runs; compare prints
# the OD-SGD paper Table 1 form and applies --dc-*/--local-* only where they belong.
run train --algo odsgd --data synthetic --iters 40 --warmup-iters 20 --workers 2 --local-updater dcasgd-a \
  --dc-lambda 0.1 --dc-momentum 0.9 --quiet --out "$R/odsgd" >"$R/odsgd.out" 2>"$R/odsgd.err"
rc=$?
expect_success "train/odsgd-exit-0" $rc "$R/odsgd.out" "$R/odsgd.err"
expect_contains "train/odsgd-timing-model" "$R/odsgd.out" "OD-SGD timing model (the paper's Eq. 1-3)" \
  "predicted (Eq. 2, 3)" "improvement rate" "Final train accuracy"
pycheck "train/odsgd-summary" "$R/odsgd/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
m = s["od_sgd_model"]
assert m is not None, "no od_sgd_model in summary.json"
# 20 warm-up iterations: 0..18 synchronous, 19 the switching one; the first 19 // 10 = 1 is start-up.
assert m["sync_iterations_measured"] == 18, m
assert m["t_cop_s"] > 0 and m["t_com_s"] > 0 and m["t_com_sync_s"] > 0, m
assert 0 <= s["final_train_accuracy"] <= 1, s["final_train_accuracy"]
EOF
run compare --algos pssync,dcasgd,odsgd,dsync --iters 30 --warmup-iters 12 --data synthetic --workers 2 --dc-variant a \
  --dc-momentum 0.5 --local-lr 0.05 --quiet >"$R/odsgd-compare.out" 2>"$R/odsgd-compare.err"
rc=$?
expect_success "compare/dcasgd-odsgd-exit-0" $rc "$R/odsgd-compare.out" "$R/odsgd-compare.err"
expect_contains "compare/table-1-form" "$R/odsgd-compare.out" \
  "Training speed and accuracy (the form of the OD-SGD paper's Table 1)" "Speed (samples/s)" "Train Acc (%)" \
  dcasgd odsgd "OD-SGD improvement rate over its synchronous warm-up"

# SAPipe: a run reports k, kappa and the compensation column; compare prints the SAPipe paper Table 2
# form; Adam runs under sapipe.
run train --algo sapipe+wp3 --model cnn --data synthetic --iters 40 --workers 2 --profile-iters 2 --quiet \
  --out "$R/sapipe" >"$R/sapipe.out" 2>"$R/sapipe.err"
rc=$?
expect_success "train/sapipe-exit-0" $rc "$R/sapipe.out" "$R/sapipe.err"
expect_contains "train/sapipe-report" "$R/sapipe.out" "SAPipe partial staleness: k = " "kappa = " \
  "compensation wp3" "Synchronous layers:" "compensation"
pycheck "train/sapipe-summary" "$R/sapipe/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
r = s["sapipe"]
assert r is not None and r["layers"] == 5 and 0 <= r["stale_layers"] <= 5, r
assert r["compensation"] == "wp3" and r["stale_layers_automatic"] is True, r
assert 0 <= r["stale_fraction"] <= 1 and r["pipeline_start_iteration"] >= 10, r
assert len(r["forward_s"]) == 5 and all(f > 0 for f in r["forward_s"]), r["forward_s"]
assert s["mean"]["compensation_s"] >= 0, s["mean"]
EOF
run compare --algos dsync,pipe,sapipe+none,sapipe+dc,sapipe+wp1 --stale-layers 2 --model cnn --data synthetic \
  --iters 30 --workers 2 --quiet >"$R/sapipe-compare.out" 2>"$R/sapipe-compare.err"
rc=$?
expect_success "compare/sapipe-exit-0" $rc "$R/sapipe-compare.out" "$R/sapipe-compare.err"
expect_contains "compare/table-2-form" "$R/sapipe-compare.out" \
  "Model performance (the form of the SAPipe paper's Table 2" "Test Acc (cnn)" "Best SAPipe over pipe" \
  "sapipe+dc: k = 2 of 5 layers stale" "sapipe+wp1: k = 2 of 5 layers stale"
run train --algo sapipe --optimizer adam --lr 0.001 --stale-layers 1 --buckets wfbp --data synthetic --iters 20 \
  --workers 3 --quiet >"$R/sapipe-adam.out" 2>"$R/sapipe-adam.err"
rc=$?
expect_success "train/sapipe-adam-exit-0" $rc "$R/sapipe-adam.out" "$R/sapipe-adam.err"
expect_contains "train/sapipe-adam-report" "$R/sapipe-adam.out" "k = 1 of 3 layers stale" "(--stale-layers)"

# Checkpoints: flag combinations, then a crash at iteration 25 and a resume from 20 that ends with
# the uninterrupted run's weights.
mkdir -p "$TMP/empty-checkpoints"
row checkpoint-every-no-dir 2 "--checkpoint-every needs --checkpoint-dir DIR" train --checkpoint-every 5 "${Q[@]}"
row checkpoint-dir-alone    2 "--checkpoint-dir needs --checkpoint-every N" train --checkpoint-dir "$TMP/ck-alone" "${Q[@]}"
row resume-empty-dir        2 "--resume: no complete, valid checkpoint" \
  train --resume --checkpoint-dir "$TMP/empty-checkpoints" "${Q[@]}"
row fault-at-no-checkpoint  2 "no checkpoint is written after iteration 1" \
  train --inject-fault rank=1,iter=1,kind=crash,at=checkpoint "${Q[@]}"
row restarts-negative       2 "--restarts must be in [0, 1000], got -1" train --restarts -1 "${Q[@]}"
row restarts-no-commits     2 "--restarts needs commits to roll back to: --checkpoint-every N" \
  train --restarts 1 --checkpoint-every 0 "${Q[@]}"
row faults-without-restarts 2 "the faults after the first are armed in the restarts, which need --restarts R" \
  train --inject-fault rank=1,iter=1,kind=crash --inject-fault rank=0,iter=2,kind=crash "${Q[@]}"
run train --data synthetic --algo pipe --iters 40 --quiet --no-eval --out "$R/ck-full" >"$R/ck-full.out" 2>"$R/ck-full.err"
expect_success "checkpoint/full-exit-0" $? "$R/ck-full.out" "$R/ck-full.err"
run train --data synthetic --algo pipe --iters 40 --quiet --no-eval --checkpoint-dir "$R/ck" --checkpoint-every 10 \
  --inject-fault rank=2,iter=25,kind=crash --comm-timeout 2 >"$R/ck-crash.out" 2>"$R/ck-crash.err"
rc=$?
if [ "$rc" -eq 1 ] && grep -qF "timed out" "$R/ck-crash.err"; then
  pass "checkpoint/crash-exits-1-timed-out"
else
  fail "checkpoint/crash-exits-1-timed-out" "exit $rc; $(excerpt "$R/ck-crash.err")"
fi
run train --data synthetic --algo pipe --iters 40 --quiet --no-eval --checkpoint-dir "$R/ck" --resume \
  --out "$R/ck-resumed" >"$R/ck-resumed.out" 2>"$R/ck-resumed.err"
expect_success "checkpoint/resume-exit-0" $? "$R/ck-resumed.out" "$R/ck-resumed.err"
expect_contains "checkpoint/resume-says-where" "$R/ck-resumed.out" "Resumed at iteration 20 from its checkpoint"
pycheck "checkpoint/resume-equals-uninterrupted" "$R/ck-full/summary.json" "$R/ck-resumed/summary.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["weights_checksum"] == b["weights_checksum"], (a["weights_checksum"], b["weights_checksum"])
assert b["resumed_from_iteration"] == 20, b["resumed_from_iteration"]
PYEOF
# A layer-wise method checkpoints too: wfbp writes checkpoints 10 and 20, then resumes from 20.
run train --data synthetic --algo wfbp --iters 30 --quiet --no-eval --checkpoint-dir "$R/ck-wfbp" --checkpoint-every 10 \
  >"$R/ck-wfbp.out" 2>"$R/ck-wfbp.err"
expect_success "checkpoint/wfbp-exit-0" $? "$R/ck-wfbp.out" "$R/ck-wfbp.err"
run train --data synthetic --algo wfbp --iters 30 --quiet --no-eval --checkpoint-dir "$R/ck-wfbp" --resume \
  >"$R/ck-wfbp-resumed.out" 2>"$R/ck-wfbp-resumed.err"
expect_success "checkpoint/wfbp-resume-exit-0" $? "$R/ck-wfbp-resumed.out" "$R/ck-wfbp-resumed.err"
expect_contains "checkpoint/wfbp-resume-says-where" "$R/ck-wfbp-resumed.out" "Resumed at iteration 20 from its checkpoint"
# And a parameter-server method: odsgd (2 servers, warm-up 5) killed at 25 and resumed from 20, with
# every server's shard part in the set, ends with the uninterrupted run's weights.
O=(--data synthetic --algo odsgd --servers 2 --warmup-iters 5 --iters 40 --quiet --no-eval)
run train "${O[@]}" --out "$R/ck-odsgd-full" >"$R/ck-odsgd-full.out" 2>"$R/ck-odsgd-full.err"
expect_success "checkpoint/odsgd-full-exit-0" $? "$R/ck-odsgd-full.out" "$R/ck-odsgd-full.err"
run train "${O[@]}" --checkpoint-dir "$R/ck-odsgd" --checkpoint-every 10 --inject-fault rank=1,iter=25,kind=crash \
  --comm-timeout 2 >"$R/ck-odsgd-crash.out" 2>"$R/ck-odsgd-crash.err"
rc=$?
if [ "$rc" -eq 1 ] && [ -f "$R/ck-odsgd/checkpoint-000000000020-server1.psgd" ]; then
  pass "checkpoint/odsgd-crash-exits-1-with-server-parts"
else
  fail "checkpoint/odsgd-crash-exits-1-with-server-parts" "exit $rc; $(excerpt "$R/ck-odsgd-crash.err")"
fi
run train "${O[@]}" --checkpoint-dir "$R/ck-odsgd" --resume --out "$R/ck-odsgd-resumed" \
  >"$R/ck-odsgd-resumed.out" 2>"$R/ck-odsgd-resumed.err"
expect_success "checkpoint/odsgd-resume-exit-0" $? "$R/ck-odsgd-resumed.out" "$R/ck-odsgd-resumed.err"
pycheck "checkpoint/odsgd-resume-equals-uninterrupted" "$R/ck-odsgd-full/summary.json" "$R/ck-odsgd-resumed/summary.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["weights_checksum"] == b["weights_checksum"], (a["weights_checksum"], b["weights_checksum"])
assert b["resumed_from_iteration"] == 20, b["resumed_from_iteration"]
PYEOF
# --restarts (train/elastic.h): a worker killed at 27 and another at 33 roll the run back to its
# commits (every 10, in memory) and it ends with the uninterrupted run's weights; summary.json and
# metrics.jsonl record both failures and count every iteration once. With --restarts 1 the second
# failure is one too many: one line, exit 1, the newest commit left in --checkpoint-dir.
E=(--data synthetic --algo pipe --iters 40 --quiet --no-eval --checkpoint-every 10)
run train "${E[@]}" --restarts 2 --inject-fault rank=1,iter=27,kind=crash --inject-fault rank=0,iter=33,kind=crash \
  --out "$R/restarts" >"$R/restarts.out" 2>"$R/restarts.err"
expect_success "restarts/exit-0" $? "$R/restarts.out" "$R/restarts.err"
expect_contains "restarts/says-so" "$R/restarts.err" "pipesgd: restart 1 of 2: " "rolling back to the commit after iteration 20" \
  "pipesgd: restart 2 of 2: " "rolling back to the commit after iteration 30"
expect_contains "restarts/report" "$R/restarts.out" "Recovered from 2 failures by rolling back to a commit"
pycheck "restarts/equals-uninterrupted" "$R/ck-full/summary.json" "$R/restarts/summary.json" "$R/restarts/metrics.jsonl" <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["weights_checksum"] == b["weights_checksum"], (a["weights_checksum"], b["weights_checksum"])
r = b["recoveries"]
assert r["count"] == 2 and [f["rolled_back_to"] for f in r["failures"]] == [20, 30], r
assert all(0 < f["iterations_redone"] <= 10 + 1 for f in r["failures"]), r
assert all(f["recovery_s"] is not None and f["recovery_s"] >= 0 for f in r["failures"]), r
lines = [json.loads(line) for line in open(sys.argv[3])]
assert [l["iteration"] for l in lines if l["type"] == "iteration"] == list(range(40)), lines
assert [l["to_iteration"] for l in lines if l["type"] == "rollback"] == [20, 30], lines
PYEOF
run train "${E[@]}" --restarts 1 --checkpoint-dir "$R/ck-used-up" --inject-fault rank=1,iter=27,kind=crash \
  --inject-fault rank=0,iter=33,kind=crash >"$R/restarts-used-up.out" 2>"$R/restarts-used-up.err"
rc=$?
if [ "$rc" -eq 1 ] && grep -qF -- "--restarts 1 used up (the newest commit, after iteration 30, is in '$R/ck-used-up')" \
     "$R/restarts-used-up.err" && [ -f "$R/ck-used-up/checkpoint-000000000030-shared.psgd" ]; then
  pass "restarts/used-up-exits-1-keeps-the-commit"
else
  fail "restarts/used-up-exits-1-keeps-the-commit" "exit $rc; $(excerpt "$R/restarts-used-up.err")"
fi
# Another number of workers (user guide, "Continuing with another number of workers"): dsync of 3
# workers (batch 25) crashes at 25 after its commit of 20; --resume with 2 continues that commit,
# rank 0 saying so once, at 2/3 of the configured learning rate. nocomm (each worker's weights its
# own) refuses the same in one line.
WC=(--data synthetic --iters 40 --quiet --no-eval --checkpoint-every 10)
run train --algo dsync "${WC[@]}" --workers 3 --checkpoint-dir "$R/wc" --inject-fault rank=2,iter=25,kind=crash \
  --comm-timeout 2 >"$R/wc-crash.out" 2>"$R/wc-crash.err"
rc=$?
if [ "$rc" -eq 1 ] && [ -f "$R/wc/checkpoint-000000000020-shared.psgd" ]; then
  pass "world-change/crash-exits-1-with-a-commit"
else
  fail "world-change/crash-exits-1-with-a-commit" "exit $rc; $(excerpt "$R/wc-crash.err")"
fi
run train --algo dsync "${WC[@]}" --workers 2 --checkpoint-dir "$R/wc" --resume --out "$R/wc-resumed" \
  >"$R/wc-resumed.out" 2>"$R/wc-resumed.err"
expect_success "world-change/resume-exit-0" $? "$R/wc-resumed.out" "$R/wc-resumed.err"
said=$(grep -c "^pipesgd: continuing the commit of 3 workers" "$R/wc-resumed.err")
if [ "$said" -eq 1 ] && grep -qF "pipesgd: continuing the commit of 3 workers after iteration 20 with 2 workers: global batch 50 (was 75), learning rate x0.6667 of the configured" "$R/wc-resumed.err"; then
  pass "world-change/says-so-once"
else
  fail "world-change/says-so-once" "$said continuing lines; stderr: $(excerpt "$R/wc-resumed.err" 400)"
fi
expect_contains "world-change/report" "$R/wc-resumed.out" \
  "Continued a commit of 3 workers with 2; the learning rate is x0.6667 of the configured"
pycheck "world-change/summary" "$R/wc-resumed/summary.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["resumed_from_workers"] == 3, s["resumed_from_workers"]
assert abs(s["learning_rate_scale"] - 2 / 3) < 1e-12, s["learning_rate_scale"]
assert s["resumed_from_iteration"] == 20 and s["iterations"] == 40, (s["resumed_from_iteration"], s["iterations"])
PYEOF
run train --algo nocomm "${WC[@]}" --workers 3 --checkpoint-dir "$R/wc-nocomm" \
  --inject-fault rank=2,iter=25,kind=crash --comm-timeout 1 >"$R/wc-nocomm-crash.out" 2>"$R/wc-nocomm-crash.err"
rc=$?
if [ "$rc" -eq 1 ] && [ -f "$R/wc-nocomm/checkpoint-000000000020-shared.psgd" ]; then
  pass "world-change/nocomm-crash-exits-1-with-a-commit"
else
  fail "world-change/nocomm-crash-exits-1-with-a-commit" "exit $rc; $(excerpt "$R/wc-nocomm-crash.err")"
fi
row world-change-nocomm     2 "is of 3 workers and this run has 2: nocomm continues only the world that committed (each worker trains weights of its own): relaunch it with 3 workers;" \
  train --algo nocomm "${WC[@]}" --workers 2 --checkpoint-dir "$R/wc-nocomm" --resume

# 3d''. Layer-wise communication: `pipesgd plan` prints every plan with its prediction, and the
# optimal one is never predicted slower; a layer-wise run reports its plan, calls and t_c^no.
run plan --model cnn --data synthetic --workers 2 --net bw=1Gbit,lat=200us --profile-iters 3 --quiet \
  --out "$R/plan" >"$R/plan.out" 2>"$R/plan.err"
rc=$?
expect_success "plan/exit-0" $rc "$R/plan.out" "$R/plan.err"
expect_contains "plan/table" "$R/plan.out" "predicted iter ms" "t_c^no ms" "wfbp: 5 buckets: [4] [3] [2] [1] [0]" \
  "single: 1 bucket: [4..0]" "optimal:" "mgwfbp:" "fixed:25:" "WFBP is case"
if [ -s "$R/plan.err" ]; then fail "plan/quiet-means-no-stderr" "stderr: $(excerpt "$R/plan.err")"; else pass "plan/quiet-means-no-stderr"; fi
pycheck "plan/json" "$R/plan/plan.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
plans = {p["plan"]: p for p in d["plans"]}
assert set(plans) == {"wfbp", "single", "mgwfbp", "optimal", "fixed:25"}, sorted(plans)
best = plans["optimal"]["predicted_iteration_s"]
for name, p in plans.items():
    assert best <= p["predicted_iteration_s"] + 1e-12, f"optimal {best} > {name} {p['predicted_iteration_s']}"
assert d["a_s"] >= 0 and d["b_s_per_byte"] >= 0 and d["backward_s"] > 0, d
EOF
run train --algo dsync+optimal+int8 --model cnn --data synthetic --iters 20 --workers 2 --profile-iters 3 \
  --replan-every 5 --net bw=1Gbit,lat=200us --quiet --no-eval --out "$R/optimal" >"$R/optimal.out" 2>"$R/optimal.err"
rc=$?
expect_success "train/layer-wise-exit-0" $rc "$R/optimal.out" "$R/optimal.err"
# The optimal plan may be one bucket on a loaded machine: "1 allreduce per iteration" or "N allreduces ...".
expect_contains "train/layer-wise-report" "$R/optimal.out" "Layer-wise communication: plan optimal:" \
  "allreduce" "t_c^no"
pycheck "train/layer-wise-summary" "$R/optimal/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["bucket_plan"].startswith("optimal: "), s["bucket_plan"]
assert 1 <= s["allreduce_calls_per_iteration"] <= 5, s["allreduce_calls_per_iteration"]
assert s["codec"] == "int8" and s["non_overlapped_comm_s"] >= 0, s
EOF
run compare --algos dsync,wfbp,mgwfbp --model cnn --data synthetic --iters 12 --workers 2 --profile-iters 2 \
  --quiet --no-eval >"$R/layer-compare.out" 2>"$R/layer-compare.err"
rc=$?
expect_success "compare/layer-wise-exit-0" $rc "$R/layer-compare.out" "$R/layer-compare.err"
expect_contains "compare/layer-wise-table" "$R/layer-compare.out" "Layer-wise communication (MG-WFBP paper" \
  "allreduces/iter" "plan of dsync: one allreduce after backward" "plan of wfbp: wfbp: 5 buckets"

# 3d. Emulated networks: the runs work and the link is taken into account.
net_run() {  # NAME SPEC DESCRIPTION
  local name=$1 spec=$2 description=$3
  run train --net "$spec" --iters 10 --data synthetic --workers 2 --quiet --no-eval --out "$R/$name" \
    >"$R/$name.out" 2>"$R/$name.err"
  local rc=$?
  expect_success "net/$name-exit-0" $rc "$R/$name.out" "$R/$name.err"
  expect_contains "net/$name-described" "$R/$name.out" "$description"
  pycheck "net/$name-link-model" "$R/$name/summary.json" "$spec" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert s.get("network") == sys.argv[2], f"network {s.get('network')!r}"
assert s.get("link_model_comm_eq5_s", 0) > 0, f"link_model_comm_eq5_s {s.get('link_model_comm_eq5_s')}"
EOF
}
net_run 10gbe 10gbe "10 Gbit/s, 20 us latency"
net_run custom "bw=2.5Gbit,lat=30us" "2.5 Gbit/s, 30 us latency"

# 3d'. Allreduce segmenting: auto resolves per method (D-Sync 256 KiB, Pipe-SGD 640 KiB); an
# explicit value applies to both and is reported.
seg_run() {  # NAME ALGO FLAG EXPECTED
  local name=$1 algo=$2 flag=$3 expected=$4
  run train --algo "$algo" --segment-bytes "$flag" --iters 6 --data synthetic --workers 3 --quiet --no-eval \
    --out "$R/seg-$name" >"$R/seg-$name.out" 2>"$R/seg-$name.err"
  expect_success "segments/$name-exit-0" $? "$R/seg-$name.out" "$R/seg-$name.err"
  pycheck "segments/$name-reported" "$R/seg-$name/summary.json" "$expected" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert s.get("allreduce_segments") == sys.argv[2], f"allreduce_segments {s.get('allreduce_segments')!r}"
EOF
}
seg_run dsync-auto dsync auto "256 KiB"
seg_run pipe-auto pipe auto "640 KiB"
seg_run dsync-none dsync none "unsegmented"
seg_run pipe-64k pipe 64K "64 KiB"

# 3d2. The allreduce algorithm: given, or chosen by the cost model (auto), and recorded; a
# calibration file changes what auto picks.
algo_run() {  # NAME EXPECTED FLAGS...
  local name=$1 expected=$2
  shift 2
  run train --algo dsync --iters 4 --data synthetic --workers 3 --quiet --no-eval --out "$R/allreduce-$name" \
    "$@" >"$R/allreduce-$name.out" 2>"$R/allreduce-$name.err"
  expect_success "allreduce/$name-exit-0" $? "$R/allreduce-$name.out" "$R/allreduce-$name.err"
  pycheck "allreduce/$name-recorded" "$R/allreduce-$name/summary.json" "$expected" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert s.get("allreduce") == sys.argv[2], f"allreduce {s.get('allreduce')!r}, expected {sys.argv[2]!r}"
EOF
}
algo_run default ring
algo_run tree tree --allreduce tree
# A calibration in which only the tree is cheap makes auto pick it; one where only direct is cheap,
# direct.
for cheap in tree direct; do
  python3 - "$R/calibration-$cheap.json" "$cheap" <<'EOF'
import json, sys
measured = {name: {"a": 1.0, "b": 1e-6} for name in ["ring", "recursive-doubling", "halving-doubling", "tree", "direct"]}
measured[sys.argv[2]] = {"a": 1e-6, "b": 1e-12}
json.dump({"format": "pipesgd-allreduce-calibration/1", "transport": "test", "world_size": 3,
           "link": {"alpha": 1e-5, "beta": 1e-9, "gamma": 1e-9}, "measured": measured}, open(sys.argv[1], "w"))
EOF
  algo_run "auto-$cheap" "$cheap" --allreduce auto --calibration "$R/calibration-$cheap.json"
done

# 3e'. calibrate: --out is a directory (calibration.json in it), --quiet keeps stderr empty.
run calibrate --workers 2 --sizes 4K,64K --repeats 2 --algos ring,tree --quiet --out "$R/cal" \
  >"$R/cal.out" 2>"$R/cal.err"
rc=$?
expect_success "calibrate/exit-0" $rc "$R/cal.out" "$R/cal.err"
if [ -s "$R/cal.err" ]; then fail "calibrate/quiet-means-no-stderr" "stderr: $(excerpt "$R/cal.err")"; else pass "calibrate/quiet-means-no-stderr"; fi
pycheck "calibrate/writes-calibration-json-in-out-dir" "$R/cal/calibration.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["world_size"] == 2 and set(d["measured"]) == {"ring", "tree"}, d
EOF

run bench allreduce --workers 2 --sizes 4K,8K --repeats 1 --codecs none --algos ring >"$R/bench-progress.out" \
  2>"$R/bench-progress.err"
expect_contains "bench/progress-on-stderr" "$R/bench-progress.err" "measured 4096 bytes (1 of 2 sizes)" \
  "measured 8192 bytes (2 of 2 sizes)"
run bench allreduce --workers 2 --sizes 4K,8K --repeats 1 --codecs none --algos ring --quiet \
  >"$R/bench-quiet.out" 2>"$R/bench-quiet.err"
rc=$?
expect_success "bench/quiet-exit-0" $rc "$R/bench-quiet.out" "$R/bench-quiet.err"
if [ -s "$R/bench-quiet.err" ]; then fail "bench/quiet-means-no-stderr" "stderr: $(excerpt "$R/bench-quiet.err")"; else pass "bench/quiet-means-no-stderr"; fi

# 3e. bench allreduce.
run bench allreduce --workers 3 --sizes 4K,64K --repeats 3 --out "$R/bench" >"$R/bench.out" 2>"$R/bench.err"
rc=$?
expect_success "bench/exit-0" $rc "$R/bench.out" "$R/bench.err"
if grep -qE '(^| )ok$' "$R/bench.out" && ! grep -q WRONG "$R/bench.out"; then
  pass "bench/prints-ok-checks"
else
  fail "bench/prints-ok-checks" "stdout: $(excerpt "$R/bench.out" 600)"
fi
pycheck "bench/allreduce.json" "$R/bench/allreduce.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
assert isinstance(rows, list) and rows, "no rows"
for r in rows:
    for key in ["algorithm", "codec", "bytes", "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s"]:
        assert key in r, f"row lacks {key}: {r}"
    assert r.get("correct") is True, f"incorrect row {r}"
    assert r.get("ranks", 3) == 3, f"ranks {r.get('ranks')}"
    p = 3
    algbw, busbw = r["algbw_bytes_per_s"], r["busbw_bytes_per_s"]
    assert algbw > 0, f"algbw {algbw}"
    expected = algbw * 2 * (p - 1) / p
    assert abs(busbw - expected) <= 1e-9 * abs(expected), f"busbw {busbw} != algbw*2(p-1)/p = {expected}"
    assert abs(algbw - r["bytes"] / r["time_s"]) <= 1e-9 * algbw, f"algbw {algbw} != bytes/time_s"
assert sorted({r["bytes"] for r in rows}) == [4096, 65536], f"sizes {sorted({r['bytes'] for r in rows})}"
assert sorted({r["codec"] for r in rows}) == ["bf16", "int8", "none"], f"codecs {sorted({r['codec'] for r in rows})}"
algorithms = ["ring", "recursive-doubling", "halving-doubling", "tree", "direct"]
measured = [r for r in rows if r["algorithm"] != "auto"]
assert sorted({r["algorithm"] for r in measured}) == sorted(algorithms), f"algorithms {sorted({r['algorithm'] for r in measured})}"
assert len(measured) == 2 * 3 * len(algorithms), f"{len(measured)} rows, expected 2 sizes x 3 codecs x {len(algorithms)} algorithms"
auto = [r for r in rows if r["algorithm"] == "auto"]
assert len(auto) == 2 * 3, f"{len(auto)} auto rows, expected one per size and codec"
for r in auto:
    assert r["chosen"] in algorithms, f"auto chose {r['chosen']}"
    twin = [m for m in measured if m["algorithm"] == r["chosen"] and m["bytes"] == r["bytes"] and m["codec"] == r["codec"]]
    assert len(twin) == 1 and twin[0]["time_s"] == r["time_s"], f"auto row {r} is not its algorithm's row"
EOF
# --net must slow the benchmark down by each algorithm's latencies at 2 ranks (lower bounds: the
# emulator delivers no message before its latency): recursive doubling is one exchange, the others
# two steps (ring: reduce-scatter + allgather; tree: leaf -> root -> leaf; direct and
# halving-doubling: scatter + gather).
run bench allreduce --workers 2 --sizes 4K --repeats 2 --codecs none --algos all \
  --net bw=10Gbit,lat=1ms --out "$R/bench-net" >"$R/bench-net.out" 2>"$R/bench-net.err"
rc=$?
expect_success "bench/net-exit-0" $rc "$R/bench-net.out" "$R/bench-net.err"
pycheck "bench/net-takes-effect" "$R/bench-net/allreduce.json" <<'EOF'
import json, sys
rows = [r for r in json.load(open(sys.argv[1])) if r["algorithm"] != "auto"]
latency = 1e-3
hops = {"recursive-doubling": 1, "ring": 2, "halving-doubling": 2, "tree": 2, "direct": 2}
assert sorted(r["algorithm"] for r in rows) == sorted(hops), f"algorithms {[r['algorithm'] for r in rows]}"
slow = [f"{r['algorithm']} {r['time_s'] * 1e3:.3f} ms < {hops[r['algorithm']]} x 1 ms"
        for r in rows if r["time_s"] < hops[r["algorithm"]] * latency]
assert not slow, "; ".join(slow)
EOF

# 3f. Determinism and flags that must change the run.
SYN=(--data synthetic --iters 15 --workers 2 --quiet --no-eval)
det_run() {  # NAME ARGS...
  local name=$1
  shift
  run train "$@" --out "$R/$name" >"$R/$name.out" 2>"$R/$name.err"
  local rc=$?
  expect_success "determinism/$name-exit-0" $rc "$R/$name.out" "$R/$name.err"
}
det_run seed1-a --algo dsync "${SYN[@]}" --seed 7
det_run seed1-b --algo dsync "${SYN[@]}" --seed 7
# The LibTorch thread count is per thread: results must not depend on the caller's OpenMP setting.
OMP_NUM_THREADS=2 det_run omp2 --algo dsync "${SYN[@]}" --seed 7
det_run seed2 --algo dsync "${SYN[@]}" --seed 8
det_run lr --algo dsync "${SYN[@]}" --seed 7 --lr 0.01
det_run momentum --algo dsync "${SYN[@]}" --seed 7 --momentum 0.5
det_run weight-decay --algo dsync "${SYN[@]}" --seed 7 --weight-decay 0.5
det_run pipe-k3 --algo pipe --staleness-k 3 "${SYN[@]}" --seed 7 --warmup-iters 4 --codec bf16 --batch 10

LOSSES='
import json, sys
def losses(d):
    return [json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if "\"iteration\"" in l]
'
pycheck "determinism/omp-threads-do-not-change-losses" "$R/seed1-a" "$R/omp2" <<EOF
$LOSSES
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == 15 and a == b, f"losses differ with OMP_NUM_THREADS=2: {a[:3]}... vs {b[:3]}..."
EOF
pycheck "determinism/same-seed-same-losses" "$R/seed1-a" "$R/seed1-b" <<EOF
$LOSSES
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == 15, f"{len(a)} iteration records"
assert a == b, f"losses differ: {a[:4]}... vs {b[:4]}..."
EOF
for other in seed2:--seed lr:--lr momentum:--momentum weight-decay:--weight-decay; do
  pycheck "flags/${other#*:}-changes-losses" "$R/seed1-a" "$R/${other%%:*}" <<EOF
$LOSSES
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(b) == 15, f"{len(b)} iteration records"
assert a != b, "losses identical to the --seed 7 defaults run"
EOF
done
pycheck "flags/pipe-options-in-summary" "$R/pipe-k3" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
got = {k: s.get(k) for k in ["method", "staleness_k", "codec", "batch_per_worker", "final_test_accuracy"]}
assert got == {"method": "pipe", "staleness_k": 3, "codec": "bf16", "batch_per_worker": 10,
               "final_test_accuracy": None}, f"summary {got}"
records = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
pipelined = [r["pipelined"] for r in records if r.get("type") == "iteration"]
assert pipelined == [False] * 4 + [True] * 11, f"pipelined flags {pipelined} (--warmup-iters 4)"
EOF

# 3g. Small gzip-compressed MNIST-format directory given with --data-dir.
run train --data-dir "$FX/good" --workers 2 --batch 10 --epochs 2 --quiet --out "$R/fixture" \
  >"$R/fixture.out" 2>"$R/fixture.err"
rc=$?
expect_success "data/small-gzip-dir-exit-0" $rc "$R/fixture.out" "$R/fixture.err"
pycheck "data/small-gzip-dir-epochs" "$R/fixture/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert s.get("iterations") == 20, f"iterations {s.get('iterations')} (200 examples / (2 x 10) x 2 epochs)"
assert [e["epoch"] for e in s.get("epochs", [])] == [1, 2], f"epochs {s.get('epochs')}"
assert all(0 <= e["test_accuracy"] <= 1 for e in s["epochs"]), "test accuracy out of [0, 1]"
EOF

# ---------------------------------------------------------------------------------------------------
# Further rows, one file per topic, sourced in name order (each uses $R, run, row, pycheck, ...);
# with PIPESGD_CLI_PART=main only those before 40 (the "rows" part runs the others).
last_rows=99
[ "${PIPESGD_CLI_PART:-all}" = main ] && last_rows=39
for rows_file in $(rows_files 0 "$last_rows"); do
  # shellcheck disable=SC1090
  . "$rows_file"
done

cli_test_finish
