# shellcheck shell=bash
# The communication path's measures (sourced by run_cli_tests.sh; uses $R, run, row, pycheck, pass,
# fail, expect_success, expect_contains):
#  - compare --wide: the table's "stretch" and "comm CPU ns/B" columns; compare.json's compute_s,
#    compute_stretch (compute over nocomm's: 1 for nocomm itself, null without nocomm) and
#    comm_cpu_ns_per_byte (null for nocomm, which allreduces nothing; positive for dsync and pipe);
#  - train --out: summary.json comm_cpu_ns_per_byte, metrics.jsonl comm_cpu_s and comm_bytes (dsync
#    allreduces the whole fp32 gradient every iteration: 4 x 648,010 bytes for mlp, 784-500-500-10);
#    nocomm sends no gradient, takes no codec;
#  - bench allreduce: every row's cpu_ns_per_byte and the table's "CPU ns/B" column.
CQ=(--data synthetic --no-eval --quiet)
MLP_PARAMETERS=$((784 * 500 + 500 + 500 * 500 + 500 + 500 * 10 + 10))  # 648010

row nocomm-codec-flag 2 "--codec applies only to dsync, pipe" train --algo nocomm --codec int8 --iters 3 "${CQ[@]}"
row nocomm-codec-spec 2 "method 'nocomm' takes no +options" train --algo nocomm+int8 --iters 3 "${CQ[@]}"

d=$R/comm-path
mkdir -p "$d"

# compare with nocomm: the stretch is each method's compute over nocomm's.
run compare --wide --algos nocomm,dsync,pipe --workers 2 --iters 30 --out "$d/cmp" "${CQ[@]}" >"$d/cmp.out" 2>"$d/cmp.err"
expect_success "comm-path/compare-exit-0" $? "$d/cmp.out" "$d/cmp.err"
pycheck "comm-path/compare-table-columns" "$d/cmp.out" <<'PYEOF'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
header = next((l for l in lines if l.startswith("method ")), None)
if header is None: print("no table header"); sys.exit()
columns = re.split(r"\s{2,}", header.strip())
for name in ("stretch", "comm CPU ns/B"):
    if name not in columns: print("no column", name, columns)
rows = {re.split(r"\s{2,}", l.strip())[0]: re.split(r"\s{2,}", l.strip()) for l in lines
        if l.split(" ")[0] in ("nocomm", "dsync", "pipe")}
if set(rows) != {"nocomm", "dsync", "pipe"}: print("rows", sorted(rows)); sys.exit()
cell = lambda method, column: rows[method][columns.index(column)]
if cell("nocomm", "stretch") != "1.00x": print("nocomm stretch", cell("nocomm", "stretch"))
if cell("nocomm", "comm CPU ns/B") != "-": print("nocomm comm CPU ns/B", cell("nocomm", "comm CPU ns/B"))
for method in ("dsync", "pipe"):
    if not re.fullmatch(r"\d+\.\d\dx", cell(method, "stretch")): print(method, "stretch", cell(method, "stretch"))
    if not re.fullmatch(r"\d+\.\d\d", cell(method, "comm CPU ns/B")): print(method, "comm CPU ns/B", cell(method, "comm CPU ns/B"))
PYEOF
pycheck "comm-path/compare-json-stretch-and-cpu-per-byte" "$d/cmp/compare.json" <<'PYEOF'
import json, sys
records = {r["method"]: r for r in json.load(open(sys.argv[1]))}
if set(records) != {"nocomm", "dsync", "pipe"}: print("methods", sorted(records)); sys.exit()
alone = records["nocomm"]["compute_s"]
if not (isinstance(alone, float) and alone > 0): print("nocomm compute_s", alone); sys.exit()
if records["nocomm"]["compute_stretch"] != 1.0: print("nocomm stretch", records["nocomm"]["compute_stretch"])
if records["nocomm"]["comm_cpu_ns_per_byte"] is not None: print("nocomm ns/B", records["nocomm"]["comm_cpu_ns_per_byte"])
for method in ("dsync", "pipe"):
    r = records[method]
    ns = r["comm_cpu_ns_per_byte"]
    if not (isinstance(ns, float) and ns > 0): print(method, "comm_cpu_ns_per_byte", ns)
    stretch, compute = r["compute_stretch"], r["compute_s"]
    if not (isinstance(compute, float) and compute > 0): print(method, "compute_s", compute); continue
    if not isinstance(stretch, float) or abs(stretch - compute / alone) > 1e-9 * stretch:
        print(method, "compute_stretch", stretch, "is not compute_s / nocomm's", compute / alone)
PYEOF

# compare without nocomm: no stretch, the cost per byte still there.
run compare --algos dsync,pipe --workers 2 --iters 20 --out "$d/cmp-no-nocomm" "${CQ[@]}" >"$d/cmp-no-nocomm.out" \
  2>"$d/cmp-no-nocomm.err"
expect_success "comm-path/compare-without-nocomm-exit-0" $? "$d/cmp-no-nocomm.out" "$d/cmp-no-nocomm.err"
pycheck "comm-path/compare-without-nocomm-stretch-null" "$d/cmp-no-nocomm/compare.json" <<'PYEOF'
import json, sys
records = json.load(open(sys.argv[1]))
if [r["method"] for r in records] != ["dsync", "pipe"]: print("methods", [r["method"] for r in records])
for r in records:
    if "compute_stretch" not in r or r["compute_stretch"] is not None: print(r["method"], "compute_stretch", r.get("compute_stretch", "missing"))
    if not (isinstance(r["comm_cpu_ns_per_byte"], float) and r["comm_cpu_ns_per_byte"] > 0): print(r["method"], "ns/B", r["comm_cpu_ns_per_byte"])
PYEOF

# train --out: the run's cost per byte and each iteration's allreduced bytes and CPU time.
run train --algo dsync --workers 2 --iters 30 --out "$d/dsync" "${CQ[@]}" >"$d/dsync.out" 2>"$d/dsync.err"
expect_success "comm-path/train-dsync-exit-0" $? "$d/dsync.out" "$d/dsync.err"
expect_contains "comm-path/train-report-column" "$d/dsync.out" "comm CPU ns/B"
pycheck "comm-path/train-dsync-summary-and-metrics" "$d/dsync" "$MLP_PARAMETERS" <<'PYEOF'
import json, sys
run, parameters = sys.argv[1], int(sys.argv[2])
summary = json.load(open(run + "/summary.json"))
ns = summary.get("comm_cpu_ns_per_byte")
if not (isinstance(ns, float) and ns > 0): print("summary comm_cpu_ns_per_byte", ns)
iterations = [json.loads(l) for l in open(run + "/metrics.jsonl") if json.loads(l).get("type") == "iteration"]
if len(iterations) != 30: print(len(iterations), "iteration records"); sys.exit()
wrong = [(r["iteration"], r.get("comm_bytes")) for r in iterations if r.get("comm_bytes") != 4 * parameters]
if wrong: print("comm_bytes != 4 x", parameters, "at", wrong[:5])
cpu = [r.get("comm_cpu_s") for r in iterations]
if any(not isinstance(c, (int, float)) or c < 0 for c in cpu): print("comm_cpu_s", cpu[:5])
elif sum(cpu) <= 0: print("no CPU time over 30 allreduces")
PYEOF

run train --algo nocomm --workers 2 --iters 10 --out "$d/nocomm" "${CQ[@]}" >"$d/nocomm.out" 2>"$d/nocomm.err"
expect_success "comm-path/train-nocomm-exit-0" $? "$d/nocomm.out" "$d/nocomm.err"
pycheck "comm-path/train-nocomm-allreduces-nothing" "$d/nocomm" "$MLP_PARAMETERS" <<'PYEOF'
import json, sys
run, parameters = sys.argv[1], int(sys.argv[2])
summary = json.load(open(run + "/summary.json"))
if summary.get("comm_cpu_ns_per_byte", "missing") is not None: print("comm_cpu_ns_per_byte", summary.get("comm_cpu_ns_per_byte", "missing"))
# Control messages only (the trainer's own): far below one fp32 per parameter.
if not summary["bytes_sent_per_iteration"] < parameters: print("bytes_sent_per_iteration", summary["bytes_sent_per_iteration"])
iterations = [json.loads(l) for l in open(run + "/metrics.jsonl") if json.loads(l).get("type") == "iteration"]
if len(iterations) != 10: print(len(iterations), "iteration records")
if any(r.get("comm_bytes") != 0 or r.get("comm_cpu_s") != 0 for r in iterations): print("allreduced", iterations[0])
PYEOF

# bench allreduce: CPU time per byte in every row, and in the table.
run bench allreduce --workers 2 --sizes 64K --algos ring --codecs none --repeats 3 --out "$d/bench" \
  >"$d/bench.out" 2>"$d/bench.err"
expect_success "comm-path/bench-exit-0" $? "$d/bench.out" "$d/bench.err"
expect_contains "comm-path/bench-table-column" "$d/bench.out" "CPU ns/B"
pycheck "comm-path/bench-cpu-ns-per-byte" "$d/bench/allreduce.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))
if not rows: print("no rows")
for r in rows:
    ns = r.get("cpu_ns_per_byte")
    if not (isinstance(ns, float) and ns > 0): print(r["algorithm"], r["bytes"], "cpu_ns_per_byte", ns)
    if r.get("correct") is not True: print("incorrect", r)
PYEOF
