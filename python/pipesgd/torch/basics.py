"""The world (Horovod's basics): init, shutdown, rank, size, local_rank, local_size, cross_rank,
cross_size, is_worker, is_homogeneous, what the build has (mpi_built, nccl_built, ...), the methods
available, and Horovod's timeline (start_timeline, stop_timeline).

init() joins MPI_COMM_WORLD (under mpirun/pipesgdrun) or a world of one, and fills the shared
state of _runtime.py; shutdown() finishes every DistributedOptimizer still alive and leaves it.
"""

import atexit
import os
import socket
import sys
import weakref
import zlib

import torch

from pipesgd import _C
from pipesgd.torch._runtime import _handles, _state, _under_launcher, _worker
from pipesgd.torch.mpi_ops import _now, add_process_set
from pipesgd.torch.process_sets import ProcessSet, global_process_set


_DEFAULT_TIMEOUT_SECONDS = 120.0


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
    """The methods a DistributedOptimizer's method= takes: dicts with name, summary and the registry's traits
    (uses_servers, replicas_identical, compute_alone, stale_without_compensation, needs_forward_hooks)."""
    return _C.available_methods()


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
