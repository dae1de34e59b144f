"""hvd.DistributedOptimizer against single-process torch.optim oracles (run with 2 and 3 ranks).

The oracle: every rank builds the same model (same seed) and the same global batches (same seed);
rank r trains on its slice of B samples per step through pipesgd, and, on the side, a deep copy of
the initial model trains with plain torch.optim on all size * B samples of each step. Synchronous
averaging over ranks of per-rank mean-loss gradients is the gradient of the mean loss over all the
samples, so both must end with the same weights up to float32 rounding.
"""
import copy
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

import pipesgd
import pipesgd.torch as hvd
import psgd_testlib
from psgd_testlib import CLI, assert_same_on_every_rank, clean_env, flat, fresh_model, relative_error

hvd.init(timeout=60)
torch.set_num_threads(1)

R = hvd.rank()
N = hvd.size()
B = 4          # samples per rank per step
STEPS = 10
TOLERANCE = 1e-5


def fresh_model_parameters():
    return flat(fresh_model().parameters())


def global_batches(steps=STEPS, seed=99):
    """The same (inputs, labels) of size * B samples per step on every rank."""
    return psgd_testlib.global_batches(N, B, steps, seed)


def my_slice(x):
    return x[R * B:(R + 1) * B]


def train_distributed(model, opt, scheduler=None, passes=1):
    for x, y in global_batches():
        opt.zero_grad()
        mx, my = my_slice(x), my_slice(y)
        if passes == 1:
            F.cross_entropy(model(mx), my).backward()
        else:
            half = B // 2
            F.cross_entropy(model(mx[:half]), my[:half]).backward()
            F.cross_entropy(model(mx[half:]), my[half:]).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
    opt.finish()


def train_oracle(model, opt, loss_of_step, scheduler=None):
    for x, y in global_batches():
        opt.zero_grad()
        loss_of_step(model, x, y).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def mean_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def check_against_oracle(model, oracle, initial):
    weights, expected = flat(model.parameters()), flat(oracle.parameters())
    assert relative_error(expected, initial) > 1e-3, "the oracle's training must move the weights"
    error = relative_error(weights, expected)
    assert error <= TOLERANCE, f"relative error {error:.3g} against the single-process oracle"
    assert_same_on_every_rank(hvd, flat(model.parameters()), "weights")


def sgd(parameters):
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9, weight_decay=1e-3)


def test_sgd_momentum_weight_decay_equals_single_process_oracle():
    model = fresh_model()
    oracle = copy.deepcopy(model)
    initial = flat(model.parameters())
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD) and opt.method == "dsync"
    train_distributed(model, opt)
    train_oracle(oracle, sgd(oracle.parameters()), mean_loss)
    check_against_oracle(model, oracle, initial)


def test_step_lr_scheduler_on_the_wrapped_optimizer():
    model = fresh_model()
    oracle = copy.deepcopy(model)
    initial = flat(model.parameters())
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.3)
    train_distributed(model, opt, scheduler)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * 0.3 ** (STEPS // 3))
    oracle_opt = sgd(oracle.parameters())
    train_oracle(oracle, oracle_opt, mean_loss, torch.optim.lr_scheduler.StepLR(oracle_opt, step_size=3, gamma=0.3))
    check_against_oracle(model, oracle, initial)
    # The schedule mattered: the constant-rate oracle ends elsewhere.
    constant = copy.deepcopy(fresh_model())
    train_oracle(constant, sgd(constant.parameters()), mean_loss)
    assert relative_error(flat(model.parameters()), flat(constant.parameters())) > 100 * TOLERANCE


def test_adam_equals_single_process_oracle():
    def adam(parameters):
        return torch.optim.Adam(parameters, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=1e-3)

    model = fresh_model()
    oracle = copy.deepcopy(model)
    initial = flat(model.parameters())
    opt = hvd.DistributedOptimizer(adam(model.parameters()), named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.Adam)
    train_distributed(model, opt)
    train_oracle(oracle, adam(oracle.parameters()), mean_loss)
    check_against_oracle(model, oracle, initial)


def test_op_sum_equals_oracle_with_loss_scaled_by_size():
    model = fresh_model()
    oracle = copy.deepcopy(model)
    initial = flat(model.parameters())
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(), op=hvd.Sum)
    train_distributed(model, opt)
    train_oracle(oracle, sgd(oracle.parameters()), lambda m, x, y: N * F.cross_entropy(m(x), y))
    check_against_oracle(model, oracle, initial)


def test_backward_passes_per_step_two_half_batches():
    half = B // 2

    def summed_halves(m, x, y):
        # Every rank's two half-batch mean losses, summed, averaged over the ranks.
        total = 0
        for r in range(N):
            xs, ys = x[r * B:(r + 1) * B], y[r * B:(r + 1) * B]
            total = total + F.cross_entropy(m(xs[:half]), ys[:half]) + F.cross_entropy(m(xs[half:]), ys[half:])
        return total / N

    model = fresh_model()
    oracle = copy.deepcopy(model)
    initial = flat(model.parameters())
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    train_distributed(model, opt, passes=2)
    train_oracle(oracle, sgd(oracle.parameters()), summed_halves)
    check_against_oracle(model, oracle, initial)


@pytest.mark.parametrize("staleness", [2, 3])
def test_pipe_hand_computed_sequence(staleness):
    """Pipe-SGD (src/pipesgd/algo/pipe/pipe_sgd.h): the update at the start of iteration t applies
    the averaged gradient of iteration t-K (none for t < K); finish() applies the last K-1 gradients
    still unapplied (every computed gradient is applied, --final-gradients apply)."""
    lr, steps, w0 = 0.1, 7, 1.0
    xs = [1.0 + 0.5 * r for r in range(N)]
    ys = [2.0 * r - 1.0 for r in range(N)]

    def averaged_gradient(w):  # of 0.5 * (w x_r - y_r)^2, averaged over the ranks
        return sum((w * x - y) * x for x, y in zip(xs, ys)) / N

    # The rule, by hand: w after step t (the start of iteration t + 1).
    expected, gradients, w = [], [], w0
    for t in range(steps):
        gradients.append(averaged_gradient(w))   # iteration t's gradient, at the weights it ran on
        applied = t + 1 - staleness              # step t's update applies the gradient of t + 1 - K
        if applied >= 0:
            w -= lr * gradients[applied]
        expected.append(w)
    for applied in range(max(steps + 1 - staleness, 0), steps):
        w -= lr * gradients[applied]
    expected_final = w

    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(w0)
    options = {} if staleness == 2 else {"staleness": staleness}  # K = 2 is the default
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), method="pipe", **options)
    x, y = torch.tensor([[xs[R]]]), torch.tensor([[ys[R]]])
    seen = []
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * (model(x) - y) ** 2).sum().backward()
        opt.step()
        seen.append(model.weight.item())
    assert opt.iteration == steps
    opt.finish()
    assert seen[:staleness - 1] == [w0] * (staleness - 1), "no update before the first gradient arrives"
    assert seen == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert model.weight.item() == pytest.approx(expected_final, rel=1e-5, abs=1e-6)


def test_fused_update_refuses_what_its_sgd_and_adam_cannot_do():
    model = fresh_model()
    with pytest.raises(ValueError, match="RMSprop"):
        hvd.DistributedOptimizer(torch.optim.RMSprop(model.parameters(), lr=0.01),
                                 named_parameters=model.named_parameters(), fused_update=True)
    groups = [{"params": model.fc1.parameters(), "lr": 0.1}, {"params": model.fc2.parameters(), "lr": 0.01}]
    with pytest.raises(ValueError, match="param_groups"):
        hvd.DistributedOptimizer(torch.optim.SGD(groups, lr=0.1), named_parameters=model.named_parameters(),
                                 fused_update=True)
    groups = [{"params": model.fc1.parameters()}, {"params": model.fc2.parameters(), "weight_decay": 1e-4}]
    with pytest.raises(ValueError, match="weight_decay"):
        hvd.DistributedOptimizer(torch.optim.SGD(groups, lr=0.1), named_parameters=model.named_parameters(),
                                 fused_update=True)


@pytest.mark.parametrize("cli_arguments,method,options,keywords", [
    (["--algo", "nosuch"], "nosuch", {}, {}),
    (["--algo", "dsync", "--staleness-k", "3"], "dsync", {"staleness": 3}, {"--staleness-k": "staleness="}),
    (["--algo", "pipe", "--warmup-iters", "-1"], "pipe", {"warmup_iters": -1},
     {"--warmup-epochs": "warmup_epochs=", "--warmup-iters": "warmup_iters="}),
], ids=["unknown-method", "option-of-another-method", "bad-option-value"])
def test_bad_method_spec_raises_the_cli_message(cli_arguments, method, options, keywords):
    """The ValueError's message is the CLI's one-line message (without its 'pipesgd: error: '), with
    the CLI's flags named by the Python keywords the user wrote (`keywords`: flag -> keyword)."""
    cli = subprocess.run([CLI, "train", "--iters", "1"] + cli_arguments, capture_output=True, text=True,
                         timeout=60, env=clean_env())
    assert cli.returncode != 0
    prefix = "pipesgd: error: "
    lines = [line for line in cli.stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, cli.stderr
    cli_message = lines[0][len(prefix):]
    for flag, keyword in keywords.items():
        assert flag in cli_message, cli_message
        cli_message = cli_message.replace(flag, keyword)
    model = fresh_model()
    with pytest.raises(ValueError) as raised:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), method=method, **options)
    assert str(raised.value) == cli_message
    # The ranks are still in step afterwards.
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == N
    assert issubclass(pipesgd.CommError, RuntimeError)


def test_auto_chooses_and_switches_without_losing_a_gradient(capfd):
    """method="auto" (policy sync): it profiles 13 steps, chooses a synchronous method (or tries the
    synchronous ones predicted close, one after another), says so in one line on rank 0's stderr, and
    switches without losing a gradient: the single-process oracle holds."""
    steps = 24
    model = fresh_model()
    oracle = copy.deepcopy(model)
    initial = flat(model.parameters())
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(), method="auto",
                                   auto_drift=0)
    assert opt.method == "auto"
    capfd.readouterr()
    for x, y in global_batches(steps):
        opt.zero_grad()
        F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()
        opt.step()
    opt.finish()
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("pipesgd: auto")]
    if R == 0:
        assert len(lines) == 1, err
        assert re.match(r"pipesgd: auto:sync (chose \S+|tries .*, predicted within 10% \(--auto-trial\), for \d+ "
                        r"counted iterations each \(in the order [123 ]+, 2 settling at each switch, \d+ in all\)) "
                        r"from iteration 13[:;] ", lines[0]), lines[0]
        assert "pipe" not in lines[0].removeprefix("pipesgd: auto:sync ").split(" from iteration 13")[0], lines[0]
    else:
        assert lines == [], err
    oracle_opt = sgd(oracle.parameters())
    for x, y in global_batches(steps):
        oracle_opt.zero_grad()
        mean_loss(oracle, x, y).backward()
        oracle_opt.step()
    check_against_oracle(model, oracle, initial)
    assert "auto" in [m["name"] for m in hvd.available_methods()]


# The original optimizer's own step() is never called (the wrapper's replaces it), so torch warns.
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
def test_step_lr_scheduler_on_the_original_optimizer():
    """The wrapper shares the wrapped optimizer's param_groups: a scheduler made on the original works too."""
    model = fresh_model()
    oracle = copy.deepcopy(model)
    original = sgd(model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(original, step_size=3, gamma=0.3)
    opt = hvd.DistributedOptimizer(original, named_parameters=model.named_parameters())
    train_distributed(model, opt, scheduler)
    oracle_opt = sgd(oracle.parameters())
    train_oracle(oracle, oracle_opt, mean_loss, torch.optim.lr_scheduler.StepLR(oracle_opt, step_size=3, gamma=0.3))
    check_against_oracle(model, oracle, fresh_model_parameters())


@pytest.mark.parametrize("fused", [False, True])
def test_fused_path_equals_general_path_for_sgd(fused):
    """The fused update (the method's own SGD) and the general path (torch.optim.SGD's step on the
    handed-over gradient) both equal the single-process oracle."""
    model = fresh_model()
    oracle = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                                   fused_update=fused)
    assert opt.fused_update == fused
    train_distributed(model, opt)
    train_oracle(oracle, sgd(oracle.parameters()), mean_loss)
    check_against_oracle(model, oracle, fresh_model_parameters())


def test_synchronize_then_step_inside_skip_synchronize():
    """Horovod's pattern for gradient clipping: synchronize(), then step() in skip_synchronize(): one
    update per iteration, the oracle's."""
    model = fresh_model()
    oracle = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    for x, y in global_batches():
        opt.zero_grad()
        F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
    assert opt.iteration == STEPS
    opt.finish()
    train_oracle(oracle, sgd(oracle.parameters()), mean_loss)
    check_against_oracle(model, oracle, fresh_model_parameters())


@pytest.mark.parametrize("method", ["dsync", "pipe"])
def test_save_state_and_load_state_resume_bit_identically(method):
    def run(resume_from=None, first=0):
        model = fresh_model()
        opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                                       method=method, fused_update=True)
        if resume_from is not None:
            opt.load_state(resume_from)
        state = None
        for t, (x, y) in enumerate(global_batches()):
            if t < first:
                continue
            opt.zero_grad()
            F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()
            if t == 4 and resume_from is None:
                state = opt.save_state()
            else:
                opt.step()
        opt.finish()
        return flat(model.parameters()), state

    uninterrupted, state = run()
    assert isinstance(state, bytes) and state[:8] == b"PSGDCKPT"
    resumed, _ = run(resume_from=state, first=5)
    assert relative_error(uninterrupted, fresh_model_parameters()) > 1e-3
    assert torch.equal(resumed, uninterrupted), f"{method}: resumed weights differ"


def test_parameter_server_method_without_servers_raises():
    model = fresh_model()
    with pytest.raises(ValueError, match="servers"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), method="pssync")


def test_changing_momentum_after_construction_raises_on_the_fused_path():
    model = fresh_model()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                                   fused_update=True)
    x, y = next(global_batches(1))
    F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()
    opt.param_groups[0]["momentum"] = 0.5
    with pytest.raises(ValueError, match="momentum changed after construction"):
        opt.step()
    opt.param_groups[0]["momentum"] = 0.9
    opt.step()  # still usable
    opt.finish()
    with pytest.raises(ValueError):
        opt.step()  # after finish()
    with pytest.raises(ValueError, match="fused_update=False"):
        opt.state_dict()
    with pytest.raises(ValueError, match="fused_update=False"):
        opt.load_state_dict({})
    with pytest.raises(ValueError, match="fused_update=False"):
        opt.synchronize()


def test_pipe_with_momentum_warns_once_and_only_where_accuracy_is_at_stake(monkeypatch):
    # Pipe-SGD's stale gradient under momentum >= 0.5 costs accuracy: one warning per process, saying
    # what to use instead; none for dsync, sapipe or pipe with a small momentum.
    monkeypatch.setattr(hvd.optimizer, "_stale_momentum_warned", False)

    def build(method, momentum):
        model = fresh_model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum),
                                       named_parameters=model.named_parameters(), method=method)
        x, y = next(global_batches(1))
        F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()
        opt.step()
        opt.finish()

    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build("dsync", 0.9)
        build("pipe", 0.3)
        build("pipe+int8", 0.9)
        build("pipe", 0.9)  # once per process
    messages = [str(w.message) for w in caught if "stale" in str(w.message)]
    assert len(messages) == 1, messages
    assert "method 'pipe+int8'" in messages[0] and "momentum 0.9" in messages[0], messages[0]
    assert "sapipe" in messages[0] and "momentum <= 0.3" in messages[0] and "dsync" in messages[0], messages[0]
