#!/usr/bin/python3
"""Where an iteration's time goes on the general update path against the fused one
(git show d620cdd:docs/results.md, "The user's optimizer applies the update"): the MLP 784-500-500-10 with plain SGD,
batch 25 per rank, each call of the loop timed separately.

    mpirun -np 2 /usr/bin/python3 bench/python/update_path_breakdown.py [--fused] [--iters N]

General path: forward+backward, the method's step (synchronize_gradients: the allreduce and the
handing over), the wrapped torch.optim.SGD's step, and the arming of the next backward; fused: forward+
backward and the method's step (allreduce and its own SGD). Rank 0 prints the medians in microseconds
(the first 100 iterations left out).
"""
import argparse
import statistics
import time

import torch

import pipesgd.torch as hvd


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fused", action="store_true", help="fused_update=True")
    parser.add_argument("--iters", type=int, default=600)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(784, 500), torch.nn.ReLU(), torch.nn.Linear(500, 500),
                                torch.nn.ReLU(), torch.nn.Linear(500, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), fused_update=args.fused)
    x, y = torch.randn(25, 784), torch.randint(0, 10, (25,))
    times = {"forward+backward": [], "method step": [], "torch.optim step": [], "arm": []}
    for _ in range(args.iters):
        opt.zero_grad()
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        backward_done = time.perf_counter()
        times["forward+backward"].append(backward_done - start)
        if args.fused:
            opt.step()
            times["method step"].append(time.perf_counter() - backward_done)
            continue
        opt._pipesgd.synchronize_gradients()
        synchronized = time.perf_counter()
        opt._apply_gradients()
        applied = time.perf_counter()
        opt._pipesgd.step()
        times["method step"].append(synchronized - backward_done)
        times["torch.optim step"].append(applied - synchronized)
        times["arm"].append(time.perf_counter() - applied)
    opt.finish()
    if hvd.rank() == 0:
        medians = {k: statistics.median(v[100:]) * 1e6 for k, v in times.items() if v}
        print(("fused: " if args.fused else "general: ") + ", ".join(f"{k} {v:.0f} us" for k, v in medians.items())
              + f"; sum {sum(medians.values()):.0f} us")
    hvd.shutdown()


if __name__ == "__main__":
    main()
