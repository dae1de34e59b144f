"""Every worker-only pipesgd method through hvd.DistributedOptimizer (run with 2 ranks).

A module with Conv2d, BatchNorm2d, Dropout, Embedding (an embedding of a per-sample class id
added to the convolution's features) and a Linear head trains a few steps with each method spec;
the losses stay finite, and for the methods whose replicas are identical
(hvd.available_methods()[...]["replicas_identical"]) every rank holds the same parameters after
opt.finish(). Small profiling options (profile_iters=2, stale_layers=1, buckets="wfbp") make the
layer-wise and SAPipe methods reach their pipelined phase within the few steps.
"""
import contextlib
import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import pipesgd.torch as hvd
from psgd_testlib import assert_same_on_every_rank, flat, relative_error

hvd.init(timeout=60)
torch.set_num_threads(1)

R = hvd.rank()
N = hvd.size()
BATCH = 8
CLASSES = 5
METHODS = {m["name"]: m for m in hvd.available_methods()}


class MixedNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(0.2)
        self.embedding = torch.nn.Embedding(CLASSES, 4)
        self.head = torch.nn.Linear(4 * 6 * 6, 3)

    def forward(self, x, ids):
        h = torch.relu(self.bn(self.conv(x)))
        h = h + self.embedding(ids)[:, :, None, None]  # the sample's class embedding, on every pixel
        h = self.drop(h)
        return self.head(h.flatten(1))


# (spec, steps, method keyword arguments)
SPECS = [
    ("dsync", 4, {}),
    ("dsync+int8", 4, {}),
    ("dsync+bf16", 4, {}),
    ("dsync+optimal", 6, {"profile_iters": 2}),
    ("dsync+fixed:1", 4, {}),
    ("wfbp", 6, {"profile_iters": 2}),
    ("mgwfbp", 6, {"profile_iters": 2}),
    ("synceasgd", 6, {"profile_iters": 2}),
    ("pipe", 4, {}),
    ("nocomm", 4, {}),  # compute alone: replicas drift apart, so only the finite losses are checked
    ("pipe+int8", 4, {}),
    ("pipe+bf16", 4, {}),
    ("sapipe", 12, {"profile_iters": 2}),  # k auto and the optimal plan: pipelined from iteration 10
    ("sapipe+wp3", 6, {"stale_layers": 1, "buckets": "wfbp"}),
    ("sapipe+dc", 6, {"stale_layers": 1, "buckets": "wfbp"}),
    ("sapipe+none", 6, {"stale_layers": 1, "buckets": "wfbp"}),
    ("sapipe+wp1+int8", 6, {"stale_layers": 1, "buckets": "wfbp"}),
    ("auto:any", 14, {"profile_iters": 2}),  # profiles iterations 8-9, runs its choice from 10
]

_final_weights = {}  # spec -> this rank's weights after finish() (for the staleness checks)


def batches(steps, seed):
    """This rank's batches: images, class ids and labels (different on every rank)."""
    generator = torch.Generator().manual_seed(seed * 100 + R)
    for _ in range(steps):
        ids = torch.randint(0, CLASSES, (BATCH,), generator=generator)
        yield torch.randn(BATCH, 1, 6, 6, generator=generator), ids, ids % 3


def method_name(spec):
    """The method a spec names: "pipe+int8" -> "pipe", "auto:any" -> "auto"."""
    return re.split(r"[+:]", spec)[0]


def predicts_weights(spec):
    """SAPipe's weight prediction (its default, wp3, and wp1/wp2) needs the method's own update rule."""
    parts = spec.split("+")
    return parts[0] == "sapipe" and not any(p in ("dc", "none") for p in parts[1:])


def train(spec, steps, compression=hvd.Compression.none, give_model=False, **options):
    torch.manual_seed(4321 + R)  # different initial weights: the optimizer broadcasts rank 0's
    model = MixedNet()
    kwargs = {"model": model} if give_model else {}
    if predicts_weights(spec):
        kwargs["fused_update"] = True
    # The fused SAPipe wants model= for its forward hooks.
    warns = spec.startswith("sapipe") and not give_model and kwargs.get("fused_update", False)
    with pytest.warns(UserWarning, match="model=") if warns else contextlib.nullcontext():
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),
                                       named_parameters=model.named_parameters(), compression=compression,
                                       method=spec, **kwargs, **options)
    assert opt.method == spec
    torch.manual_seed(77 + R)  # dropout masks
    model.train()
    losses = []
    for x, ids, y in batches(steps, seed=1):
        opt.zero_grad()
        loss = F.cross_entropy(model(x, ids), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert opt.iteration == steps
    opt.finish()
    assert all(math.isfinite(v) for v in losses), f"{spec}: losses {losses}"
    weights = flat(model.parameters())
    assert torch.isfinite(weights).all()
    base = method_name(spec)
    if METHODS[base]["replicas_identical"]:
        assert_same_on_every_rank(hvd, weights, f"{spec}: parameters after finish()")
    return model, weights


@pytest.mark.parametrize("spec,steps,options", SPECS, ids=[s for s, _, _ in SPECS])
def test_method_trains(spec, steps, options):
    _, weights = train(spec, steps, **options)
    _final_weights[spec] = weights


def test_every_worker_only_method_was_run():
    ran = {method_name(spec) for spec in _final_weights}
    worker_only = {name for name, m in METHODS.items() if not m["uses_servers"]}
    assert worker_only and worker_only <= ran


def test_stale_methods_differ_from_dsync():
    """The pipelined methods did pipeline: their weights differ from synchronous SGD's (same data,
    same dropout masks, same initial weights)."""
    _, reference = train("dsync", 6)
    for spec, options in (("pipe", {}), ("sapipe+none", {"stale_layers": 1, "buckets": "wfbp"})):
        _, weights = train(spec, 6, **options)
        assert relative_error(weights, reference) > 1e-4, f"{spec} trained exactly as dsync"
    # ... and a synchronous layer-wise method trains as dsync does (up to the sums' order).
    _, weights = train("wfbp", 6, profile_iters=2)
    assert relative_error(weights, reference) < 1e-5


def test_fp16_compression_is_the_bf16_codec():
    train("pipe", 4, compression=hvd.Compression.fp16)
    _, fp16 = train("dsync", 4, compression=hvd.Compression.fp16)
    _, bf16 = train("dsync+bf16", 4)
    assert torch.equal(fp16, bf16)
    model = MixedNet()
    with pytest.raises(ValueError, match="codec"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                 compression=hvd.Compression.fp16, method="pipe+int8")


def test_sapipe_with_model_forward_pre_hooks():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with model= there is nothing to warn about
        model, hooked = train("sapipe+wp3", 6, give_model=True, stale_layers=1, buckets="wfbp")
    assert all(len(m._forward_pre_hooks) == 1 for m in (model.conv, model.bn, model.embedding, model.head))
    # The hooks change when a synchronous layer's update is applied (just before its forward instead
    # of in step()), not what it is: the same run without model= ends with the same weights.
    _, unhooked = train("sapipe+wp3", 6, stale_layers=1, buckets="wfbp")
    assert relative_error(hooked, unhooked) < 1e-6


def test_sapipe_without_model_warns():
    torch.manual_seed(4321)
    model = MixedNet()
    with pytest.warns(UserWarning, match="model=your_module"):
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                       named_parameters=model.named_parameters(), method="sapipe+wp3",
                                       stale_layers=1, buckets="wfbp", fused_update=True)
    assert all(len(m._forward_pre_hooks) == 0 for m in model.modules())
    for x, ids, y in batches(6, seed=2):
        F.cross_entropy(model(x, ids), y).backward()
        opt.step()
    opt.finish()
    assert_same_on_every_rank(hvd, flat(model.parameters()), "sapipe+wp3 without model=")
