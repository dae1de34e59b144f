"""pipesgd.torch: Horovod's PyTorch API over pipesgd, with every pipesgd method.

An existing Horovod script switches with one line::

    import pipesgd.torch as hvd

and then gains what Horovod does not have, as keyword arguments of the same DistributedOptimizer::

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         method="pipe+int8")          # Pipe-SGD, 8-bit in-ring codec

Launch with ``pipesgdrun -np 4 /usr/bin/python3 train.py`` (or mpirun); without a launcher the
script runs as one worker. Every method of pipesgd is the C++ library's (pipesgd._C); nothing of
a method is implemented here. See docs/user-guide.md, "From PyTorch (Horovod-compatible)".

Collectives (allreduce, allgather, broadcast, alltoall, reducescatter, their grouped and async
forms, barrier, join, process sets) are the C++ library's negotiated collectives
(include/pipesgd/collectives.h): each worker's communication thread agrees with its peers and runs
them while Python goes on; this module keeps Horovod's argument conventions, handles, compression
and autograd.

``DistributedOptimizer.step()``: the method's step writes the gradient to apply into ``p.grad``
(this step's average; for a pipelined method an earlier step's) and the wrapped optimizer's own
``step()`` applies it, as in Horovod: any torch.optim optimizer, param groups and scheduler.
``synchronize()`` leaves those gradients readable and editable (clipping) until ``step()``;
``state_dict()`` is the wrapped optimizer's plus the method's state (key "pipesgd").
``fused_update=True`` (SGD/Adam only; no synchronize()/state_dict()) lets the method update with its
own fused SGD/Adam; the parameter-server methods always do.

What differs from Horovod (Adasum, GPU builds, timelines, PartialDistributedOptimizer, ...) is in
docs/user-guide.md, "What differs from Horovod", each with its reason.

The package is laid out as Horovod's own horovod/torch; this module only re-exports:
  basics.py           init, shutdown, rank, size, ... (the world), available_methods, the timeline
  mpi_ops.py          the collectives, their handles (poll, synchronize), barrier, join, the ops
  process_sets.py     ProcessSet, global_process_set
  compression.py      Compression, Compressor
  functions.py        broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object
  optimizer.py        DistributedOptimizer (PartialDistributedOptimizer)
  sync_batch_norm.py  SyncBatchNorm
  elastic/            hvd.elastic: run, TorchState, ElasticSampler (relaunch by pipesgdrun --restarts, resume
                      from the newest commit)
  _runtime.py         the private state they share (the session, this worker's engine, the handles)
"""

from pipesgd._C import CollectiveMismatchError, CommError, CommTimeoutError, DataError, PeerFailedError
from pipesgd.torch._runtime import _state  # noqa: F401 (the tests' conftest.py reads it)
from pipesgd.torch.basics import (available_methods, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                                  gloo_built, gloo_enabled, init, is_homogeneous, is_initialized, is_worker,
                                  local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                                  nccl_built, rank, rocm_built, shutdown, size, start_timeline, stop_timeline)
from pipesgd.torch.compression import Compression, Compressor, FP16Compressor, NoneCompressor  # noqa: F401
from pipesgd.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                     broadcast_parameters)
from pipesgd.torch.mpi_ops import (Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, add_process_set,
                                   allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                                   allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_,
                                   broadcast_async, broadcast_async_, grouped_allgather, grouped_allgather_async,
                                   grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                                   grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async,
                                   join, poll, reducescatter, reducescatter_async, remove_process_set,
                                   sparse_allreduce_async, synchronize)
from pipesgd.torch.optimizer import DistributedOptimizer, PartialDistributedOptimizer
from pipesgd.torch.process_sets import ProcessSet, global_process_set
from pipesgd.torch.sync_batch_norm import SyncBatchNorm
from pipesgd.torch import elastic  # noqa: F401 (hvd.elastic, as Horovod's horovod.torch.elastic)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "is_worker", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
    "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "sparse_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "synchronize", "poll", "barrier", "join", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "DistributedOptimizer", "Compression", "Compressor",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "available_methods", "start_timeline", "stop_timeline", "SyncBatchNorm",
    "PartialDistributedOptimizer", "HorovodInternalError", "CollectiveMismatchError",
    "CommError", "CommTimeoutError", "DataError", "PeerFailedError",
]
