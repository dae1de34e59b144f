"""Horovod's contract (run with 2 and 3 ranks): the wrapped optimizer applies the update to the gradient
the method hands over in p.grad; synchronize() leaves it readable and editable; state_dict() resumes.

Oracles: single-process torch.optim on the concatenated batch (synchronous methods: the average of
per-rank mean-loss gradients is the mean-loss gradient of all samples), and for Pipe-SGD the same
optimizer applying, at step t, the full-batch gradient of iteration t + 1 - K computed at the
weights that iteration ran on (finish() applies the last K - 1, in order).
"""
import copy
import io

import pytest
import torch
import torch.nn.functional as F

import pipesgd.torch as hvd
import psgd_testlib
from psgd_testlib import assert_same_on_every_rank, flat, fresh_model, relative_error

hvd.init(timeout=60)
torch.set_num_threads(1)

R = hvd.rank()
N = hvd.size()
B = 4
STEPS = 8
TOLERANCE = 1e-5
METHODS = {m["name"]: m for m in hvd.available_methods()}


def global_batches(steps=STEPS, seed=99):
    return psgd_testlib.global_batches(N, B, steps, seed)


def my_slice(x):
    return x[R * B:(R + 1) * B]


def adamw(parameters):
    return torch.optim.AdamW(parameters, lr=0.01, betas=(0.85, 0.99), weight_decay=0.05)


def no_decay_on_biases(model, kind=torch.optim.AdamW, **options):
    """The standard transformer recipe: two param groups, weight decay on the weights only."""
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return kind([{"params": weights, "weight_decay": 0.1}, {"params": biases, "weight_decay": 0.0}], **options)


# (id, optimizer factory, scheduler factory or None)
OPTIMIZERS = [
    ("adamw", adamw, None),
    ("sgd-nesterov", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3), None),
    ("rmsprop", lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9, momentum=0.5), None),
    ("asgd", lambda ps: torch.optim.ASGD(ps, lr=0.05), None),
    ("param-groups", None, None),  # no_decay_on_biases with AdamW
    ("adamw-cosine", adamw, lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)),
]


def make_optimizer(factory, model):
    return no_decay_on_biases(model, lr=0.01) if factory is None else factory(model.parameters())


def train_distributed(model, opt, scheduler=None, edit=None):
    for x, y in global_batches():
        opt.zero_grad()
        F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()
        if edit is None:
            opt.step()
        else:
            opt.synchronize()
            edit(model)
            with opt.skip_synchronize():
                opt.step()
        if scheduler is not None:
            scheduler.step()
    opt.finish()


def train_oracle(model, opt, scheduler=None, edit=None):
    for x, y in global_batches():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if edit is not None:
            edit(model)
        opt.step()
        if scheduler is not None:
            scheduler.step()


def check_against_oracle(model, oracle, tolerance=TOLERANCE):
    initial = flat(fresh_model().parameters())
    expected, weights = flat(oracle.parameters()), flat(model.parameters())
    assert relative_error(expected, initial) > 1e-3, "the oracle's training must move the weights"
    error = relative_error(weights, expected)
    assert error <= tolerance, f"relative error {error:.3g} against the single-process oracle"
    assert_same_on_every_rank(hvd, weights, "weights")


@pytest.mark.parametrize("name,factory,schedule", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_dsync_with_any_optimizer_equals_single_process(name, factory, schedule):
    model, oracle = fresh_model(), fresh_model()
    opt = hvd.DistributedOptimizer(make_optimizer(factory, model), named_parameters=model.named_parameters())
    assert not opt.fused_update
    train_distributed(model, opt, schedule(opt) if schedule else None)
    oracle_opt = make_optimizer(factory, oracle)
    train_oracle(oracle, oracle_opt, schedule(oracle_opt) if schedule else None)
    check_against_oracle(model, oracle)


@pytest.mark.parametrize("staleness", [1, 2, 3])
def test_pipe_with_adamw_equals_the_per_iteration_rule(staleness):
    model, oracle = fresh_model(), fresh_model()
    opt = hvd.DistributedOptimizer(adamw(model.parameters()), named_parameters=model.named_parameters(),
                                   method="pipe", staleness=staleness)
    train_distributed(model, opt)
    # The rule in one process: step t applies the gradient of iteration t + 1 - K.
    oracle_opt = adamw(oracle.parameters())
    gradients = []
    for t, (x, y) in enumerate(global_batches()):
        oracle_opt.zero_grad()
        F.cross_entropy(oracle(x), y).backward()
        gradients.append([p.grad.clone() for p in oracle.parameters()])
        applied = t + 1 - staleness
        if applied >= 0:
            for p, g in zip(oracle.parameters(), gradients[applied]):
                p.grad = g.clone()
            oracle_opt.step()
    for applied in range(max(STEPS + 1 - staleness, 0), STEPS):  # finish()
        for p, g in zip(oracle.parameters(), gradients[applied]):
            p.grad = g.clone()
        oracle_opt.step()
    check_against_oracle(model, oracle)


def worker_only_specs():
    """Every registered worker-only method; SAPipe with delay compensation (its weight prediction needs the
    method's own update rule: see test_sapipe_weight_prediction_needs_the_fused_update)."""
    specs = []
    for name, method in METHODS.items():
        if method["uses_servers"]:
            continue
        specs.append("sapipe+dc" if name == "sapipe" else name)
    return specs


SPEC_OPTIONS = {"dsync": {}, "pipe": {}, "nocomm": {}, "sapipe+dc": {"stale_layers": 1, "buckets": "wfbp"}}


def spec_options(spec):
    return SPEC_OPTIONS.get(spec, SPEC_OPTIONS.get(spec.split("+")[0], {"profile_iters": 2}))


@pytest.mark.parametrize("spec", worker_only_specs())
def test_every_worker_only_method_trains_with_adamw(spec):
    model = fresh_model()
    opt = hvd.DistributedOptimizer(adamw(model.parameters()), named_parameters=model.named_parameters(),
                                   method=spec, **spec_options(spec))
    train_distributed(model, opt)
    weights = flat(model.parameters())
    assert torch.isfinite(weights).all()
    assert relative_error(weights, flat(fresh_model().parameters())) > 1e-3, f"{spec}: AdamW did not move the weights"
    if METHODS[spec.split("+")[0]]["replicas_identical"]:
        assert_same_on_every_rank(hvd, weights, f"{spec}: weights")
    assert opt.state, "AdamW's own state (its moments) lives in the wrapped optimizer"


def test_sapipe_weight_prediction_needs_the_fused_update():
    model = fresh_model()
    with pytest.raises(ValueError, match="sapipe\\+dc"):
        hvd.DistributedOptimizer(adamw(model.parameters()), named_parameters=model.named_parameters(), method="sapipe")
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == N  # still in step


def clip(model):
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)


def test_clipping_recipe_equals_single_process_clipping():
    """Horovod's recipe: synchronize(); clip_grad_norm_(...); with skip_synchronize(): step()."""
    model, oracle, unclipped = fresh_model(), fresh_model(), fresh_model()
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.5)  # noqa: E731
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    train_distributed(model, opt, edit=clip)
    train_oracle(oracle, sgd(oracle.parameters()), edit=clip)
    check_against_oracle(model, oracle)
    train_oracle(unclipped, sgd(unclipped.parameters()))
    assert relative_error(flat(model.parameters()), flat(unclipped.parameters())) > 1e-2, "clipping changed nothing"


def test_gradients_are_readable_after_synchronize_and_edits_are_applied():
    model = fresh_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
    x, y = next(global_batches(1))
    F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()
    opt.synchronize()
    # The average of every rank's gradient, the same on every rank.
    full = fresh_model()
    F.cross_entropy(full(x), y).backward()
    assert relative_error(flat([p.grad for p in model.parameters()]), flat([p.grad for p in full.parameters()])) < 1e-5
    before = flat(model.parameters())
    with torch.no_grad():
        model.fc1.weight.grad.zero_()       # in place
        model.fc2.weight.grad = None        # replaced: no update of fc2.weight
    with opt.skip_synchronize():
        opt.step()
    after = flat(model.parameters())
    sizes = [p.numel() for p in model.parameters()]
    fc1w, fc1b, fc2w, fc2b = torch.split(after - before, sizes)
    assert torch.count_nonzero(fc1w) == 0 and torch.count_nonzero(fc2w) == 0
    assert torch.count_nonzero(fc1b) > 0 and torch.count_nonzero(fc2b) > 0
    opt.finish()


def train_around_a_checkpoint(model, opt, cut, resumed, save):
    """Steps 0..STEPS-1 (resumed: from `cut` on); returns the weights after finish() and, when not
    resumed, what save() returned after step cut - 1."""
    saved = None
    for t, (x, y) in enumerate(global_batches()):
        if resumed and t < cut:
            continue
        opt.zero_grad()
        F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()
        opt.step()
        if t == cut - 1 and not resumed:
            saved = save()
    opt.finish()
    return flat(model.parameters()), saved


@pytest.mark.parametrize("spec", worker_only_specs() + ["pipe+int8", "dsync+int8"])
def test_state_dict_round_trip_resumes_bit_for_bit(spec):
    """torch.save({'model', 'optimizer': state_dict()}) after step 4, torch.load into a fresh model and
    optimizer, 4 more steps: the same weights as the uninterrupted run (Pipe-SGD with updates in flight)."""
    options = spec_options(spec)
    cut = 4

    def run(checkpoint=None):
        model = fresh_model()
        opt = no_decay_on_biases(model, lr=0.01)
        if checkpoint is not None:
            model.load_state_dict(checkpoint["model"])
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), method=spec, **options)
        if checkpoint is not None:
            opt.load_state_dict(checkpoint["optimizer"])
        def save():
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buffer)
            return buffer.getvalue()
        return train_around_a_checkpoint(model, opt, cut, resumed=checkpoint is not None, save=save)

    uninterrupted, saved = run()
    resumed, _ = run(torch.load(io.BytesIO(saved)))
    assert relative_error(uninterrupted, flat(fresh_model().parameters())) > 1e-3
    assert torch.equal(resumed, uninterrupted), f"{spec}: resumed weights differ by {relative_error(resumed, uninterrupted):.3g}"


def test_state_dict_of_another_method_is_refused():
    model = fresh_model()
    opt = hvd.DistributedOptimizer(adamw(model.parameters()), named_parameters=model.named_parameters(), method="pipe")
    state = opt.state_dict()
    opt.finish()
    other = hvd.DistributedOptimizer(adamw(model.parameters()), named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match="'pipe'"):
        other.load_state_dict(state)
    other.finish()


def test_save_state_is_the_fused_paths():
    model = fresh_model()
    opt = hvd.DistributedOptimizer(adamw(model.parameters()), named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match="state_dict"):
        opt.save_state()
    with pytest.raises(ValueError, match="load_state_dict"):
        opt.load_state(b"")
    opt.finish()


def test_fused_update_for_an_optimizer_it_cannot_run_raises():
    model = fresh_model()
    with pytest.raises(ValueError, match="AdamW"):
        hvd.DistributedOptimizer(adamw(model.parameters()), named_parameters=model.named_parameters(),
                                 fused_update=True)


@pytest.mark.parametrize("spec", ["dsync", "pipe"])
def test_rank_0_loads_and_broadcast_optimizer_state_gives_every_rank_its_state(spec):
    """Horovod's resume: only rank 0 reads the checkpoint, then broadcast_parameters and
    broadcast_optimizer_state; every rank goes on as the uninterrupted run (AdamW's moments and the
    method's updates in flight included)."""
    cut = 4

    def run(checkpoint=None):
        model = fresh_model()
        opt = hvd.DistributedOptimizer(adamw(model.parameters()), named_parameters=model.named_parameters(),
                                       method=spec)
        if checkpoint is not None:
            if R == 0:
                model.load_state_dict(checkpoint["model"])
                opt.load_state_dict(checkpoint["optimizer"])
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
        return train_around_a_checkpoint(
            model, opt, cut, resumed=checkpoint is not None,
            save=lambda: copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict()}))

    uninterrupted, saved = run()
    resumed, _ = run(saved)
    assert torch.equal(resumed, uninterrupted), f"{spec}: resumed weights differ by {relative_error(resumed, uninterrupted):.3g}"


class SgdOfMyOwn(torch.optim.SGD):
    """A subclass: its step might differ from SGD's, so the plain-SGD fast path is not taken for it."""


@pytest.mark.parametrize("spec", ["dsync", "pipe", "sapipe+dc"])
def test_plain_sgd_fast_path_applies_the_general_paths_update(spec):
    """torch.optim.SGD without momentum is stateless: the method applies its rule in its own pass
    (at the param_groups' lr of each step, with weight decay, under a scheduler) and ends where the
    general path (a subclass, whose own step() applies the handed-over gradient) ends."""
    def run(kind):
        model = fresh_model()
        opt = hvd.DistributedOptimizer(kind(model.parameters(), lr=0.2, weight_decay=0.01),
                                       named_parameters=model.named_parameters(), method=spec, **spec_options(spec))
        assert (opt._plain_sgd() is not None) == (kind is torch.optim.SGD)
        train_distributed(model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5))
        return flat(model.parameters())

    fast, general = run(torch.optim.SGD), run(SgdOfMyOwn)
    assert relative_error(general, flat(fresh_model().parameters())) > 1e-3
    assert relative_error(fast, general) < 1e-6
