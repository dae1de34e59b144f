"""The state objects of hvd.elastic (Horovod Elastic's names): State, ObjectState, TorchState and
the handlers TorchState keeps its models, optimizers, schedulers and ElasticSamplers with.

pipesgd's world never changes in place (Open MPI ends the whole job when a rank dies; `pipesgdrun
--restarts R` launches it again), so a commit is kept twice: in memory (restore() goes back to it)
and in a file that survives the job, which the relaunched job resumes from (hvd.elastic.run).
The file: $PIPESGD_ELASTIC_DIR (default ./.pipesgd-elastic), one per job (its name from the
script's name and a hash of the working directory and command line), written by rank 0 alone
with one torch.save to a temporary file and an os.replace (a reader sees the previous commit or
this one, never a part), with the world size it was written by.

A TorchState commits the random number generators too (beyond Horovod, whose TorchState does
not): each rank's torch default (CPU) generator, Python's `random` and, when the script has
imported numpy, numpy's global generator, gathered from every rank at each commit. restore() and a
relaunch of the same world size put each rank's own back, so dropout and any other draw go on from
the commit as in the uninterrupted run; a commit of another world size leaves them as the script
seeded them.

Testing hook: PIPESGD_ELASTIC_KILL=rank=R,commit=N makes rank R SIGKILL itself at the end of its
N-th commit of the first launch (PIPESGD_RESTART 0 or unset), as `pipesgd train --inject-fault`:
every rank reads the variable and waits at that commit (a barrier) until rank 0 has persisted it,
so the relaunch resumes from commit N.
"""

import copy
import hashlib
import io
import json
import os
import random
import signal
import sys

import torch

from pipesgd.torch.basics import rank, size
from pipesgd.torch.elastic.sampler import ElasticSampler
from pipesgd.torch.functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from pipesgd.torch.mpi_ops import barrier
from pipesgd.torch.optimizer import _DistributedOptimizer

_FORMAT = 1
_KILL_VARIABLE = "PIPESGD_ELASTIC_KILL"


def _environment_integer(name, default=0):
    text = os.environ.get(name, "")
    if text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={text!r}: expected an integer >= 0 (pipesgdrun --restarts sets it)")
    return value


def restart_number():
    """This launch's number: 0 for the first launch, k for pipesgdrun's k-th relaunch ($PIPESGD_RESTART)."""
    return _environment_integer("PIPESGD_RESTART")


def _kill_request():
    """(rank, commit) from $PIPESGD_ELASTIC_KILL, or None. A malformed value is a ValueError."""
    text = os.environ.get(_KILL_VARIABLE)
    if text is None or text.strip() == "":
        return None
    fields = {}
    for part in text.split(","):
        key, equals, value = part.strip().partition("=")
        if not equals or key in fields:
            fields = None
            break
        fields[key] = value.strip()
    try:
        if fields is None or set(fields) != {"rank", "commit"}:
            raise ValueError
        target_rank, commit = int(fields["rank"]), int(fields["commit"])
        if target_rank < 0 or commit < 1:
            raise ValueError
    except ValueError:
        raise ValueError(f"{_KILL_VARIABLE}={text!r}: expected rank=R,commit=N with integers R >= 0 and N >= 1 (a "
                         f"testing hook: rank R kills itself at its N-th commit of the first launch)") from None
    return target_rank, commit


_commits_this_process = 0


def _count_commit(kill_request):
    """Counts this process's commits; at the one PIPESGD_ELASTIC_KILL names, SIGKILLs this process."""
    global _commits_this_process
    _commits_this_process += 1
    if kill_request is None or restart_number() != 0:
        return
    target_rank, commit = kill_request
    if _commits_this_process != commit:
        return
    # Every rank waits until rank 0 has persisted this commit, so the relaunch resumes from it (not,
    # by a race with mpirun ending the job, from the one before).
    barrier()
    if rank() == target_rank:
        print(f"pipesgd.elastic: {_KILL_VARIABLE}: rank {target_rank} kills itself (SIGKILL) at its commit {commit}",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def commit_path():
    """The file this job's commits persist to: $PIPESGD_ELASTIC_DIR (default ./.pipesgd-elastic)
    / <script>-<hash of the working directory and the command line>.pt."""
    directory = os.environ.get("PIPESGD_ELASTIC_DIR") or os.path.join(os.getcwd(), ".pipesgd-elastic")
    argv = list(sys.argv) if sys.argv else [""]
    job = hashlib.sha1(json.dumps([os.getcwd()] + argv).encode()).hexdigest()[:12]
    stem = os.path.splitext(os.path.basename(argv[0]))[0] or "python"
    return os.path.join(os.path.abspath(directory), f"{stem}-{job}.pt")


def _default_directory_of(path):
    return os.path.dirname(path) == os.path.join(os.getcwd(), ".pipesgd-elastic")


class State:
    """What a training process commits, restores and synchronizes (Horovod's State).

    bcast_object(obj) broadcasts from rank 0, get_rank() is this worker's rank (defaults:
    hvd.broadcast_object, hvd.rank). Subclasses give save(), restore(), sync() and, to persist
    (ObjectState and TorchState do), _snapshot() / _load_snapshot()."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object if bcast_object is not None else broadcast_object
        self._rank = get_rank if get_rank is not None else rank
        self._reset_callbacks = []
        self._kill_request = _kill_request()
        self._commit_path = commit_path()

    def register_reset_callbacks(self, callbacks):
        """Functions to call after a reset (in pipesgd: when a relaunched job has resumed), before the
        state is synchronized; e.g. to scale the learning rate by hvd.size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res=None):
        """Horovod's driver notification: pipesgd has no driver that sends one; ignored."""

    def commit(self):
        """save() in memory, then rank 0 persists the state to this job's commit file (see
        commit_path()), then check_host_updates(). Every worker calls it at the same point (a state
        holding an ElasticSampler gathers the workers' processed indices)."""
        self.save()
        self._persist()
        _count_commit(self._kill_request)
        self.check_host_updates()

    def check_host_updates(self):
        """Horovod raises HostsUpdatedInterrupt here when hosts were added or removed. pipesgd's world
        never changes in place (a failed job is relaunched whole by pipesgdrun --restarts), so this
        returns without raising and without communicating."""

    def save(self):
        """Copies the state in memory (the commit restore() goes back to)."""
        raise NotImplementedError()

    def restore(self):
        """Goes back to the last in-memory commit."""
        raise NotImplementedError()

    def sync(self):
        """Every worker takes rank 0's state."""
        raise NotImplementedError()

    def reset(self):
        """Called by on_reset(), before the reset callbacks."""

    def _snapshot(self):
        """The last commit as a torch.save-able dict, or None (nothing to persist)."""
        return None

    def _load_snapshot(self, snapshot, same_world):
        raise NotImplementedError()

    def _persist(self):
        if self._rank() != 0:
            return
        snapshot = self._snapshot()
        if snapshot is None:
            return
        snapshot = {"format": _FORMAT, "world_size": size(), "restart": restart_number(), "state": snapshot}
        path = self._commit_path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        buffer = io.BytesIO()  # serialized in memory, then written with one call (cheaper than torch.save to a file)
        torch.save(snapshot, buffer)
        temporary = path + ".tmp"
        with open(temporary, "wb") as f:
            f.write(buffer.getbuffer())
        os.replace(temporary, path)

    def _read_persisted(self):
        """The persisted commit of this job (rank 0), or None."""
        try:
            snapshot = torch.load(self._commit_path, map_location="cpu")
        except FileNotFoundError:
            return None
        if not isinstance(snapshot, dict) or snapshot.get("format") != _FORMAT:
            raise ValueError(f"pipesgd.elastic: {self._commit_path}: not a commit of this pipesgd "
                             f"(format {snapshot.get('format') if isinstance(snapshot, dict) else '?'}, "
                             f"expected {_FORMAT})")
        return snapshot

    def _remove_persisted(self):
        for path in (self._commit_path, self._commit_path + ".tmp"):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        if _default_directory_of(self._commit_path):
            try:
                os.rmdir(os.path.dirname(self._commit_path))
            except OSError:
                pass  # other jobs' commits are there, or it is gone


class ObjectState(State):
    """Plain Python values as attributes (Horovod's ObjectState): each keyword argument becomes an
    attribute; save() copies their current values, restore() puts the copies back, sync() takes
    rank 0's (broadcast_object). They must pickle (they are broadcast and persisted)."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def _snapshot(self):
        return {"objects": self._saved_state}

    def _load_snapshot(self, snapshot, same_world):
        # Its own values only: a subclass's handlers have loaded theirs (with same_world) already.
        self._saved_state = dict(snapshot["objects"])
        self._set_attrs()

    def _describe(self):
        """The committed plain values for the resume line, e.g. 'epoch 3 batch 17'."""
        shown = [f"{name} {value}" for name, value in self._saved_state.items()
                 if isinstance(value, (bool, int, float, str)) and not name.startswith("_")]
        return " ".join(shown) if shown else "its last commit"


class StateHandler:
    """Keeps one object of a TorchState (Horovod's StateHandler): save() copies its state,
    restore() loads the copy, sync() takes rank 0's; saved()/load_saved() are what is persisted."""

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def set_value(self, value):
        self.value = value
        self.save()

    def saved(self):
        raise NotImplementedError()

    def load_saved(self, saved, same_world):
        raise NotImplementedError()


class _StateDictHandler(StateHandler):
    """An object with state_dict()/load_state_dict(): a deep copy of its state_dict is the commit."""

    def __init__(self, value):
        super().__init__(value)
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def saved(self):
        return self._saved

    def load_saved(self, saved, same_world):
        self._saved = saved
        self.restore()


class ModelStateHandler(_StateDictHandler):
    """A torch.nn.Module: its state_dict (parameters and buffers), loaded in place."""

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    """A torch.optim optimizer, or hvd.DistributedOptimizer (its state_dict holds the method's state
    under "pipesgd": the method's updates in flight, its step, codec residuals). The method's state
    loads into an optimizer that has not stepped yet (a relaunched process: restored bit for bit);
    after the optimizer has stepped, restore() rolls back the wrapped optimizer's state (momentum
    buffers, param_groups) and the method's own goes on. A commit written by another world size
    restores the wrapped optimizer's state only (the method's state belongs to its world size)."""

    def __init__(self, optimizer):
        if isinstance(optimizer, _DistributedOptimizer) and optimizer.fused_update:
            raise ValueError("hvd.elastic.TorchState: this DistributedOptimizer keeps its update's state inside its "
                             "method (fused_update=True or a parameter-server method), which cannot be committed "
                             "between steps; use the default fused_update=False with a worker-only method")
        super().__init__(optimizer)

    def restore(self):
        self._load(self._saved, same_world=True)

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)

    def load_saved(self, saved, same_world):
        self._saved = saved
        self._load(saved, same_world)

    def _load(self, state, same_world):
        optimizer = self.value
        if isinstance(optimizer, _DistributedOptimizer) and "pipesgd" in state:
            if same_world and optimizer.iteration == 0:
                optimizer.load_state_dict(state)  # parameters, the method's state and step too
                return
            state = {key: value for key, value in state.items() if key != "pipesgd"}
            optimizer._wrapped_class.load_state_dict(optimizer, state)
            return
        optimizer.load_state_dict(state)


class LRSchedulerStateHandler(_StateDictHandler):
    """A torch.optim.lr_scheduler scheduler: its state_dict."""

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


class SamplerStateHandler(StateHandler):
    """An ElasticSampler: its epoch and the world's processed indices. save() gathers the indices
    every worker recorded since the last commit (one allgather_object), so each worker's copy, and
    the persisted one, is the world's."""

    def __init__(self, sampler):
        super().__init__(sampler)
        self._saved = copy.deepcopy(self.value.state_dict())

    def save(self):
        sampler = self.value
        for recorded in allgather_object(sorted(sampler._take_recorded_since_commit())):
            sampler.processed_indices.update(recorded)
        self._saved = copy.deepcopy(sampler.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))

    def saved(self):
        return self._saved

    def load_saved(self, saved, same_world):
        self._saved = saved
        self.restore()


class _RandomStates:
    """The random number generators of every rank, kept by a TorchState: torch's default (CPU)
    generator, Python's `random` and, when numpy is imported, numpy's global generator.

    save() reads this rank's (reading draws nothing) and gathers every rank's (one
    allgather_object, so rank 0 persists the world's); restore() puts this rank's back.
    load_saved() (rank 0, on a relaunch) keeps the persisted world's for the next sync(), which
    hands each rank its own (one broadcast_object). sync() does not make the ranks' generators
    equal: a script may seed each rank differently on purpose."""

    def __init__(self):
        self._own = self._read()
        self._world = None  # every rank's, in rank order, as of the last save()
        self._pending = None  # rank 0 after load_saved(): the persisted world's, until sync()

    @staticmethod
    def _read():
        states = {"torch": torch.get_rng_state(), "random": random.getstate()}
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            states["numpy"] = numpy.random.get_state()
        return states

    @staticmethod
    def _apply(states):
        torch.set_rng_state(states["torch"])
        random.setstate(states["random"])
        numpy = sys.modules.get("numpy")
        if numpy is not None and "numpy" in states:
            numpy.random.set_state(states["numpy"])

    def save(self):
        self._own = self._read()
        self._world = allgather_object(self._own)

    def restore(self):
        self._apply(self._own)

    def sync(self):
        pending, self._pending = broadcast_object(self._pending), None
        if pending is not None and rank() < len(pending):
            self._own = pending[rank()]
            self._apply(self._own)

    def saved(self):
        return self._world

    def load_saved(self, saved, same_world):
        if saved is None or not same_world or len(saved) != size():
            return  # another world's generators: each rank keeps what its script seeded
        self._pending = list(saved)
        self._own = self._pending[rank()]
        self._apply(self._own)


def _scheduler_classes():
    classes = [torch.optim.lr_scheduler._LRScheduler]
    if hasattr(torch.optim.lr_scheduler, "LRScheduler"):
        classes.append(torch.optim.lr_scheduler.LRScheduler)
    return tuple(classes)


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (_scheduler_classes(), LRSchedulerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handler(value):
    for kind, handler_class in _handler_registry:
        if isinstance(value, kind):
            return handler_class(value)
    return None


class TorchState(ObjectState):
    """A PyTorch training's state (Horovod's TorchState): `model`, `optimizer` and every keyword
    argument become attributes; models, optimizers, lr schedulers and ElasticSamplers are kept by
    their handlers (state_dicts), the rest as ObjectState values (state.epoch, state.batch). Each
    rank's random number generators are committed too (see _RandomStates; Horovod's are not)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, objects = {}, {}
        for name, value in kwargs.items():
            handler = _get_handler(value)
            if handler is None:
                objects[name] = value
            else:
                handlers[name] = handler
        self._handlers = handlers
        self._random_states = _RandomStates()
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(**objects)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        self._random_states.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        self._random_states.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        self._random_states.sync()
        super().sync()

    def _snapshot(self):
        snapshot = super()._snapshot()
        snapshot["handlers"] = {name: handler.saved() for name, handler in self._handlers.items()}
        snapshot["random_states"] = self._random_states.saved()
        return snapshot

    def _load_snapshot(self, snapshot, same_world):
        saved = snapshot.get("handlers", {})
        missing = sorted(set(self._handlers) - set(saved))
        if missing:
            raise ValueError(f"pipesgd.elastic: the persisted commit has no {', '.join(missing)} (it was written by "
                             f"a state with {', '.join(sorted(saved)) or 'none of them'})")
        for name, handler in self._handlers.items():
            handler.load_saved(saved[name], same_world)
        self._random_states.load_saved(snapshot.get("random_states"), same_world)  # absent in older commits
        super()._load_snapshot(snapshot, same_world)
