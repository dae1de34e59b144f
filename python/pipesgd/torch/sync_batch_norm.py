"""Horovod's SyncBatchNorm: batch normalization over every worker's batch."""

import torch

from pipesgd.torch.basics import size
from pipesgd.torch.mpi_ops import Sum, allreduce


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
