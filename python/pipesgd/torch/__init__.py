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
"""

import atexit
import contextlib
import io
import os
import pickle
import re
import socket
import sys
import threading
import warnings
import weakref
import zlib

import torch

from pipesgd import _C
from pipesgd._C import CollectiveMismatchError, CommError, CommTimeoutError, DataError, PeerFailedError

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

# Reduction operations (Horovod's names).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}


class ProcessSet:
    """A subset of the workers for collectives (Horovod's): ``hvd.add_process_set([0, 2])`` registers
    one on every worker; ``process_set=`` of any collective then involves its ranks only."""

    def __init__(self, ranks=None):
        if ranks is not None and not isinstance(ranks, (list, tuple, range)):
            raise ValueError(f"ProcessSet: expected a list of ranks, got {type(ranks).__name__} "
                             "(an mpi4py communicator is not supported)")
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = None

    def _ranks(self):
        if self.process_set_id is None:
            raise ValueError(f"{self!r} is not registered (hvd.add_process_set)")
        return _worker().process_set_ranks(self.process_set_id)

    def size(self):
        return len(self._ranks())

    def rank(self):
        """This worker's index in the set (ValueError if it is not a member)."""
        ranks = self._ranks()
        if rank() not in ranks:
            raise ValueError(f"rank {rank()} is not in {self!r}")
        return ranks.index(rank())

    def included(self):
        return rank() in self._ranks()

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks and \
            self.process_set_id == other.process_set_id

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet()
global_process_set.process_set_id = 0


# --------------------------------------------------------------------------------------------
# Compression (Horovod's Compression.none / Compression.fp16).

class Compressor:
    """Interface of Horovod's compressors: compress(tensor) -> (tensor, ctx), decompress(tensor, ctx)."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """In collectives: sends float tensors as float16. In DistributedOptimizer: pipesgd's 16-bit
    in-ring codec (``--codec bf16``, Pipe-SGD's 16-bit truncation), which every allreduce method takes."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx is not None else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor


# --------------------------------------------------------------------------------------------
# The world.

class _State:
    session = None
    worker = None
    servers = 0
    failed = False
    local_size = 1
    cross_rank = 0
    cross_size = 1
    homogeneous = True
    process_sets = {}  # id -> ProcessSet registered with add_process_set
    optimizers = weakref.WeakSet()  # live DistributedOptimizers, finished at shutdown
    previous_excepthook = None


_state = _State()

_DEFAULT_TIMEOUT_SECONDS = 120.0


def _under_launcher():
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ or "PMIX_RANK" in os.environ


def init(comm=None, process_sets=None, servers=0, timeout=None, exit_servers=True, trace=None,
         trace_iterations=None):
    """Joins the world (Horovod's hvd.init).

    Under mpirun/pipesgdrun every rank is a process of one world (MPI); otherwise the script is a
    world of one worker. ``servers=S``: the last S ranks are parameter servers (for the methods
    pssync, asgd, dcasgd, odsgd): on them init() serves until the workers shut down and then exits
    the process with status 0 (``exit_servers=False``: returns instead, with ``is_worker()``
    False). ``timeout``: seconds any wait on a peer may take (default 120, or $PIPESGD_TIMEOUT).
    ``trace="t.json"``: the world's timeline in the Chrome trace format (open it in
    https://ui.perfetto.dev), as ``pipesgd train --trace``: each worker's optimizer steps, waits and
    updates (the step number as iteration), its comm thread's allreduces, the servers' requests;
    rank 0 writes it at shutdown() (after an uncaught exception each rank writes its own events, rank
    R > 0 to "t.json.rank-R"). ``trace_iterations="A:B"`` (or "A:", ":B") records steps A <= t < B
    only. A malformed window or an unwritable directory is a ValueError.
    ``comm`` (an mpi4py communicator) and ``process_sets`` are not supported (only None).
    Calling init() again on a world already joined begins a new phase of the program (as each test
    of a test suite does): a collective of an earlier phase that some rank left behind then fails at
    once instead of pairing with, or holding up, the collectives that follow (docs: "Peers agree").
    """
    if _state.session is not None:
        if _state.worker is not None:
            _state.worker.new_phase()
        return
    if comm is not None:
        raise NotImplementedError("pipesgd.torch.init: comm= (an mpi4py communicator) is not supported; "
                                  "pipesgd joins MPI_COMM_WORLD")
    if process_sets not in (None, "dynamic") and not (isinstance(process_sets, (list, tuple)) and
                                                     all(isinstance(p, ProcessSet) for p in process_sets)):
        raise ValueError("pipesgd.torch.init: process_sets must be a list of hvd.ProcessSet (or None, 'dynamic')")
    if not isinstance(servers, int) or servers < 0:
        raise ValueError(f"servers must be an integer >= 0, got {servers!r}")
    if timeout is None:
        timeout = float(os.environ.get("PIPESGD_TIMEOUT", _DEFAULT_TIMEOUT_SECONDS))
    trace = "" if trace is None else os.fspath(trace)
    if trace_iterations is None:
        trace_iterations = ""
    elif not isinstance(trace_iterations, str):
        raise ValueError(f"trace_iterations must be a string such as '100:200', got {trace_iterations!r}")
    if not _under_launcher():
        _refuse_torchrun_style_launch()
    if _under_launcher():
        session = _C.Session.join_mpi(servers, float(timeout), trace, trace_iterations)
    else:
        if servers > 0:
            raise ValueError(f"servers={servers} needs ranks to serve: launch the script with "
                             f"pipesgdrun -np N (N > {servers}) or mpirun")
        session = _C.Session.join_alone(float(timeout), trace, trace_iterations)
    _state.session = session
    _state.servers = servers
    _state.failed = False
    atexit.register(_shutdown_at_exit)
    if _state.previous_excepthook is None:
        _state.previous_excepthook = sys.excepthook
        sys.excepthook = _fail_on_uncaught_exception
    if not session.is_worker:
        # A server rank: it has served until the workers shut down.
        _state.session = None
        if exit_servers:
            sys.exit(0)
        return
    _state.worker = session.worker()
    _state.process_sets = {0: global_process_set}
    global_process_set.ranks = list(range(_state.worker.size))
    _learn_hosts()
    for process_set in process_sets if isinstance(process_sets, (list, tuple)) else []:
        add_process_set(process_set)


def _learn_hosts():
    """local_size, cross_rank and cross_size from the workers' host names (one allgather)."""
    worker = _state.worker
    host = zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF
    hosts = worker.allgather(torch.tensor([host], dtype=torch.int64)).tolist()
    distinct = sorted(set(hosts), key=hosts.index)
    _state.local_size = hosts.count(host)
    _state.cross_rank = distinct.index(host)
    _state.cross_size = len(distinct)
    _state.homogeneous = len({hosts.count(h) for h in distinct}) == 1


_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                       "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def _refuse_torchrun_style_launch():
    """A process started torchrun-style (WORLD_SIZE > 1, no MPI launcher) would train alone while its
    peers do the same: refused, naming what was found."""
    try:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        world_size = 0
    if world_size == 1:
        return
    found = " ".join(f"{name}={os.environ[name]}" for name in _TORCHRUN_VARIABLES if name in os.environ)
    raise RuntimeError(f"pipesgd.torch.init: this process was started torchrun-style ({found}) without an MPI "
                       f"launcher; pipesgd's ranks join through MPI: launch with `pipesgdrun -np N python3 "
                       f"script.py` or `mpirun -np N ...` (each process would otherwise train alone)")


def _shutdown_at_exit():
    if _state.session is not None and not _state.failed:
        try:
            shutdown()
        except Exception as error:  # the process is ending: say why, do not raise from atexit
            print(f"pipesgd: shutdown at exit failed: {error}", file=sys.stderr)


def _fail_on_uncaught_exception(kind, value, traceback):
    # At an interactive prompt an uncaught exception does not end the program.
    interactive = hasattr(sys, "ps1") or sys.flags.interactive
    if _state.session is not None and not _state.failed and not interactive:
        _state.failed = True
        _state.session.fail(f"{kind.__name__}: {value}".splitlines()[0])
    _state.previous_excepthook(kind, value, traceback)


def shutdown():
    """Leaves the world: every worker calls it (or lets the interpreter exit: init() registered
    it with atexit). Every DistributedOptimizer still alive is finished first (its updates in
    flight applied); worker 0 then stops the servers. Idempotent."""
    session = _state.session
    if session is None:
        return
    try:
        # Every rank's collectives are done before any rank's communication thread stops.
        _now("barrier", "pipesgd.shutdown")
    except Exception as error:  # a peer failed or left
        print(f"pipesgd: shutdown: {error}", file=sys.stderr)
    # Updates still in flight are applied, and parameter-server methods close their servers' session.
    for optimizer in list(_state.optimizers):
        try:
            optimizer._pipesgd.finish()
        except ValueError:
            pass  # it failed earlier (its error was raised then)
    _state.optimizers = weakref.WeakSet()
    _state.session = None
    _state.worker = None
    for process_set in _state.process_sets.values():
        if process_set is not global_process_set:
            process_set.process_set_id = None
    _state.process_sets = {}
    _handles.entries.clear()
    session.shutdown()


def is_initialized():
    return _state.session is not None


def _worker():
    if _state.worker is None:
        raise ValueError("pipesgd.torch has not been initialized; use hvd.init().")
    return _state.worker


def rank():
    return _worker().rank


def size():
    return _worker().size


def local_rank():
    return _worker().local_rank


def local_size():
    _worker()
    return _state.local_size


def cross_rank():
    _worker()
    return _state.cross_rank


def cross_size():
    _worker()
    return _state.cross_size


def is_homogeneous():
    _worker()
    return _state.homogeneous


def is_worker():
    """True on a worker rank after init(); False on a server rank (init(exit_servers=False))."""
    return _state.worker is not None


def mpi_threads_supported():
    return _worker().is_mpi


def mpi_enabled():
    return _under_launcher()


def mpi_built():
    return True


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return False


def rocm_built():
    return False


def available_methods():
    """The methods a DistributedOptimizer's method= takes: dicts with name, summary, uses_servers."""
    return _C.available_methods()


# --------------------------------------------------------------------------------------------
# Collectives: negotiated and run by the C++ worker's communication thread (include/pipesgd/
# collectives.h); here only Horovod's argument conventions, compression, autograd and handles.

class HorovodInternalError(RuntimeError):
    """Horovod's error for a collective that failed inside the runtime (pipesgd: a collective a peer
    did not match, or that needs a rank that has joined)."""


def _check_tensor(tensor, call):
    if not torch.is_tensor(tensor):
        raise TypeError(f"{call}: expected a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cpu:
        raise ValueError(f"pipesgd.torch: tensors must be on the CPU, got one on {tensor.device}")


def _set_id(process_set, call):
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{call}: process_set must be a ProcessSet (hvd.add_process_set), got {process_set!r}")
    if process_set.process_set_id is None:
        raise ValueError(f"{call}: process set {process_set!r} is not registered (hvd.add_process_set) or was removed")
    return process_set.process_set_id


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


class _Handles:
    """Handles of submitted collectives (ints, as Horovod's): the C++ Work and what turns its
    results into the call's return value."""

    def __init__(self):
        self.entries = {}
        self.next = 0

    def add(self, work, finish):
        handle = self.next
        self.next += 1
        self.entries[handle] = (work, finish)
        return handle


_handles = _Handles()


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


class _ThisThread(threading.local):
    caller_waits = False  # set by _blocking


_this_thread = _ThisThread()


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
    if not isinstance(root_rank, int) or not 0 <= root_rank < size():
        raise ValueError(f"{call}: root_rank {root_rank!r} is not a worker rank (0..{size() - 1})")


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
        offset = sum(rows[:_members(ctx.process_set).index(rank())])
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
        if rank() != ctx.root_rank:
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


def _members(process_set):
    return _worker().process_set_ranks(_set_id(process_set, "process set"))


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


# --------------------------------------------------------------------------------------------
# Objects.

def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` (pickled) on every member."""
    _check_root(root_rank, "broadcast_object")
    payload = b""
    if rank() == root_rank:
        buffer = io.BytesIO()
        pickle.dump(obj, buffer, protocol=pickle.HIGHEST_PROTOCOL)
        payload = buffer.getvalue()
    length = torch.tensor([len(payload)], dtype=torch.int64)
    length = broadcast_(length, root_rank, None if name is None else f"{name}.length", process_set)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else \
        torch.empty(int(length.item()), dtype=torch.uint8)
    data = broadcast_(data, root_rank, None if name is None else f"{name}.data", process_set)
    if rank() == root_rank:
        return obj
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every member's `obj` (pickled), in rank order."""
    payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
    lengths = allgather(torch.tensor([payload.numel()], dtype=torch.int64),
                        None if name is None else f"{name}.lengths", process_set).tolist()
    gathered = allgather(payload, None if name is None else f"{name}.data", process_set).numpy().tobytes()
    objects, offset = [], 0
    for length in lengths:
        objects.append(pickle.loads(gathered[offset:offset + length]))
        offset += length
    return objects


def broadcast_parameters(params, root_rank, prefix=None):
    """Every worker's parameters (and buffers) become root_rank's, in place.

    `params`: a state_dict (``model.state_dict()``; its tensors share the module's storage) or an
    iterable of (name, tensor) pairs such as ``model.named_parameters()``.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = list(params)
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError(f"invalid params of type: {type(params)}: expected a state_dict or (name, tensor) pairs")
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = []
    for name, tensor in items:
        if tensor is None:
            continue
        if not torch.is_tensor(tensor):
            raise ValueError(f"broadcast_parameters: expected tensors, got {type(tensor)}")
        # Negotiated together (a round lists up to 32), each under its name.
        handles.append(broadcast_async_(tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor, root_rank,
                                        name=f"broadcast_parameters.{name}" if isinstance(name, str) else None))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Every worker's optimizer state becomes root_rank's.

    For a pipesgd DistributedOptimizer: its hyper-parameters (param_groups) and the method's state
    (momentum, moments, ...: valid before its first backward, as after a load). For a plain
    torch.optim optimizer: its state_dict.
    """
    if isinstance(optimizer, _DistributedOptimizer) and not optimizer.fused_update:
        # The wrapped optimizer's state as Horovod broadcasts it, and root's method state, which a
        # worker whose optimizer has not stepped yet takes too (the usual resume: root loaded a checkpoint).
        payload = None
        if rank() == root_rank:
            try:
                method_state = optimizer._pipesgd.save_state()
            except ValueError:  # after a backward, before its step: the method's state stays each rank's
                method_state = None
            payload = (optimizer._wrapped_class.state_dict(optimizer), method_state)
        state, method_state = broadcast_object(payload, root_rank)
        if rank() != root_rank:
            optimizer._wrapped_class.load_state_dict(optimizer, state)
            if method_state is not None and optimizer.iteration == 0:
                optimizer._pipesgd.load_state(method_state)
        return
    if isinstance(optimizer, _DistributedOptimizer):
        groups = broadcast_object([{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
                                  root_rank)
        for group, values in zip(optimizer.param_groups, groups):
            group.update(values)
        _C.broadcast_optimizer_state(_worker(), optimizer._pipesgd, root_rank)
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"broadcast_optimizer_state: expected a torch.optim.Optimizer, got {type(optimizer)}")
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


# --------------------------------------------------------------------------------------------
# DistributedOptimizer.

# Keyword arguments that name a CLI flag differently; the rest map name_with_underscores ->
# --name-with-underscores.
_FLAG_ALIASES = {"staleness": "--staleness-k", "k": "--staleness-k"}
_DEFAULT_METHOD = "dsync"
# Pipe-SGD's gradients are K-1 steps stale and momentum amplifies a stale gradient: from momentum
# 0.5 on the accuracy loss against dsync passes 1 point (6.5 at 0.9; the CLI's train/compare warn
# alike, docs/user-guide.md "Momentum with a stale method"). Warned once per process.
_STALE_MOMENTUM_WARNING = 0.5
_STALE_MOMENTUM_ADVICE = 0.3
_stale_momentum_warned = False


def _warn_stale_momentum(spec, flags, param_groups):
    global _stale_momentum_warned
    momentum = max(float(group.get("momentum", 0) or 0) for group in param_groups)
    try:
        k = int(flags.get("--staleness-k", 2))
    except ValueError:
        return  # the method's own check says what is wrong
    if _stale_momentum_warned or spec.split("+")[0] != "pipe" or k < 2 or momentum < _STALE_MOMENTUM_WARNING:
        return
    _stale_momentum_warned = True
    steps = "step" if k == 2 else "steps"
    warnings.warn(f"pipesgd.torch: method '{spec}' applies gradients {k - 1} {steps} stale (K = {k}) and momentum "
                  f"{momentum:g} amplifies them: expect lower accuracy (at momentum 0.9, 4 to 10 points below dsync: "
                  f"docs/results.md); use method='sapipe' (with model=your_module, fused_update=True; or 'sapipe+dc' "
                  f"with your optimizer), momentum <= {_STALE_MOMENTUM_ADVICE:g}, or 'dsync'",
                  stacklevel=4)
# The C++ options that Python sets from elsewhere than a method keyword: the wrapped optimizer's
# hyper-parameters (fused_update=True), DistributedOptimizer's timeout=, init's servers=.
_KEYWORDS_OF_FLAGS = {"--lr": "lr", "--momentum": "momentum", "--weight-decay": "weight_decay",
                      "--adam-beta1": "betas", "--adam-beta2": "betas", "--adam-eps": "eps",
                      "--comm-timeout": "timeout", "--servers": "servers"}
_FLAG_PATTERN = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def _python_names(message, keyword_of_flag):
    """A message of the C++ option checks (which name the CLI's flags) in the names a Python user
    wrote: --staleness-k -> staleness=, --warmup-iters -> warmup_iters=, --comm-timeout -> timeout=.
    `keyword_of_flag`: flag -> the keyword the user gave for it (aliases included)."""
    def keyword(match):
        flag = match.group(0)
        name = keyword_of_flag.get(flag) or _KEYWORDS_OF_FLAGS.get(flag) or match.group(1).replace("-", "_")
        return name + "="
    return _FLAG_PATTERN.sub(keyword, message)


def _hyper_parameters(optimizer):
    """The C++ optimizer options from the wrapped torch optimizer (class and param_groups)."""
    groups = optimizer.param_groups
    first = {k: v for k, v in groups[0].items() if k not in ("params", "initial_lr")}
    for index, group in enumerate(groups[1:], start=1):
        other = {k: v for k, v in group.items() if k not in ("params", "initial_lr")}
        if other != first:
            different = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            raise ValueError(f"pipesgd.torch.DistributedOptimizer: param_groups 0 and {index} differ in "
                             f"{', '.join(different)}; pipesgd trains every parameter with one set of "
                             "hyper-parameters (use one group)")
    kind = type(optimizer)
    bases = [c for c in kind.__mro__ if c in (torch.optim.SGD, torch.optim.Adam)]
    if not bases:
        raise ValueError(f"pipesgd.torch.DistributedOptimizer: {kind.__name__} is not supported; pipesgd's "
                         "methods update with torch.optim.SGD (momentum, weight_decay) or torch.optim.Adam")
    options = {"learning_rate": float(first["lr"]), "weight_decay": float(first.get("weight_decay", 0.0))}
    if bases[0] is torch.optim.SGD:
        if first.get("nesterov", False):
            raise ValueError("pipesgd.torch.DistributedOptimizer: SGD with nesterov=True is not supported")
        if first.get("dampening", 0) != 0:
            raise ValueError("pipesgd.torch.DistributedOptimizer: SGD with dampening != 0 is not supported")
        if first.get("maximize", False):
            raise ValueError("pipesgd.torch.DistributedOptimizer: maximize=True is not supported")
        options.update(optimizer="sgd", momentum=float(first.get("momentum", 0.0)))
    else:
        if first.get("amsgrad", False):
            raise ValueError("pipesgd.torch.DistributedOptimizer: Adam with amsgrad=True is not supported")
        if first.get("maximize", False):
            raise ValueError("pipesgd.torch.DistributedOptimizer: maximize=True is not supported")
        beta1, beta2 = first["betas"]
        options.update(optimizer="adam", adam_beta1=float(beta1), adam_beta2=float(beta2),
                       adam_eps=float(first["eps"]))
    return first, options


def _layers(optimizer, named_parameters, model):
    """(name, [parameters]) per layer, in the model's order: the modules that own parameters directly
    (with model=), else the named parameters grouped by their module path (the name before the last dot)."""
    trained = {id(p) for group in optimizer.param_groups for p in group["params"] if p.requires_grad}
    layers = []
    if model is not None:
        for module_name, module in model.named_modules():
            parameters = [p for p in module.parameters(recurse=False) if id(p) in trained]
            seen = {id(p) for _, ps, _ in layers for p in ps}
            parameters = [p for p in parameters if id(p) not in seen]
            if parameters:
                layers.append((module_name or "(root)", parameters, module))
        return layers
    by_name = {}
    for name, parameter in named_parameters:
        if id(parameter) not in trained:
            continue
        layer = name.rsplit(".", 1)[0] if "." in name else name
        if layer not in by_name:
            by_name[layer] = []
            layers.append((layer, by_name[layer], None))
        by_name[layer].append(parameter)
    return layers


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, method, model, method_options, timeout, fused_update, process_set_id):
        self._wrapped_class.__init__(self, params)  # shares the wrapped optimizer's param_groups
        worker = _worker()
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", v) for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) or len(p) != 2 for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually "
                             "produced by model.named_parameters()")
        names = [name for name, _ in named_parameters]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: "
                             f"{', '.join(duplicates)}")
        self._parameter_names = {p: name for name, p in named_parameters}  # Horovod's attribute
        named_ids = {id(p) for _, p in named_parameters}
        unnamed = [p for group in self.param_groups for p in group["params"] if id(p) not in named_ids]
        if unnamed and model is None:
            raise ValueError(f"named_parameters was specified, but one or more model parameters were not named. "
                             f"Python object ids: {', '.join(str(id(p)) for p in unnamed)}")
        if op == Adasum:
            raise NotImplementedError("pipesgd.torch.DistributedOptimizer: op=Adasum is not supported; use "
                                      "op=hvd.Average (or one of pipesgd's methods: method=...)")
        if op not in (Average, Sum):
            raise ValueError(f"DistributedOptimizer: op must be hvd.Average or hvd.Sum, got {_OP_NAMES.get(op, op)}")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if not gradient_predivide_factor > 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}")
        spec = _DEFAULT_METHOD if method is None else str(method)
        if method_options.get("warmup_epochs", 0) not in (0, "0"):
            raise ValueError("warmup_epochs= needs the iterations of one epoch, which pipesgd.torch does not know: "
                             "give warmup_iters= (iterations) instead")
        flags = {}
        for key, value in method_options.items():
            flag = _FLAG_ALIASES.get(key, "--" + key.replace("_", "-"))
            flags[flag] = str(value).lower() if isinstance(value, bool) else str(value)
        if compression is Compression.fp16 or compression is FP16Compressor:
            if "+" in spec and any(part in ("bf16", "int8", "none") for part in spec.split("+")[1:]) \
                    or "--codec" in flags:
                raise ValueError(f"compression=Compression.fp16 and method '{spec}' both choose a codec; give one")
            flags["--codec"] = "bf16"
        elif compression is not Compression.none and compression is not NoneCompressor:
            raise ValueError("DistributedOptimizer: compression must be hvd.Compression.none or hvd.Compression.fp16 "
                             "(pipesgd compresses inside the ring; method='...+int8' for 8 bits)")
        layers = _layers(self, named_parameters, model)
        if not layers:
            raise ValueError("DistributedOptimizer: no parameter that requires grad")
        methods = {m["name"]: m for m in _C.available_methods()}
        base = spec.split("+")[0]
        servers_update = base in methods and methods[base]["uses_servers"]
        if fused_update is None:
            fused_update = servers_update
        elif not fused_update and servers_update:
            raise ValueError(f"method '{spec}' applies the update on its parameter servers (SGD): your optimizer "
                             "cannot apply it (fused_update=False is not possible); use a worker-only method")
        # The general path (the default): the method hands each step's gradient over as p.grad and the
        # wrapped optimizer's own step() applies it. The fused path: the method updates with its own
        # SGD/Adam, taken from the wrapped optimizer's class and param_groups.
        self._fused = bool(fused_update)
        if self._fused:
            hyper, options = _hyper_parameters(self)
            self._hyper = hyper
        else:
            options = {"optimizer": "external"}
        self._forward_hooks = model is not None and self._fused
        _warn_stale_momentum(spec, flags, self.param_groups)
        if base == "sapipe" and model is None and self._fused:
            warnings.warn("pipesgd.torch: method 'sapipe' applies its synchronous layers' updates just before each "
                          "layer's forward through module forward pre-hooks: pass model=your_module to "
                          "DistributedOptimizer; without it they are applied at step()", stacklevel=3)
        if base in methods and methods[base]["uses_servers"] and _state.servers == 0:
            raise ValueError(f"method '{spec}' needs parameter-server ranks: call hvd.init(servers=S) and launch "
                             f"with S more ranks than workers")
        options.update(flags=flags, backward_passes_per_step=backward_passes_per_step, sum=(op == Sum),
                       forward_hooks=self._forward_hooks, process_set=process_set_id)
        if self._fused:
            options["lr_schedule"] = "external"
        if timeout is not None:
            options["timeout"] = float(timeout)
        if self._fused and not options["learning_rate"] > 0:
            initial = self.param_groups[0].get("initial_lr", 0.0)
            if not initial > 0:
                raise ValueError(f"DistributedOptimizer: the learning rate is {options['learning_rate']}; pipesgd "
                                 "needs a positive rate at construction (set it later with a scheduler)")
            options["learning_rate"] = float(initial)
        try:
            self._pipesgd = _C.DistributedOptimizer(worker, [(name, params) for name, params, _ in layers], spec,
                                                    options)
        except ValueError as error:  # the option checks name the CLI's flags: say the keywords instead
            keyword_of_flag = {_FLAG_ALIASES.get(key, "--" + key.replace("_", "-")): key for key in method_options}
            raise type(error)(_python_names(str(error), keyword_of_flag)) from None
        if not self._fused:
            # finish() applies the updates still in flight one after another, each by the wrapped step().
            myself = weakref.ref(self)
            self._pipesgd.set_apply_callback(lambda: myself()._apply_gradients())
        _state.optimizers.add(self)
        self._method = spec
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = []
        if self._forward_hooks:
            for index, (_, _, module) in enumerate(layers):
                self._hook_handles.append(module.register_forward_pre_hook(self._make_forward_hook(index)))

    def _make_forward_hook(self, index):
        optimizer = self._pipesgd

        def hook(module, inputs):
            if module.training and torch.is_grad_enabled():
                optimizer.before_layer_forward(index)
        return hook

    @property
    def method(self):
        """The pipesgd method spec this optimizer trains with ("dsync", "pipe+int8", ...)."""
        return self._method

    def _check_hyper_parameters(self):
        current = {k: v for k, v in self.param_groups[0].items() if k not in ("params", "initial_lr", "lr")}
        expected = {k: v for k, v in self._hyper.items() if k != "lr"}
        if current != expected:
            changed = sorted(k for k in set(current) | set(expected) if current.get(k) != expected.get(k))
            raise ValueError(f"DistributedOptimizer: {', '.join(changed)} changed after construction; pipesgd "
                             "follows the learning rate only")
        lrs = {group["lr"] for group in self.param_groups}
        if len(lrs) != 1:
            raise ValueError("DistributedOptimizer: param_groups have different learning rates; pipesgd uses one")
        return float(self.param_groups[0]["lr"])

    @property
    def fused_update(self):
        """True if the method applies the update with its own SGD/Adam (fused_update=True, or a
        parameter-server method); False if the wrapped optimizer's step() applies it (the default)."""
        return self._fused

    def _apply_gradients(self):
        """The wrapped optimizer's own step() on the gradients in p.grad. An optimizer that takes
        sparse gradients only (torch.optim.SparseAdam) gets each as a sparse tensor (the averaged
        gradient, as Horovod's sparse allreduce gives it); p.grad is the dense view again afterwards."""
        if not issubclass(self._wrapped_class, torch.optim.SparseAdam):
            self._wrapped_class.step(self)
            return
        dense = [(p, p.grad) for group in self.param_groups for p in group["params"] if p.grad is not None]
        for p, grad in dense:
            p.grad = grad.to_sparse()
        try:
            self._wrapped_class.step(self)
        finally:
            for p, grad in dense:
                p.grad = grad

    def _plain_sgd(self):
        """(lr, weight_decay) when the wrapped optimizer is torch.optim.SGD itself without momentum
        (stateless) and every param group has the same lr and weight decay: the method then applies
        that rule in its own pass (the fast path: the same update, one pass over the parameters
        less); None otherwise."""
        if self._wrapped_class is not torch.optim.SGD:
            return None
        first = self.param_groups[0]
        for group in self.param_groups:
            if group.get("momentum", 0) != 0 or group.get("nesterov", False) or group.get("maximize", False) \
                    or group.get("differentiable", False) or group["lr"] != first["lr"] \
                    or group.get("weight_decay", 0) != first.get("weight_decay", 0):
                return None
        return float(first["lr"]), float(first.get("weight_decay", 0))

    def _take_plain_sgd_fast_path(self):
        plain = self._plain_sgd()
        if plain is not None:
            self._pipesgd.apply_plain_sgd(*plain)
        return plain is not None

    def step(self, closure=None):
        """This step's gradients go to the method. General path (the default): the method's step
        (unless synchronize() ran it) leaves the gradient to apply in p.grad (this step's average;
        a pipelined method's earlier one; None for a parameter that gets no update this step), and the
        wrapped optimizer's step() applies it, with its own rule, param_groups and learning rate.
        Fused path: the method communicates and updates with its own SGD/Adam at the
        param_groups' learning rate of this call."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._synchronized and self._should_synchronize:
            warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                          "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                          "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                          "your code.")
        if self._fused:
            if self._synchronized:
                self._synchronized = False
                return loss
            self._pipesgd.set_learning_rate(self._check_hyper_parameters())
            self._pipesgd.step()
            return loss
        if self._synchronized:
            self._apply_gradients()  # what synchronize() handed over, as edited since
        else:
            applied_by_the_method = self._take_plain_sgd_fast_path()
            self._pipesgd.synchronize_gradients()
            if not applied_by_the_method:
                self._apply_gradients()
        self._synchronized = False
        self._pipesgd.step()  # arms the next backward
        return loss

    def synchronize(self):
        """Completes this step's communication now: the gradients to apply are in p.grad afterwards,
        readable and editable (clipping, ...); the step() that follows applies what is there."""
        if self._synchronized:
            return
        if self._fused:
            raise ValueError(f"DistributedOptimizer.synchronize(): method '{self._method}' applies the update "
                             "inside the method (fused_update=True or a parameter-server method), so the "
                             "gradients cannot be read or edited before step(); use the default "
                             "fused_update=False with a worker-only method")
        self._pipesgd.synchronize_gradients()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """A context in which step() does not synchronize (it was done by synchronize())."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients the next backward accumulates into (each step leaves them zero)."""
        self._pipesgd.zero_grad()

    def finish(self):
        """Applies every update still in flight (a pipelined method's last K steps): the model's
        parameters are final after it. Further steps raise."""
        if not self._fused:
            self._take_plain_sgd_fast_path()
        self._pipesgd.finish()

    @property
    def iteration(self):
        return self._pipesgd.iteration

    def state_dict(self):
        """The wrapped optimizer's state_dict, plus the method's state (its updates in flight, codec
        residuals, ...) under the key "pipesgd": torch.save it and load_state_dict() it into a new
        DistributedOptimizer of the same configuration to resume bit for bit. Call it between step()
        and the next backward (it waits for the communication in flight)."""
        if self._fused:
            raise ValueError(f"DistributedOptimizer.state_dict(): method '{self._method}' keeps its update's state "
                             "inside the method (fused_update=True or a parameter-server method); use "
                             "save_state()/load_state(), or the default fused_update=False with a worker-only method")
        state = self._wrapped_class.state_dict(self)
        state["pipesgd"] = {"method": self._method, "state": self._pipesgd.save_state()}
        return state

    def load_state_dict(self, state_dict):
        """The wrapped optimizer's state, and the method's state saved with it by state_dict(): call it on a
        new DistributedOptimizer before its first backward (on every rank, each with its own state for a
        bit-identical resume of the method's per-rank state)."""
        if self._fused:
            raise ValueError(f"DistributedOptimizer.load_state_dict(): method '{self._method}' keeps its update's "
                             "state inside the method (fused_update=True or a parameter-server method); use "
                             "load_state(), or the default fused_update=False with a worker-only method")
        state_dict = dict(state_dict)
        method_state = state_dict.pop("pipesgd", None)
        if method_state is not None and method_state.get("method") != self._method:
            raise ValueError(f"DistributedOptimizer.load_state_dict: the state was saved with method "
                             f"'{method_state.get('method')}', this optimizer's is '{self._method}'")
        self._wrapped_class.load_state_dict(self, state_dict)
        if method_state is not None:
            self._pipesgd.load_state(method_state["state"])

    def save_state(self):
        """fused_update=True: step(), then the optimizer's whole state after it as bytes (resume with
        load_state). The general path keeps the wrapped optimizer's state too: use state_dict()."""
        if not self._fused:
            raise ValueError("DistributedOptimizer.save_state() is the fused path's (fused_update=True); here the "
                             "wrapped optimizer applies the update: save optimizer.state_dict() (it holds the "
                             "method's state too) and resume with load_state_dict()")
        self._pipesgd.set_learning_rate(self._check_hyper_parameters())
        return self._pipesgd.step_and_save_state()

    def load_state(self, state):
        """Continues from save_state()'s bytes (fused_update=True; a new optimizer, before its first backward)."""
        if not self._fused:
            raise ValueError("DistributedOptimizer.load_state() is the fused path's (fused_update=True); use "
                             "load_state_dict() with what state_dict() returned")
        self._pipesgd.load_state(state)


class _OutsideProcessSetOptimizer(torch.optim.Optimizer):
    """DistributedOptimizer on a rank outside its process set: the wrapped optimizer, alone."""

    def __init__(self, params):
        self._wrapped_class.__init__(self, params)

    def synchronize(self):
        pass

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set, method=None, model=None,
                         timeout=None, fused_update=None, **method_options):
    """Horovod's DistributedOptimizer, training with a pipesgd method.

    The result is an instance of the wrapped optimizer's class (sharing its param_groups, so
    schedulers on either work) whose step() is the method's. Horovod's arguments keep their
    meaning; num_groups/groups (fusion groups) and sparse_as_dense are accepted and do nothing
    (pipesgd's methods choose their own buckets: method="dsync+optimal", "wfbp", ...).
    pipesgd's: ``method`` a method spec as the CLI's --algo (default "dsync"); ``model`` the module
    (its layers become pipesgd's layers, and SAPipe applies updates from its forward pre-hooks);
    ``timeout`` seconds any wait may take; any other keyword is a method option of the CLI, e.g.
    ``staleness=2`` (--staleness-k), ``warmup_iters=100``, ``stale_layers=3``,
    ``compensation="dc"``, ``allreduce="tree"``.
    ``fused_update``: None (default) or False: the wrapped optimizer's step() applies the gradient
    the method hands over in p.grad (any torch.optim optimizer); True: the method updates with its
    own fused SGD/Adam (torch.optim.SGD without nesterov/dampening, or Adam without amsgrad, one set
    of hyper-parameters; synchronize() and state_dict() raise). The parameter-server methods are
    always fused (their servers apply the update).
    """
    process_set_id = _set_id(process_set, "DistributedOptimizer")
    if process_set_id != 0 and rank() not in _worker().process_set_ranks(process_set_id):
        # Horovod's rule: a rank outside the optimizer's process set trains alone (no communication).
        cls = type(optimizer.__class__.__name__, (_OutsideProcessSetOptimizer, optimizer.__class__),
                   {"_wrapped_class": optimizer.__class__})
        return cls(optimizer.param_groups)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"DistributedOptimizer: expected a torch.optim.Optimizer, got {type(optimizer)}")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("DistributedOptimizer: the optimizer is already a DistributedOptimizer")
    # An instance of the user's optimizer class (isinstance and schedulers work) whose methods are ours.
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__),
               {"_wrapped_class": optimizer.__class__})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, method, model, method_options, timeout, fused_update, process_set_id)


# --------------------------------------------------------------------------------------------
# Horovod's remaining surface.

def start_timeline(file_path, mark_cycles=False):
    """Horovod's timeline: rank 0 records the collectives it takes part in from now on and writes
    `file_path` (Chrome trace format: open it in https://ui.perfetto.dev) at stop_timeline(). A
    track per tensor name ("allreduce.NAME") with RANK_READY instants (when each rank submitted
    it), NEGOTIATE_ALLREDUCE (until every member had) and ALLREDUCE (rank 0 running it);
    ``mark_cycles=True`` adds a CYCLE_START instant per negotiation round. Any rank may call it;
    only rank 0's call records (as Horovod's coordinator). ValueError for an unwritable path or
    another path while a timeline is being recorded (the same path: it goes on). For a whole
    run's timeline (optimizer steps, waits, updates, every rank) see ``init(trace=...)``."""
    _worker().start_timeline(os.fspath(file_path), bool(mark_cycles))


def stop_timeline():
    """Stops the timeline of start_timeline() and writes its file (rank 0); nothing without one."""
    _worker().stop_timeline()


def PartialDistributedOptimizer(*args, **kwargs):  # noqa: N802 (Horovod's name)
    """Not supported: pipesgd's methods synchronize every parameter of the model."""
    raise NotImplementedError("pipesgd.torch.PartialDistributedOptimizer is not supported: every parameter given to "
                              "DistributedOptimizer is synchronized (give named_parameters= only the shared ones and "
                              "step the local ones with their own torch.optim optimizer)")


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization whose batch statistics are over every worker's batch (Horovod's
    hvd.SyncBatchNorm): in training, each worker's sum, sum of squares and count are allreduced
    (differentiable, so gradients flow through the global statistics); in evaluation, the running
    statistics as in torch.nn.BatchNorm."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or size() == 1:
            return super().forward(input)
        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        count = torch.tensor([input.numel() / channels], dtype=input.dtype)
        stats = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        total = allreduce(stats, op=Sum, name=None)
        n = total[-1]
        mean = total[:channels] / n
        var = total[channels:2 * channels] / n - mean * mean
        if self.track_running_stats and self.running_mean is not None:
            momentum = self.momentum if self.momentum is not None else 0.1
            with torch.no_grad():
                self.num_batches_tracked += 1
                self.running_mean.mul_(1 - momentum).add_(mean.detach() * momentum)
                self.running_var.mul_(1 - momentum).add_(var.detach() * (n / max(n - 1, 1)) * momentum)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (input - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + self.eps)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out
