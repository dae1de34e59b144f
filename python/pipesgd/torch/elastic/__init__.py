"""hvd.elastic: Horovod Elastic's Python API (run, State, ObjectState, TorchState, ElasticSampler) as
"relaunch and resume from the newest commit".

Open MPI ends the whole job when one rank dies, so a world cannot be mended in the processes that
are left. `pipesgdrun --restarts R -np N ...` launches the failed job again (up to R times; every
rank sees PIPESGD_RESTART = k on the k-th relaunch) and hvd.elastic resumes it:

* state.commit() keeps the state in memory (restore() goes back to it) and rank 0 writes it to
  this job's commit file (state.py: $PIPESGD_ELASTIC_DIR, default ./.pipesgd-elastic).
* @hvd.elastic.run: on a relaunch, rank 0 loads the persisted commit into the state and prints
  one line; then every rank runs the reset callbacks, takes rank 0's state (sync) and calls the
  training function. On the first launch: sync, then the function (a commit file this job left
  earlier is removed). A peer failure (hvd.HorovodInternalError: pipesgd.CommError,
  PeerFailedError, CommTimeoutError) ends the process with exit status 1 after one line, so that
  pipesgdrun relaunches the job; any other exception goes up unchanged. When the function returns,
  rank 0 removes the commit file.
* check_host_updates() never raises: the world never changes in place.
"""

import functools
import sys

from pipesgd.torch._runtime import _state
from pipesgd.torch.basics import rank, size
from pipesgd.torch.elastic.sampler import ElasticSampler
from pipesgd.torch.elastic.state import (LRSchedulerStateHandler, ModelStateHandler, ObjectState,
                                         OptimizerStateHandler, SamplerStateHandler, State, StateHandler, TorchState,
                                         commit_path, get_handler_registry, restart_number, set_handler_registry)
from pipesgd.torch.elastic.state import _environment_integer
from pipesgd.torch.functions import broadcast_object
from pipesgd.torch.mpi_ops import HorovodInternalError, HostsUpdatedInterrupt

_FAILED_EXIT_STATUS = 1


def _say(line):
    print(f"pipesgd.elastic: {line}", file=sys.stderr, flush=True)


def _resume(state, restart, restarts):
    """A relaunch: rank 0 loads the persisted commit (if any) into `state` and says so."""
    found = None
    if rank() == 0:
        snapshot = state._read_persisted()
        if snapshot is not None:
            written_by = int(snapshot.get("world_size", size()))
            state._load_snapshot(snapshot["state"], same_world=written_by == size())
            found = {"what": state._describe() if hasattr(state, "_describe") else "its last commit",
                     "world_size": written_by}
    found = broadcast_object(found)  # every rank learns the outcome (and waits for rank 0's load)
    if rank() == 0:
        if found is None:
            _say(f"restart {restart} of {restarts}: no commit in {state._commit_path}: starting from the beginning")
        else:
            world = "" if found["world_size"] == size() else \
                f" (written by {found['world_size']} ranks, now {size()}: the method's own state starts afresh)"
            _say(f"restart {restart} of {restarts}: resumed from the commit at {found['what']}{world}")


def _end_launch(error):
    """A peer failed: this process cannot go on in this world; end it so that pipesgdrun relaunches."""
    restart, restarts = restart_number(), _environment_integer("PIPESGD_RESTARTS")
    reason = f"{type(error).__name__}: {error}".splitlines()[0]
    then = f"pipesgdrun relaunches the job (restart {restart + 1} of {restarts})" if restart < restarts else \
        "no relaunch is left (pipesgdrun --restarts R relaunches a failed job)"
    _say(f"rank {rank()}: {reason}; ending this launch (exit status {_FAILED_EXIT_STATUS}): {then}")
    if _state.session is not None and not _state.failed:
        _state.failed = True  # as an uncaught exception: peers' waits fail at once, no shutdown at exit
        _state.session.fail(reason)
    sys.exit(_FAILED_EXIT_STATUS)


def run(func):
    """Decorator of the training function `func(state, ...)` (Horovod's hvd.elastic.run).

    On a relaunch by pipesgdrun --restarts (PIPESGD_RESTART > 0), resumes `state` from the job's
    persisted commit (rank 0 prints "pipesgd.elastic: restart k of R: resumed from the commit at
    epoch E batch B") and runs its reset callbacks; then, on every launch, every rank takes rank 0's
    state (state.sync()) and calls func. A peer failure (hvd.HorovodInternalError) ends the process
    with exit status 1 after one line, for pipesgdrun to relaunch the job; a HostsUpdatedInterrupt
    the function raises resets and calls it again (Horovod's rule); other exceptions propagate. When
    func returns, rank 0 removes the persisted commit and its result is returned.
    """
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        restart = restart_number()
        restarts = _environment_integer("PIPESGD_RESTARTS")
        if restart > 0:
            _resume(state, restart, restarts)
            state.on_reset()
        elif rank() == 0:
            state._remove_persisted()  # what an earlier job of this command line left
        skip_sync = False
        while True:
            if not skip_sync:
                state.sync()
                state.save()  # every rank's restore() point is the state it starts from
            try:
                result = func(state, *args, **kwargs)
            except HorovodInternalError as error:
                _end_launch(error)
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = bool(interrupt.skip_sync)
                state.on_reset()
                continue
            if rank() == 0:
                state._remove_persisted()
            return result
    return wrapper


__all__ = [
    "run", "State", "ObjectState", "TorchState", "ElasticSampler", "StateHandler", "ModelStateHandler",
    "OptimizerStateHandler", "LRSchedulerStateHandler", "SamplerStateHandler", "get_handler_registry",
    "set_handler_registry", "commit_path", "HorovodInternalError", "HostsUpdatedInterrupt",
]
