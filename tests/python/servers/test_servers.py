"""Parameter-server methods through hvd.DistributedOptimizer: mpirun -np 3, hvd.init(servers=1) in
conftest.py (2 workers, 1 server rank that serves inside init() and exits).

pssync is synchronous SGD on the servers (D-Sync's update up to the order of the float32
additions): its weights equal a single-process torch.optim.SGD on all the workers' samples, also
with a StepLR scheduler on the wrapped optimizer (the learning rate travels with each push). asgd,
dcasgd and odsgd run a few steps each with finite losses.
"""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import pipesgd.torch as hvd
from psgd_testlib import assert_same_on_every_rank, flat, relative_error

R = hvd.rank()
N = hvd.size()
B = 4
STEPS = 8


class TwoLayerNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 12)
        self.fc2 = torch.nn.Linear(12, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def fresh_model():
    torch.manual_seed(2024)
    return TwoLayerNet()


def global_batches(steps=STEPS, seed=5):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield torch.randn(N * B, 5, generator=generator), torch.randint(0, 3, (N * B,), generator=generator)


def train_distributed(model, opt, scheduler=None, steps=STEPS):
    losses = []
    for x, y in global_batches(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x[R * B:(R + 1) * B]), y[R * B:(R + 1) * B])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if scheduler is not None:
            scheduler.step()
    opt.finish()
    return losses


def train_oracle(model, opt, scheduler=None):
    for x, y in global_batches():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def test_world_has_two_workers_and_one_server():
    assert hvd.is_worker()
    assert N == 2, "run with mpirun -np 3: 2 workers and 1 server"
    assert hvd.allreduce(torch.tensor([R + 1.0]), op=hvd.Sum).item() == 3.0


def test_pssync_equals_sgd_oracle():
    model = fresh_model()
    oracle = copy.deepcopy(model)
    initial = flat(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                   named_parameters=model.named_parameters(), method="pssync")
    train_distributed(model, opt)
    train_oracle(oracle, torch.optim.SGD(oracle.parameters(), lr=0.2))
    expected = flat(oracle.parameters())
    assert relative_error(expected, initial) > 1e-3
    assert relative_error(flat(model.parameters()), expected) <= 1e-5
    assert_same_on_every_rank(hvd, flat(model.parameters()), "pssync weights")


def test_pssync_with_step_lr_scheduler_equals_oracle():
    model = fresh_model()
    oracle = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                   named_parameters=model.named_parameters(), method="pssync")
    train_distributed(model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.1))
    oracle_opt = torch.optim.SGD(oracle.parameters(), lr=0.2)
    train_oracle(oracle, oracle_opt, torch.optim.lr_scheduler.StepLR(oracle_opt, step_size=3, gamma=0.1))
    expected = flat(oracle.parameters())
    assert relative_error(flat(model.parameters()), expected) <= 1e-5
    # The schedule made a difference the servers had to follow.
    constant = fresh_model()
    train_oracle(constant, torch.optim.SGD(constant.parameters(), lr=0.2))
    assert relative_error(flat(constant.parameters()), expected) > 1e-3


@pytest.mark.parametrize("spec,options", [("asgd", {}), ("dcasgd", {}), ("odsgd", {"warmup_iters": 2})],
                         ids=["asgd", "dcasgd", "odsgd"])
def test_asynchronous_methods_train(spec, options):
    model = fresh_model()
    initial = flat(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), method=spec, **options)
    losses = train_distributed(model, opt, steps=6)
    weights = flat(model.parameters())
    assert all(math.isfinite(v) for v in losses), losses
    assert torch.isfinite(weights).all()
    assert relative_error(weights, initial) > 1e-4, f"{spec} did not move the weights"


def test_pssync_momentum_weight_decay_equals_sgd_oracle():
    def sgd(parameters):
        return torch.optim.SGD(parameters, lr=0.1, momentum=0.9, weight_decay=1e-2)

    model = fresh_model()
    oracle = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                                   method="pssync")
    train_distributed(model, opt)
    train_oracle(oracle, sgd(oracle.parameters()))
    assert relative_error(flat(model.parameters()), flat(oracle.parameters())) <= 1e-5


def test_servers_methods_refuse_save_state():
    """Last: the refused optimizer is left unusable (its servers' state is never finished)."""
    model = fresh_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), method="pssync")
    x, y = next(global_batches(1))
    F.cross_entropy(model(x[R * B:(R + 1) * B]), y[R * B:(R + 1) * B]).backward()
    with pytest.raises(ValueError):
        opt.save_state()
