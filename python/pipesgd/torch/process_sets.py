"""Horovod's process sets: ``ProcessSet`` and ``global_process_set`` (every worker), and how a
collective's ``process_set=`` becomes the C++ engine's set id. Registering and removing a set are
collectives: ``add_process_set`` and ``remove_process_set`` are in mpi_ops.py.
"""

from pipesgd.torch._runtime import _worker


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
        if _worker().rank not in ranks:
            raise ValueError(f"rank {_worker().rank} is not in {self!r}")
        return ranks.index(_worker().rank)

    def included(self):
        return _worker().rank in self._ranks()

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks and \
            self.process_set_id == other.process_set_id

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet()
global_process_set.process_set_id = 0


def _set_id(process_set, call):
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{call}: process_set must be a ProcessSet (hvd.add_process_set), got {process_set!r}")
    if process_set.process_set_id is None:
        raise ValueError(f"{call}: process set {process_set!r} is not registered (hvd.add_process_set) or was removed")
    return process_set.process_set_id


def _members(process_set):
    return _worker().process_set_ranks(_set_id(process_set, "process set"))
