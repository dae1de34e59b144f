"""The state every module of pipesgd.torch shares (private): the world this process joined (the
C++ Session, this worker's engine handle ``_state.worker``, what init() learned), the table of
collective handles, and whether this thread waits for the collectives it submits.

basics.py sets it (init, shutdown); the others read it through ``_worker()``. Nothing here imports
another module of the package.
"""

import os
import threading
import weakref


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


def _under_launcher():
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ or "PMIX_RANK" in os.environ


def _worker():
    if _state.worker is None:
        raise ValueError("pipesgd.torch has not been initialized; use hvd.init().")
    return _state.worker


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


class _ThisThread(threading.local):
    caller_waits = False  # set by _blocking


_this_thread = _ThisThread()
