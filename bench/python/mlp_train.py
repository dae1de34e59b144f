#!/usr/bin/python3
"""Throughput of one PyTorch training script on two data-parallel back ends, launched by mpirun.

    mpirun -np 4 --oversubscribe /usr/bin/python3 bench/python/mlp_train.py --backend ddp
    PYTHONPATH=build/python mpirun -np 4 --oversubscribe /usr/bin/python3 bench/python/mlp_train.py \
        --backend pipesgd [--method pipe+int8]

(as root mpirun also needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; the harness is
scripts/python-bench.sh). --model picks one of the CLI's built-in models (src/pipesgd/torch/
torch_models.cpp), the same layers in the same order:
  mlp  (default) Linear 784-500, ReLU, Linear 500-500, ReLU, Linear 500-10; inputs [B, 784];
       648010 parameters.
  cnn  LeNet: Conv2d(1, 6, 5, padding 2), ReLU, MaxPool2d(2); Conv2d(6, 16, 5), ReLU, MaxPool2d(2);
       Flatten; Linear 400-120, ReLU; Linear 120-84, ReLU; Linear 84-10; inputs [B, 1, 28, 28] (the
       CLI unflattens its [B, 784] rows to that shape as its first layer); 61706 parameters.
Both: PyTorch's default initialisation (LibTorch's is the same: the CLI keeps its modules' defaults),
mean cross-entropy, plain SGD (lr 0.01, no momentum), batch 25 per rank, one torch thread per rank.
Inputs are the Fashion-MNIST training images as floats in [0, 1] (x / 255, no normalisation, as the
CLI), read once into memory; each rank takes every size-th example of one seeded permutation (a
DistributedSampler partition) and iteration i uses the i-th slice of 25 of that shard (a view, no
copy; the shard wraps around and is not reshuffled: this measures speed, not accuracy). No DataLoader
and no evaluation.

    /usr/bin/python3 bench/python/mlp_train.py --model cnn --count-parameters

prints the model's parameter count (and each layer's) and exits, with no back end and no launcher.

Back ends (the training loop is the same code for both):
  pipesgd  import pipesgd.torch as hvd; hvd.init(); hvd.broadcast_parameters;
           hvd.DistributedOptimizer(optimizer, named_parameters=...) [method=--method if given].
  ddp      torch.distributed.init_process_group("gloo") with the rank and world size from OpenMPI's
           environment (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), MASTER_ADDR 127.0.0.1 and
           MASTER_PORT from --master-port (default: $MASTER_PORT, else 29500); the model wrapped in
           torch.nn.parallel.DistributedDataParallel with its defaults.

Timing: --warmup iterations first (not timed), a barrier, --iters timed iterations, a barrier; the
wall clock between the two barriers on rank 0 is the figure (process start-up, data loading and the
warm-up are outside it). Then the replicas' weights are compared (rank 0's broadcast to all). Rank 0's
last line on stdout:

    samples_per_s=<float> iteration_ms=<float> backend=<name> method=<spec|-> model=<mlp|cnn>
        parameters=<count> ranks=<N> batch=<B> iters=<T> warmup=<W> loss=<float> replicas_equal=<0|1>

samples_per_s = ranks x batch x iters / seconds, iteration_ms = seconds / iters x 1000.
Exit status: 0 on success, 1 if the replicas' weights differ at the end, 2 for a usage error (such
as --backend pipesgd without the pipesgd.torch package on PYTHONPATH).
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("mlp", "cnn")  # the CLI's built-in models this script reproduces (make_model)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("pipesgd", "ddp"),
                   help="the data-parallel back end (required unless --count-parameters)")
    p.add_argument("--model", default="mlp", choices=MODELS,
                   help="the CLI's built-in model of that name (default: mlp)")
    p.add_argument("--count-parameters", action="store_true",
                   help="print the model's parameter count (total, then per layer) and exit")
    p.add_argument("--method", default=None,
                   help="pipesgd method spec passed to hvd.DistributedOptimizer, e.g. pipe+int8 "
                        "(pipesgd back end only; default: not passed)")
    p.add_argument("--fused-update", action="store_true",
                   help="pipesgd back end: DistributedOptimizer(fused_update=True), the method's own fused SGD "
                        "(default: the general path, torch.optim.SGD's step on the handed-over gradient)")
    p.add_argument("--batch", type=int, default=25, help="per-rank batch (default: 25)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default: 0.01)")
    p.add_argument("--iters", type=int, default=1500, help="timed iterations (default: 1500)")
    p.add_argument("--warmup", type=int, default=50,
                   help="iterations before the timed ones, not timed (default: 50)")
    p.add_argument("--seed", type=int, default=1, help="model init and data permutation seed")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                   help="directory of train-images-idx3-ubyte(.gz) and train-labels-idx1-ubyte(.gz)")
    p.add_argument("--master-port", type=int, default=int(os.environ.get("MASTER_PORT") or 29500),
                   help="ddp: the rendezvous port on 127.0.0.1 (default: $MASTER_PORT, else 29500)")
    args = p.parse_args()
    if args.backend is None and not args.count_parameters:
        p.error("--backend is required (pipesgd or ddp)")
    if (args.method is not None or args.fused_update) and args.backend != "pipesgd":
        p.error("--method and --fused-update are for --backend pipesgd")
    if args.batch < 1 or args.iters < 1 or args.warmup < 0:
        p.error("--batch and --iters must be >= 1, --warmup >= 0")
    return args


def read_idx(data_dir, name):
    """The IDX file NAME (gzipped NAME.gz or plain NAME) as a numpy array of its shape."""
    path = os.path.join(data_dir, name)
    opener = open
    if not os.path.exists(path):
        path, opener = path + ".gz", gzip.open
    with opener(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def make_model(name):
    """The CLI's --model NAME (torch_models.cpp's build_mlp / build_cnn), with PyTorch's default
    initialisation from the current seed. The layers with parameters are, in order, the CLI's
    segments: mlp fc1 fc2 fc3, cnn conv1 conv2 fc1 fc2 fc3."""
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 500), nn.ReLU(), nn.Linear(500, 500), nn.ReLU(),
                             nn.Linear(500, 10))
    if name == "cnn":
        # The CLI's first layer, Unflatten(1, {1, 28, 28}), has no parameters; here the inputs are
        # given as [B, 1, 28, 28] already (input_shape).
        return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84),
                             nn.ReLU(), nn.Linear(84, 10))
    raise ValueError(f"unknown model {name!r} (expected one of {', '.join(MODELS)})")


def input_shape(name):
    """The shape of one example as the model takes it."""
    return (784,) if name == "mlp" else (1, 28, 28)


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


class PipesgdBackend:
    def __init__(self, args):
        try:
            import pipesgd.torch as hvd
        except ImportError as e:
            print(f"mlp_train: --backend pipesgd needs the pipesgd.torch package on PYTHONPATH "
                  f"(build it, then PYTHONPATH=build/python): {e}", file=sys.stderr, flush=True)
            sys.exit(2)
        self.hvd = hvd
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()

    def wrap(self, model, optimizer, args):
        hvd = self.hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        kwargs = {"method": args.method} if args.method is not None else {}
        if args.fused_update:
            kwargs["fused_update"] = True
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             **kwargs)
        return model, optimizer

    def barrier(self):
        barrier = getattr(self.hvd, "barrier", None)
        if barrier is not None:
            barrier()
        else:  # a blocking allreduce returns only once every rank has called it
            self.hvd.allreduce(torch.zeros(1), name="mlp_train.barrier")

    def broadcast_(self, tensor):
        self.hvd.broadcast_parameters({"mlp_train.weights": tensor}, root_rank=0)

    def mean(self, tensor, name):
        return self.hvd.allreduce(tensor, name=name, op=self.hvd.Average)

    def shutdown(self):
        if hasattr(self.hvd, "shutdown"):
            self.hvd.shutdown()


class DdpBackend:
    def __init__(self, args):
        import torch.distributed as dist
        self.dist = dist
        try:
            self.rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
            self.size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
        except KeyError:
            print("mlp_train: --backend ddp reads its rank and world size from OpenMPI's environment "
                  "(OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE): launch it with mpirun",
                  file=sys.stderr, flush=True)
            sys.exit(2)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(args.master_port)
        dist.init_process_group("gloo", init_method="env://", rank=self.rank, world_size=self.size)

    def wrap(self, model, optimizer, args):
        # DDP broadcasts rank 0's parameters at construction; the optimizer holds no state yet.
        return torch.nn.parallel.DistributedDataParallel(model), optimizer

    def barrier(self):
        self.dist.barrier()

    def broadcast_(self, tensor):
        self.dist.broadcast(tensor, src=0)

    def mean(self, tensor, name):
        tensor = tensor.clone()
        self.dist.all_reduce(tensor)
        return tensor / self.size

    def shutdown(self):
        # No destroy_process_group and no interpreter teardown: with torch 1.13 the teardown can
        # deadlock (seen in 1 of 5 runs of 4 ranks): the main thread, holding the GIL, runs
        # ~Reducer -> ~ProcessGroupGloo, which joins a gloo worker thread that is freeing a tensor
        # with a Python object and waits for the GIL. The figures are printed by then; every rank
        # leaves at once after a last barrier.
        self.dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.exit_status)


def main():
    args = parse_args()
    if args.count_parameters:
        model = make_model(args.model)
        print(f"model={args.model} parameters={count_parameters(model)}")
        for name, layer in model.named_children():
            if any(True for _ in layer.parameters()):
                print(f"  layer {name} {type(layer).__name__} parameters={count_parameters(layer)}")
        return
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    backend = PipesgdBackend(args) if args.backend == "pipesgd" else DdpBackend(args)
    rank, size = backend.rank, backend.size

    # Data: this rank's shard of the training set, shuffled once, as contiguous float tensors.
    images = read_idx(args.data_dir, "train-images-idx3-ubyte")
    labels = read_idx(args.data_dir, "train-labels-idx1-ubyte")
    perm = np.random.default_rng(args.seed).permutation(len(images))[rank::size]
    xs = torch.from_numpy(images[perm].reshape(len(perm), *input_shape(args.model))
                          .astype(np.float32) / 255.0)
    ys = torch.from_numpy(labels[perm].astype(np.int64))
    batches = len(xs) // args.batch
    if batches < 1:
        raise SystemExit(f"mlp_train: a shard of {len(xs)} examples is smaller than --batch")

    torch.manual_seed(args.seed)
    model = make_model(args.model)
    parameters = count_parameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = backend.wrap(model, optimizer, args)

    def run(first, count):
        loss = None
        for i in range(first, first + count):
            b = (i % batches) * args.batch
            x, y = xs[b:b + args.batch], ys[b:b + args.batch]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        return loss

    run(0, args.warmup)
    backend.barrier()
    start = time.perf_counter()
    loss = run(args.warmup, args.iters)
    backend.barrier()
    seconds = time.perf_counter() - start

    # Every replica must hold rank 0's weights (pipelined methods included: they apply the same
    # aggregated gradients everywhere).
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    reference = flat.clone()
    backend.broadcast_(reference)
    differs = backend.mean(torch.tensor([0.0 if torch.equal(flat, reference) else 1.0]),
                           "mlp_train.differs")
    equal = float(differs.item()) == 0.0
    mean_loss = float(backend.mean(loss.detach().reshape(1), "mlp_train.loss").item())

    if rank == 0:
        samples = size * args.batch * args.iters
        print(f"samples_per_s={samples / seconds:.1f} iteration_ms={seconds / args.iters * 1e3:.4f} "
              f"backend={args.backend} method={args.method or '-'} model={args.model} "
              f"parameters={parameters} ranks={size} batch={args.batch} "
              f"iters={args.iters} warmup={args.warmup} loss={mean_loss:.4f} "
              f"replicas_equal={int(equal)}", flush=True)
    if not equal and rank == 0:
        print("mlp_train: the replicas' weights differ at the end", file=sys.stderr, flush=True)
    backend.exit_status = 0 if equal else 1
    backend.shutdown()
    sys.exit(backend.exit_status)


if __name__ == "__main__":
    main()
