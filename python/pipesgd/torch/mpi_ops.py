"""Horovod's collectives and their handles: allreduce, allgather, broadcast, alltoall,
reducescatter (their in-place, grouped and async forms), sparse_allreduce_async, poll, synchronize,
barrier, join, and the registration of process sets; the reduction operations (Average, Sum, ...).

Each is a negotiated collective of the C++ library (include/pipesgd/collectives.h): this worker's
communication thread agrees with its peers and runs it while Python goes on. Here only Horovod's
argument conventions, compression, autograd and the integer handles.
"""

import warnings

import torch

from pipesgd import _C
from pipesgd.torch._runtime import _handles, _state, _this_thread, _worker
from pipesgd.torch.compression import Compression
from pipesgd.torch.process_sets import ProcessSet, _members, _set_id, global_process_set


# Reduction operations (Horovod's names).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}


class HorovodInternalError(RuntimeError):
    """Horovod's error for a collective that failed inside the runtime: a peer failed or timed out
    (pipesgd.CommError, pipesgd.PeerFailedError and pipesgd.CommTimeoutError are subclasses of it
    once pipesgd.torch is imported, so Horovod's ``except hvd.HorovodInternalError`` catches them),
    or a scalar reducescatter."""

    __slots__ = ()  # RuntimeError's own layout: _C's exception classes can take it as their base


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod Elastic's interrupt for hosts added or removed. pipesgd's world never changes in place,
    so pipesgd never raises it; hvd.elastic.run handles one a script raises as Horovod does (the
    reset callbacks, a sync unless skip_sync, and the training function again)."""

    def __init__(self, skip_sync=False):
        super().__init__(skip_sync)
        self.skip_sync = skip_sync


# The collectives raise _C.CommError for a failed or timed-out peer (the C++ pipesgd::CommError,
# bound as a RuntimeError). Horovod raises HorovodInternalError there, and elastic scripts catch
# that: CommError (and so PeerFailedError, CommTimeoutError) gets it as its base. Layouts agree
# (__slots__ above), so Python allows the assignment; it is done once, when pipesgd.torch is imported.
if _C.CommError.__bases__ == (RuntimeError,):
    _C.CommError.__bases__ = (HorovodInternalError,)


def _check_tensor(tensor, call):
    if not torch.is_tensor(tensor):
        raise TypeError(f"{call}: expected a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cpu:
        raise ValueError(f"pipesgd.torch: tensors must be on the CPU, got one on {tensor.device}")


def _resolve_op(average, op, call):
    if average is not None:
        if op is not None:
            raise ValueError(f"{call}: give op= or the deprecated average=, not both")
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed", DeprecationWarning)
        op = Average if average else Sum
    if op is None:
        op = Average
    if op == Adasum:
        raise NotImplementedError(f"pipesgd.torch.{call}: op=Adasum is not supported; use op=hvd.Average "
                                  "(or DistributedOptimizer(method=...) for pipesgd's methods)")
    if op not in _OP_NAMES:
        raise ValueError(f"{call}: unknown op {op!r} (hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product)")
    return op


def _submit(kind, name=None, tensor=None, output=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
            root=0, splits=(), process_set=global_process_set, ranks=(), finish=None):
    """Queues a collective on the communication thread; returns its handle."""
    work = _worker().submit(kind, "" if name is None else str(name), tensor, output, _OP_NAMES[op],
                            float(prescale_factor), float(postscale_factor), int(root), [int(s) for s in splits],
                            _set_id(process_set, kind), [int(r) for r in ranks], _this_thread.caller_waits)
    return _handles.add(work, finish or _identity)


def _identity(results):
    return results


def _now(*args, **kwargs):
    """A blocking collective: run on this thread unless the communication thread is running rounds."""
    return _run(_submit, *args, **kwargs)


def _blocking(start, *args, **kwargs):
    """start(*args, **kwargs): submits collectives this thread waits for at once (the blocking
    forms): the communication thread is not woken for them; this thread runs them when the
    communication thread is not running rounds (C++ Worker::submit's caller_waits)."""
    _this_thread.caller_waits = True
    try:
        return start(*args, **kwargs)
    finally:
        _this_thread.caller_waits = False


def _run(start, *args, **kwargs):
    """The result of the one collective start(*args, **kwargs) submits, run as a blocking one."""
    return synchronize(_blocking(start, *args, **kwargs))


def poll(handle):
    """True once the operation of `handle` finished (without blocking)."""
    if handle not in _handles.entries:
        raise ValueError(f"poll: unknown handle {handle!r}")
    return _handles.entries[handle][0].is_completed()


def synchronize(handle):
    """Waits for the operation of `handle` and returns its result; raises its error (a mismatch
    between the ranks is a RuntimeError, as in Horovod)."""
    if handle not in _handles.entries:
        raise ValueError(f"synchronize: unknown handle {handle!r}")
    work, finish = _handles.entries.pop(handle)
    return finish(work.wait())


def _check_root(root_rank, call):
    if not isinstance(root_rank, int) or not 0 <= root_rank < _worker().size:
        raise ValueError(f"{call}: root_rank {root_rank!r} is not a worker rank (0..{_worker().size - 1})")


def _first(results):
    return results[0]


# allreduce ---------------------------------------------------------------------------------------

def _allreduce_async(tensor, output, name, op, compression, prescale_factor, postscale_factor, process_set, call):
    _check_tensor(tensor, call)
    compressed, ctx = compression.compress(tensor)
    if compressed is not tensor:
        target = output

        def finish(results):
            value = compression.decompress(results[0], ctx)
            if target is not None:
                with torch.no_grad():
                    target.copy_(value)
                return target
            return value
        return _submit("allreduce", name, compressed.detach(), None, op, prescale_factor,
                       postscale_factor, process_set=process_set, finish=finish)
    # The C++ side runs without autograd (no detach needed); an in-place call passes the same tensor
    # as input and output, so the ring reduces it where it is.
    return _submit("allreduce", name, tensor, output, op, prescale_factor, postscale_factor, process_set=process_set,
                   finish=(lambda results: output) if output is not None else _first)


class _AllreduceFunction(torch.autograd.Function):
    """allreduce with a gradient (Horovod's HorovodAllreduce): the gradient is allreduced the same way."""

    @staticmethod
    def forward(ctx, tensor, name, op, compression, prescale_factor, postscale_factor, process_set):
        ctx.args = (op, compression, prescale_factor, postscale_factor, process_set)
        return _run(_allreduce_async, tensor, None, name, op, compression, prescale_factor, postscale_factor,
                    process_set, "allreduce")

    @staticmethod
    def backward(ctx, grad_output):
        op, compression, prescale_factor, postscale_factor, process_set = ctx.args
        grad = _run(_allreduce_async, grad_output.contiguous(), None, None, op, compression, prescale_factor,
                    postscale_factor, process_set, "allreduce")
        return grad, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """A new tensor: the reduction (default: mean) of every member's `tensor`. Differentiable."""
    op = _resolve_op(average, op, "allreduce")
    _check_tensor(tensor, "allreduce")
    if tensor.requires_grad and op in (Average, Sum):
        return _AllreduceFunction.apply(tensor, name, op, compression, prescale_factor, postscale_factor, process_set)
    return _run(_allreduce_async, tensor, None, name, op, compression, prescale_factor, postscale_factor,
                process_set, "allreduce")


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    op = _resolve_op(average, op, "allreduce_async")
    return _allreduce_async(tensor, None, name, op, Compression.none, prescale_factor, postscale_factor, process_set,
                            "allreduce_async")


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """In place: `tensor` becomes the reduction over the members. Returns it."""
    return _run(allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    op = _resolve_op(average, op, "allreduce_async_")
    return _allreduce_async(tensor, tensor, name, op, Compression.none, prescale_factor, postscale_factor, process_set,
                            "allreduce_async_")


def _group_names(name, count):
    return [None] * count if name is None else [f"{name}.{k}" for k in range(count)]


class _GroupedFunction(torch.autograd.Function):
    """A group of differentiable collectives: forward(start, backward_start, *tensors) where
    start(tensors) and backward_start(grads) return handles."""

    @staticmethod
    def forward(ctx, start, backward_start, *tensors):
        ctx.backward_start = backward_start
        return tuple(synchronize(h) for h in _blocking(start, tensors))

    @staticmethod
    def backward(ctx, *grads):
        grads = [g.contiguous() for g in grads]
        return (None, None) + tuple(synchronize(h) for h in _blocking(ctx.backward_start, grads))


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """allreduce of each tensor (submitted together). Differentiable."""
    op = _resolve_op(average, op, "grouped_allreduce")
    names = _group_names(name, len(tensors))

    def start(group, names=names):
        return [_allreduce_async(t, None, n, op, compression, prescale_factor, postscale_factor, process_set,
                                 "grouped_allreduce") for t, n in zip(group, names)]
    if any(t.requires_grad for t in tensors) and op in (Average, Sum):
        return list(_GroupedFunction.apply(start, lambda grads: start(grads, _group_names(None, len(grads))),
                                           *tensors))
    return [synchronize(h) for h in _blocking(start, tensors)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Handles of allreduce_async of each tensor (synchronize each)."""
    op = _resolve_op(average, op, "grouped_allreduce_async")
    return [_allreduce_async(t, None, n, op, Compression.none, prescale_factor, postscale_factor, process_set,
                             "grouped_allreduce_async") for t, n in zip(tensors, _group_names(name, len(tensors)))]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    return [synchronize(h) for h in _blocking(grouped_allreduce_async_, tensors, average, name, op, prescale_factor,
                                                             postscale_factor, process_set)]


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    op = _resolve_op(average, op, "grouped_allreduce_async_")
    return [_allreduce_async(t, t, n, op, Compression.none, prescale_factor, postscale_factor, process_set,
                             "grouped_allreduce_async_") for t, n in zip(tensors, _group_names(name, len(tensors)))]


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """A sparse tensor's allreduce (Horovod's, as it does it): its indices and values are allgathered
    and summed into a sparse result (Average divides the values by the set's size). Returns a
    function that waits and returns the result (Horovod's)."""
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async: expected a sparse tensor")
    op = _resolve_op(None, op, "sparse_allreduce_async")
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async: op must be hvd.Average or hvd.Sum")
    tensor = tensor.coalesce()
    indices = tensor._indices().t().contiguous()
    values = tensor._values().contiguous()
    members = len(_members(process_set))
    index_handle = _submit("allgather", None if name is None else f"{name}.indices", indices,
                           process_set=process_set, finish=_first)
    value_handle = _submit("allgather", None if name is None else f"{name}.values", values,
                           process_set=process_set, finish=_first)
    shape = tensor.shape

    def finish(results):
        all_indices = synchronize(index_handle)
        all_values = results[0]
        if op == Average:
            all_values = all_values / members
        return torch.sparse_coo_tensor(all_indices.t(), all_values, shape)
    work = _handles.entries.pop(value_handle)[0]
    handle = _handles.add(work, finish)
    return lambda: synchronize(handle)  # Horovod's sparse handle is a function that waits


# allgather ---------------------------------------------------------------------------------------

class _AllgatherFunction(torch.autograd.Function):
    """allgather with a gradient (Horovod's): the gradient is averaged over the members and this
    member's rows are its gradient."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.process_set = process_set
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        return _now("allgather", name, tensor.detach(), process_set=process_set, finish=_first)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _now("allreduce", None, grad_output.contiguous(), op=Average,
                    process_set=ctx.process_set, finish=_first)
        rows = _now("allgather", None, torch.tensor([ctx.rows], dtype=torch.int64),
                    process_set=ctx.process_set, finish=_first).tolist()
        offset = sum(rows[:_members(ctx.process_set).index(_worker().rank)])
        return grad.narrow(0, offset, ctx.rows), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Every member's tensor concatenated along dimension 0 in rank order (dimension 0 may differ).
    Differentiable."""
    _check_tensor(tensor, "allgather")
    if tensor.requires_grad:
        return _AllgatherFunction.apply(tensor, name, process_set)
    return _run(allgather_async, tensor, name, process_set)


def allgather_async(tensor, name=None, process_set=global_process_set):
    _check_tensor(tensor, "allgather_async")
    return _submit("allgather", name, tensor.detach(), process_set=process_set, finish=_first)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor (submitted together). Differentiable."""
    names = _group_names(name, len(tensors))
    if any(t.requires_grad for t in tensors):
        return [allgather(t, n, process_set) for t, n in zip(tensors, names)]
    return [synchronize(h) for h in _blocking(grouped_allgather_async, tensors, name, process_set)]


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    return [allgather_async(t, n, process_set) for t, n in zip(tensors, _group_names(name, len(tensors)))]


# broadcast ---------------------------------------------------------------------------------------

class _BroadcastFunction(torch.autograd.Function):
    """broadcast with a gradient (Horovod's): the averaged gradient on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _run(broadcast_async, tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _now("allreduce", None, grad_output.contiguous(), op=Average,
                    process_set=ctx.process_set, finish=_first)
        if _worker().rank != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """A new tensor holding root_rank's `tensor`. Differentiable."""
    _check_tensor(tensor, "broadcast")
    if tensor.requires_grad:
        return _BroadcastFunction.apply(tensor, root_rank, name, process_set)
    return _run(broadcast_async, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In place: every member's `tensor` becomes root_rank's. Returns it."""
    return _run(broadcast_async_, tensor, root_rank, name, process_set)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    _check_tensor(tensor, "broadcast_async")
    _check_root(root_rank, "broadcast_async")
    return _submit("broadcast", name, tensor.detach(), root=root_rank, process_set=process_set, finish=_first)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    _check_tensor(tensor, "broadcast_async_")
    _check_root(root_rank, "broadcast_async_")
    target = tensor
    return _submit("broadcast", name, tensor.detach(), tensor.detach(), root=root_rank, process_set=process_set,
                   finish=lambda results: target)


# alltoall ----------------------------------------------------------------------------------------

def _splits_list(splits, call):
    if splits is None:
        return []
    if torch.is_tensor(splits):
        if splits.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{call}: splits must be an int32 or int64 tensor, got {splits.dtype}")
        return [int(s) for s in splits.tolist()]
    return [int(s) for s in splits]


class _AlltoallFunction(torch.autograd.Function):
    """alltoall with a gradient: the gradient goes back the way the rows came (alltoall with the
    received splits)."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = _run(alltoall_async, tensor, splits, name, process_set)
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, grad_received):
        grad, _ = _run(alltoall_async, grad_output.contiguous(), ctx.received, None, ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Rows of `tensor` to each member: splits[k] rows (dimension 0) to the k-th member of the set
    (default: equal parts). Returns the rows received, concatenated in member order, and, when
    splits were given, the received splits as an int32 tensor too (Horovod's). Differentiable."""
    _check_tensor(tensor, "alltoall")
    if tensor.requires_grad:
        output, received = _AlltoallFunction.apply(tensor, splits, name, process_set)
    else:
        output, received = _run(alltoall_async, tensor, splits, name, process_set)
    return output if splits is None else (output, received)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    _check_tensor(tensor, "alltoall_async")
    split_list = _splits_list(splits, "alltoall")
    members = len(_members(process_set))
    if not split_list and (tensor.dim() == 0 or tensor.shape[0] % members != 0):
        raise ValueError(f"alltoall: the tensor's first dimension ({tensor.shape[0] if tensor.dim() else 'a scalar'}) "
                         f"is not divisible by the {members} ranks of the process set; give splits")
    if split_list and (len(split_list) != members or sum(split_list) != tensor.shape[0] or min(split_list) < 0):
        raise ValueError(f"alltoall: splits {split_list} must have one entry >= 0 per rank of the process set "
                         f"({members}) and sum to the tensor's first dimension ({tensor.shape[0]})")
    return _submit("alltoall", name, tensor.detach(), splits=split_list, process_set=process_set,
                   finish=lambda results: (results[0], results[1]))


# reducescatter -----------------------------------------------------------------------------------

class _ReducescatterFunction(torch.autograd.Function):
    """reducescatter with a gradient (Horovod's): the gradients allgathered, times the set's size
    for Sum."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.process_set = op, process_set
        return _run(reducescatter_async, tensor, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _now("allgather", None, grad_output.contiguous(), process_set=ctx.process_set,
                    finish=_first)
        if ctx.op == Sum:
            grad = grad * len(_members(ctx.process_set))
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, prescale_factor=1.0,
                  postscale_factor=1.0, process_set=global_process_set):
    """This member's part of the reduction of every member's `tensor`: dimension 0 split as evenly as
    possible (the first members one row more). Differentiable."""
    _check_tensor(tensor, "reducescatter")
    if tensor.requires_grad and op in (Average, Sum):
        return _ReducescatterFunction.apply(tensor, name, op, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(tensor)
    result = _run(reducescatter_async, compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(result, ctx)


def reducescatter_async(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                        process_set=global_process_set):
    _check_tensor(tensor, "reducescatter_async")
    op = _resolve_op(None, op, "reducescatter")
    if tensor.dim() == 0:
        raise HorovodInternalError("reducescatter: a scalar (0-dimensional) tensor cannot be scattered")
    return _submit("reducescatter", name, tensor.detach(), op=op, prescale_factor=prescale_factor,
                   postscale_factor=postscale_factor, process_set=process_set, finish=_first)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average, prescale_factor=1.0,
                          postscale_factor=1.0, process_set=global_process_set):
    """reducescatter of each tensor (submitted together). Differentiable."""
    names = _group_names(name, len(tensors))
    if any(t.requires_grad for t in tensors):
        return [reducescatter(t, n, compression, op, prescale_factor, postscale_factor, process_set)
                for t, n in zip(tensors, names)]
    compressed = [compression.compress(t) for t in tensors]
    handles = _blocking(grouped_reducescatter_async, [c for c, _ in compressed], name, op, prescale_factor,
                        postscale_factor, process_set)
    return [compression.decompress(synchronize(h), ctx) for h, (_, ctx) in zip(handles, compressed)]


def grouped_reducescatter_async(tensors, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                                process_set=global_process_set):
    return [reducescatter_async(t, n, op, prescale_factor, postscale_factor, process_set)
            for t, n in zip(tensors, _group_names(name, len(tensors)))]


# barrier, join, process sets -----------------------------------------------------------------------

def barrier(process_set=global_process_set):
    """Returns once every member of the set called it."""
    _now("barrier", process_set=process_set)


def join(device=-1):
    """Uneven inputs (Horovod's hvd.join): this rank has no more data. Until every rank has joined,
    it takes part in its peers' allreduces with zeros (Average still divides by every rank) and
    barriers; an allgather, broadcast, alltoall or reducescatter that needs it fails on the others.
    Returns the rank that joined last (the same on every rank)."""
    return int(_now("join", finish=_first).item())


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) on every worker: every worker calls
    it with the same ranks. Returns the ProcessSet, now usable as process_set= of any collective."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"add_process_set: {process_set!r} is registered already")
    ranks = sorted(int(r) for r in process_set.ranks)
    for existing in _state.process_sets.values():
        if existing is not global_process_set and existing.ranks == ranks:
            raise ValueError(f"add_process_set: a process set with ranks {ranks} exists already")
    process_set.process_set_id = int(_now("add_process_set", ranks=ranks, finish=_first).item())
    process_set.ranks = ranks
    _state.process_sets[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Removes a process set on every worker (every worker calls it). Returns True if it was
    registered; the global set is never removed (False)."""
    if process_set is global_process_set or not isinstance(process_set, ProcessSet) or \
            process_set.process_set_id is None or process_set.process_set_id == 0:
        return False
    _now("remove_process_set", process_set=process_set)
    _state.process_sets.pop(process_set.process_set_id, None)
    process_set.process_set_id = None
    return True
