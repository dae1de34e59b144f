#!/usr/bin/python3
"""How much of each method's allreduce runs under the next iteration's compute, from a --trace file.

    /usr/bin/python3 scripts/trace-overlap.py t.json

For every run in the file (a comparison's methods) and its worker 0: the iterations t whose
allreduce (on any thread) overlaps the forward or backward of iteration t + 1 on the compute
thread, and the median share of the allreduce's time spent under that compute. Pipe-SGD's
allreduce of t runs beside the compute of t + 1; D-Sync's never does (it waits for it).
"""
import collections
import json
import statistics
import sys


def main(path):
    events = json.load(open(path))["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for pid, name in sorted(processes.items()):
        if not name.endswith("worker 0"):
            continue
        compute = collections.defaultdict(list)
        allreduce = {}
        for e in events:
            if e["ph"] != "X" or e["pid"] != pid:
                continue
            span = (e["ts"], e["ts"] + e["dur"])
            iteration = e["args"]["iteration"]
            if threads[(pid, e["tid"])] == "compute" and e["name"] in ("forward", "backward"):
                compute[iteration].append(span)
            elif e["name"] == "allreduce":
                allreduce.setdefault(iteration, span)
        shares = []
        for t, (a, b) in allreduce.items():
            if t + 1 in compute and b > a:
                shares.append(sum(max(0.0, min(b, y) - max(a, x)) for x, y in compute[t + 1]) / (b - a))
        overlapping = sum(1 for s in shares if s > 0)
        median = statistics.median(shares) if shares else 0.0
        print(f"{name}: the allreduce of t overlaps the forward/backward of t + 1 in {overlapping} of "
              f"{len(shares)} iterations; median share of the allreduce under it {median:.2f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: trace-overlap.py TRACE.json")
    main(sys.argv[1])
