#!/usr/bin/env python3
"""Markdown summary of out/mpi-bench/bench-N/allreduce.json (written by scripts/mpi-bench.sh):
per size, MPI_Allreduce's median time and busbw, each algorithm's busbw as a ratio to it, and what
`auto` picked with its ratio. Usage: scripts/mpi-bench-table.py out/mpi-bench/bench-4/allreduce.json"""
import json
import sys

rows = json.load(open(sys.argv[1]))
algorithms = ["ring", "recursive-doubling", "halving-doubling", "tree", "direct"]
sizes = sorted({r["bytes"] for r in rows})
short = {"ring": "ring", "recursive-doubling": "rec. doubling", "halving-doubling": "halv.-doubling",
         "tree": "tree", "direct": "direct"}
header = ["bytes", "MPI_Allreduce us", "MPI busbw GB/s"] + [short[a] for a in algorithms] + ["auto picks", "auto vs MPI"]
print("| " + " | ".join(header) + " |")
print("|" + "---|" * len(header))
for size in sizes:
    at = {r["algorithm"]: r for r in rows if r["bytes"] == size and r["codec"] == "none"}
    mpi = at["MPI_Allreduce"]
    cells = [str(size), f"{mpi['time_s'] * 1e6:.1f}", f"{mpi['busbw_bytes_per_s'] / 1e9:.3f}"]
    for a in algorithms:
        cells.append(f"{at[a]['busbw_bytes_per_s'] / mpi['busbw_bytes_per_s']:.2f}x")
    auto = at["auto"]
    cells += [auto["chosen"], f"**{auto['busbw_bytes_per_s'] / mpi['busbw_bytes_per_s']:.2f}x**"]
    assert all(r["correct"] for r in at.values()), f"a wrong result at {size}"
    print("| " + " | ".join(cells) + " |")
