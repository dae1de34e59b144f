"""Helpers of the pipesgd.torch tests: paths, subprocess environments, comparisons across ranks."""
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("PIPESGD_SOURCE", os.path.dirname(os.path.dirname(HERE)))
BUILD = os.environ.get("PIPESGD_BUILD", os.path.join(SOURCE, "build"))
PYTHON = sys.executable  # /usr/bin/python3 (ctest runs the tests with it)
CLI = os.path.join(BUILD, "pipesgd")
PIPESGDRUN = os.path.join(BUILD, "python", "bin", "pipesgdrun")
MPIRUN = "mpirun"


def clean_env(**extra):
    """The environment for a child process started from a test: without the variables of the
    mpirun this test may run under (a child must not believe it is one of our ranks), with the
    package on PYTHONPATH, one OpenMP thread and mpirun allowed as root."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "OPAL_", "HYDRA_", "PRTE_"))}
    env["PYTHONPATH"] = os.path.join(BUILD, "python")
    env["OMP_NUM_THREADS"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env.update(extra)
    return env


def run(command, timeout=120, **kwargs):
    """subprocess.run with text output captured and the clean environment."""
    kwargs.setdefault("env", clean_env())
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


def flat(tensors):
    """One float64 vector of the tensors (parameters, buffers) in the given order."""
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def relative_error(actual, expected):
    actual = actual.detach().to(torch.float64).reshape(-1)
    expected = expected.detach().to(torch.float64).reshape(-1)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


def gathered_rows(hvd, vector):
    """Every worker's 1-D `vector` as the rows of a [size, n] tensor (allgather)."""
    return hvd.allgather(vector.detach().reshape(1, -1).contiguous())


def assert_same_on_every_rank(hvd, vector, what):
    rows = gathered_rows(hvd, vector)
    for r in range(1, rows.shape[0]):
        assert torch.equal(rows[r], rows[0]), f"{what}: rank {r} differs from rank 0 " \
                                              f"(max |diff| {float((rows[r] - rows[0]).abs().max())})"


class TwoLayerNet(torch.nn.Module):
    """The optimizer tests' model: 6 inputs, 16 hidden (ReLU), 3 classes."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def fresh_model(seed=1234):
    """A TwoLayerNet with the same initial weights on every rank and in every call."""
    torch.manual_seed(seed)
    return TwoLayerNet()


def global_batches(size, per_rank, steps, seed=99):
    """The same (inputs [size * per_rank, 6], labels in 0..2) for every step on every rank."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield (torch.randn(size * per_rank, 6, generator=generator),
               torch.randint(0, 3, (size * per_rank,), generator=generator))
