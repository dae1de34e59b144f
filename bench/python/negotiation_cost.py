#!/usr/bin/python3
"""What agreeing on collectives costs (git show d620cdd:docs/results.md, "Agreed collectives"): hvd.allreduce (one
negotiation round, then the ring allreduce) against the worker's allreduce alone (no round), and a
grouped_allreduce of 32 tensors (one round for all) against 32 allreduces alone, per size.

    mpirun -np 2 /usr/bin/python3 bench/python/negotiation_cost.py [--repeats N] [--blocks N]

Both are timed in alternating blocks (N calls each) so that a drift of the machine hits both; rank 0
prints per size the median over blocks of microseconds per call and the ratio negotiated / alone.
"""
import argparse
import statistics
import time

import torch

import pipesgd.torch as hvd


def timed(function, repeats):
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="calls per block (default 200)")
    parser.add_argument("--blocks", type=int, default=7, help="alternating blocks (default 7)")
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    worker = hvd._worker()
    rows = []
    for elements in (1, 1024, 262144, 2592040 // 4):
        tensor = torch.ones(elements)
        group = [torch.ones(max(elements // 32, 1)) for _ in range(32)]

        def alone():
            worker.allreduce(tensor.clone(), True)

        def negotiated():
            hvd.allreduce(tensor)

        def group_alone():
            for t in group:
                worker.allreduce(t.clone(), True)

        def group_negotiated():
            hvd.grouped_allreduce(group)

        repeats = max(args.repeats * 1024 // max(elements, 1024), 5)
        figures = {"alone": [], "negotiated": [], "group_alone": [], "group_negotiated": []}
        for _ in range(args.blocks):
            for name, function in (("alone", alone), ("negotiated", negotiated), ("group_alone", group_alone),
                                   ("group_negotiated", group_negotiated)):
                figures[name].append(timed(function, repeats))
        medians = {k: statistics.median(v) for k, v in figures.items()}
        rows.append((elements * 4, medians))
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks; microseconds per call, medians of {args.blocks} alternating blocks")
        print(f"{'bytes':>10} {'alone':>9} {'negotiated':>11} {'ratio':>6} {'32 alone':>9} {'grouped':>9} {'ratio':>6}")
        for size, m in rows:
            print(f"{size:>10} {m['alone']:>9.1f} {m['negotiated']:>11.1f} {m['negotiated'] / m['alone']:>6.2f} "
                  f"{m['group_alone']:>9.1f} {m['group_negotiated']:>9.1f} "
                  f"{m['group_negotiated'] / m['group_alone']:>6.2f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
