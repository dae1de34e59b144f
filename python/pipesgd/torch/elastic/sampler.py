"""hvd.elastic.ElasticSampler: a DistributedSampler that remembers which examples of the epoch were
processed, so that after a relaunch the rest of the epoch is shared out over the workers again.

Each epoch's order is one permutation of the whole dataset (torch.randperm seeded with seed +
epoch, the same on every worker; or 0..n-1 with shuffle=False). The examples not yet recorded as
processed keep that order and are dealt round robin to the workers: worker r takes positions r,
r + W, r + 2W, ... (W = hvd.size()), the list padded from its own beginning to a multiple of W as
DistributedSampler does. Within an epoch no example is dropped and none repeats, apart from those
at most W - 1 pads per pass.

A TorchState holding the sampler (a keyword argument) keeps its state: commit() gathers every
worker's newly recorded indices (one allgather_object), so the committed set is the world's;
restore() and a relaunch's resume load it, and reset() shares the rest out over the current world.
"""

import math

import torch

from pipesgd.torch.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions `dataset` over the workers and, after a reset, partitions what the epoch has not
    processed yet. Record what was processed with record_batch() (or record_indices()) after each
    batch; call set_epoch() when an epoch ends (it forgets the processed set)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.processed_indices = set()   # this worker's view: the world's at the last commit, plus its own since
        self._recorded_since_commit = set()
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices = []
        self.indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        """Begins epoch `epoch`: a new order, and no example processed yet. Call it when an epoch
        ends (or before the first), not at the start of each pass: a resumed epoch keeps its
        processed set."""
        self.epoch = int(epoch)
        self.processed_indices = set()
        self._recorded_since_commit = set()
        self.reset()

    def get_indices(self, batch_idx, batch_size):
        """This worker's dataset indices of batch `batch_idx` (of `batch_size`) of the current pass."""
        start = int(batch_idx) * int(batch_size)
        return self.indices[start:min(start + int(batch_size), len(self.indices))]

    def record_batch(self, batch_idx, batch_size):
        """Records this worker's batch `batch_idx` (of `batch_size`) of the current pass as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        """Records dataset `indices` as processed."""
        new = {int(i) for i in indices}
        self.processed_indices.update(new)
        self._recorded_since_commit.update(new)

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = {int(i) for i in state_dict["processed_indices"]}
        self._recorded_since_commit = set()
        self.reset()

    def reset(self):
        """Shares the epoch's unprocessed examples out over the current world (hvd.size(), hvd.rank())."""
        self.num_replicas = size()
        self.rank = rank()
        n = len(self.dataset)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=generator).tolist()
        else:
            order = list(range(n))
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        dealt = list(self.remaining_indices)
        while dealt and len(dealt) < self.total_size:  # pads from the beginning (W - 1 at most)
            dealt += dealt[:self.total_size - len(dealt)]
        self.indices = dealt[self.rank:self.total_size:self.num_replicas]

    def _take_recorded_since_commit(self):
        taken, self._recorded_since_commit = self._recorded_since_commit, set()
        return taken

    def __iter__(self):
        return iter(list(self.indices))

    def __len__(self):
        return self.num_samples
