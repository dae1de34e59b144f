"""The same model and data through the C++ CLI and through pipesgd.torch end with the same weights
(run with 2 ranks; rank 0 also runs the CLI with 2 worker threads as a child process).

The model is a small MLP exported with torch.jit.script + save: the CLI trains the file
(--model PATH.pt), the Python side builds the same nn.Module and loads the file's weights. The
data set (npy:DIR) holds exactly workers x batch examples, so every iteration is one epoch and
its averaged gradient is the mean over the whole set, whichever worker got which example (the
CLI shuffles with its own permutation). The CLI's weights are read from its checkpoint after N
iterations (--checkpoint-every N; section "model.parameters"), Python's from opt.save_state() as
its N-th step (section "api.parameters"; the same container format): both are the state at the
boundary after iteration N-1, which for pipe excludes the K = 2 updates still in flight.
"""
import json
import os
import shutil
import struct
import tempfile
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pipesgd.torch as hvd
from psgd_testlib import CLI, flat, relative_error
from psgd_testlib import run as run_child

hvd.init(timeout=60)
torch.set_num_threads(1)

R = hvd.rank()
N = hvd.size()
BATCH = 4
STEPS = 5
LR = 0.1
FEATURES, HIDDEN, CLASSES = 6, 10, 4


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def read_checkpoint(data):
    """The sections of a pipesgd checkpoint file (format: src/pipesgd/core/checkpoint.h), by name:
    float32 -> numpy array, int64 -> int, string -> str, bytes -> bytes. Checks the trailer's length
    and CRC-32."""
    assert data[:8] == b"PSGDCKPT", data[:8]
    version, count, header = struct.unpack_from("<III", data, 8)
    assert (version, header) == (1, 20)
    total, crc = struct.unpack_from("<QI", data, len(data) - 12)
    assert total == len(data) and crc == zlib.crc32(data[:-4])
    sections, offset = {}, header
    for _ in range(count):
        (name_length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        name = data[offset:offset + name_length].decode("ascii")
        offset += name_length
        kind = data[offset]
        (length,) = struct.unpack_from("<Q", data, offset + 1)
        offset += 9
        offset += (-offset) % 8  # payloads start at multiples of 8
        payload = data[offset:offset + length]
        offset += length
        if kind == 1:
            sections[name] = np.frombuffer(payload, dtype="<f4").copy()
        elif kind == 3:
            sections[name] = struct.unpack("<q", payload)[0]
        elif kind == 4:
            sections[name] = payload.decode()
        else:
            sections[name] = bytes(payload)
    assert offset == len(data) - 12, "sections must end at the trailer"
    return sections


@pytest.fixture(scope="module")
def setup():
    """Rank 0 writes the TorchScript model and the npy data set into a directory every rank reads."""
    directory = tempfile.mkdtemp(prefix="pipesgd-cli-parity-") if R == 0 else None
    directory = hvd.broadcast_object(directory, root_rank=0)
    if R == 0:
        torch.manual_seed(31)
        torch.jit.script(MLP()).save(os.path.join(directory, "mlp.pt"))
        rng = np.random.default_rng(7)
        data = os.path.join(directory, "data")
        os.makedirs(data)
        np.save(os.path.join(data, "train_x.npy"), rng.standard_normal((N * BATCH, FEATURES)).astype(np.float32))
        np.save(os.path.join(data, "train_y.npy"), rng.integers(0, CLASSES, N * BATCH).astype(np.int64))
        np.save(os.path.join(data, "test_x.npy"), rng.standard_normal((4, FEATURES)).astype(np.float32))
        np.save(os.path.join(data, "test_y.npy"), np.arange(4, dtype=np.int64) % CLASSES)
    hvd.barrier()
    yield directory
    hvd.barrier()
    if R == 0:
        shutil.rmtree(directory, ignore_errors=True)


def cli_parameters(directory, method, checkpoint_at, iterations):
    """The CLI's rank-0 parameters in its checkpoint after `checkpoint_at` iterations (rank 0 runs
    the CLI; every rank gets the result)."""
    parameters = None
    if R == 0:
        out = os.path.join(directory, f"checkpoints-{method}-{checkpoint_at}")
        os.makedirs(out)
        result = run_child([CLI, "train", "--model", os.path.join(directory, "mlp.pt"),
                            "--data", "npy:" + os.path.join(directory, "data"), "--algo", method,
                            "--workers", str(N), "--transport", "local", "--batch", str(BATCH),
                            "--iters", str(iterations), "--lr", str(LR), "--momentum", "0",
                            "--checkpoint-dir", out, "--checkpoint-every", str(checkpoint_at),
                            "--no-eval", "--quiet"], timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        path = os.path.join(out, f"checkpoint-{checkpoint_at:012d}-rank0.psgd")
        with open(path, "rb") as f:
            sections = read_checkpoint(f.read())
        assert sections["next_iteration"] == checkpoint_at
        parameters = sections["model.parameters"]
    return torch.from_numpy(hvd.broadcast_object(parameters, root_rank=0))


def python_state(directory, method):
    """Python's state saved as its STEPS-th step, every rank training on its half of the set."""
    model = MLP()
    model.load_state_dict(torch.jit.load(os.path.join(directory, "mlp.pt")).state_dict())
    x = torch.from_numpy(np.load(os.path.join(directory, "data", "train_x.npy")))
    y = torch.from_numpy(np.load(os.path.join(directory, "data", "train_y.npy")))
    mine = slice(R * BATCH, (R + 1) * BATCH)
    # The fused path: the CLI's update, whose state is taken at the same point as the CLI's checkpoint.
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(), method=method, fused_update=True)
    state = None
    for step in range(STEPS):
        opt.zero_grad()
        F.cross_entropy(model(x[mine]), y[mine]).backward()
        if step < STEPS - 1:
            opt.step()
        else:
            state = read_checkpoint(opt.save_state())
    opt.finish()
    return state, model


def initial_parameters(directory):
    """The file's weights in forward order: fc1.weight, fc1.bias, fc2.weight, fc2.bias."""
    scripted = torch.jit.load(os.path.join(directory, "mlp.pt"))
    return flat([scripted.fc1.weight, scripted.fc1.bias, scripted.fc2.weight, scripted.fc2.bias]).float()


def test_both_flat_buffers_hold_the_layers_in_forward_order(setup):
    initial = initial_parameters(setup)
    # The CLI: pipe's checkpoint after 1 iteration holds the initial weights (no gradient applied yet).
    assert torch.equal(cli_parameters(setup, "pipe", checkpoint_at=1, iterations=2), initial)
    # Python: the state lists its layers in forward order, and its flat buffer is the module's parameters.
    state, model = python_state(setup, "pipe")
    assert json.loads(state["api.layers"]) == [["fc1", FEATURES * HIDDEN + HIDDEN], ["fc2", HIDDEN * CLASSES + CLASSES]]
    assert state["api.next_iteration"] == STEPS
    assert state["api.parameters"].shape == initial.shape


@pytest.mark.parametrize("method", ["dsync", "pipe"])
def test_cli_and_python_end_with_the_same_weights(setup, method):
    cli = cli_parameters(setup, method, checkpoint_at=STEPS, iterations=STEPS + 1)
    state, _ = python_state(setup, method)
    python = torch.from_numpy(state["api.parameters"])
    initial = initial_parameters(setup)
    assert relative_error(cli, initial) > 1e-3, "the CLI's training must move the weights"
    error = relative_error(python, cli)
    assert error <= 1e-5, f"{method}: relative error {error:.3g} between pipesgd.torch and the CLI"
