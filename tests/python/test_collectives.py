"""pipesgd.torch's world and collectives against closed forms (run with 1, 2 and 3 ranks).

Every rank runs these functions in the same order; each tensor depends on the rank, so the
expected result is a closed form of the ranks 0..size-1.
"""
import math
import os

import time
import types

import pytest
import torch

import pipesgd.torch as hvd
from psgd_testlib import assert_same_on_every_rank, flat, gathered_rows

hvd.init(timeout=60)
torch.set_num_threads(1)

R = hvd.rank()
N = hvd.size()
BASE = (torch.arange(12, dtype=torch.float32) * 0.5 - 2.0).reshape(3, 4)  # dyadic: sums are exact


def mine(dtype=torch.float32):
    """This rank's tensor: (rank + 1) * BASE."""
    return ((R + 1) * BASE).to(dtype)


SUM_OF_FACTORS = N * (N + 1) // 2  # sum over r of (r + 1)


def test_rank_size_match_the_launcher():
    assert hvd.is_initialized() and hvd.is_worker()
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        assert hvd.rank() == int(os.environ["OMPI_COMM_WORLD_RANK"])
        assert hvd.size() == int(os.environ["OMPI_COMM_WORLD_SIZE"])
        assert hvd.local_rank() == int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
        assert hvd.local_size() == int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])
        assert hvd.mpi_enabled()
    else:
        assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    # One machine: one cross rank.
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
    assert hvd.is_homogeneous()
    assert 0 <= hvd.local_rank() < hvd.local_size() <= hvd.size()


def test_nccl_and_gpu_builds_are_false():
    assert hvd.nccl_built() is False
    assert hvd.cuda_built() is False and hvd.rocm_built() is False
    assert hvd.mpi_built() is True


# pipesgd.torch's public names (not modules) as they were when it was one module (issue 36 split it
# into Horovod's layout): `import pipesgd.torch as hvd` offers exactly these.
PUBLIC_NAMES = [
    "Adasum", "Average", "CollectiveMismatchError", "CommError", "CommTimeoutError", "Compression", "Compressor",
    "DataError", "DistributedOptimizer", "FP16Compressor", "HorovodInternalError", "Max", "Min", "NoneCompressor",
    "PartialDistributedOptimizer", "PeerFailedError", "ProcessSet", "Product", "Sum", "SyncBatchNorm",
    "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "available_methods", "barrier", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "global_process_set",
    "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
    "grouped_reducescatter_async", "init", "is_homogeneous", "is_initialized", "is_worker", "join", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size", "sparse_allreduce_async",
    "start_timeline", "stop_timeline", "synchronize",
]
# Its modules, as Horovod's horovod/torch (the standard library's modules it once imported at its top
# level, os, sys, torch, ..., were names of it by accident and are not any more).
PUBLIC_MODULES = ["basics", "compression", "elastic", "functions", "mpi_ops", "optimizer", "process_sets",
                  "sync_batch_norm"]


def test_public_names_are_those_of_the_single_module():
    public = {name: getattr(hvd, name) for name in dir(hvd) if not name.startswith("_")}
    assert sorted(n for n, value in public.items() if not isinstance(value, types.ModuleType)) == PUBLIC_NAMES
    assert sorted(n for n, value in public.items() if isinstance(value, types.ModuleType)) == PUBLIC_MODULES
    assert set(hvd.__all__) <= set(PUBLIC_NAMES)
    for name in PUBLIC_MODULES:  # each says what it holds
        assert getattr(hvd, name).__doc__


def test_allreduce_average_closed_form():
    out = hvd.allreduce(mine(), op=hvd.Average)
    torch.testing.assert_close(out, BASE * SUM_OF_FACTORS / N, rtol=1e-6, atol=1e-6)
    # The default op is Average, as Horovod's.
    torch.testing.assert_close(hvd.allreduce(mine()), BASE * SUM_OF_FACTORS / N, rtol=1e-6, atol=1e-6)


def test_allreduce_sum_closed_form():
    t = mine()
    out = hvd.allreduce(t, op=hvd.Sum)
    assert torch.equal(out, BASE * SUM_OF_FACTORS)
    assert torch.equal(t, mine()), "allreduce must not change its input"


def test_allreduce_deprecated_average_argument():
    with pytest.warns(DeprecationWarning):
        out = hvd.allreduce(mine(), average=False)
    assert torch.equal(out, BASE * SUM_OF_FACTORS)


def test_allreduce_in_place():
    t = mine()
    result = hvd.allreduce_(t, op=hvd.Sum)
    assert result is t
    assert torch.equal(t, BASE * SUM_OF_FACTORS)
    # A non-contiguous tensor, in place too.
    u = mine().t()
    hvd.allreduce_(u, op=hvd.Average)
    torch.testing.assert_close(u, (BASE * SUM_OF_FACTORS / N).t(), rtol=1e-6, atol=1e-6)


def test_async_handles_synchronized_in_order():
    a = mine()
    b = mine() * 2
    c = torch.full((R + 1, 2), float(R))
    d = torch.full((5,), float(R + 10))
    h1 = hvd.allreduce_async(a, op=hvd.Sum)
    h2 = hvd.allreduce_async_(b, op=hvd.Sum)
    h3 = hvd.allgather_async(c)
    h4 = hvd.broadcast_async(d, root_rank=N - 1)
    h5 = hvd.allreduce_async(mine(), op=hvd.Average)
    assert len({h1, h2, h3, h4, h5}) == 5
    deadline = time.monotonic() + 60
    while not hvd.poll(h2):  # the communication thread completes it; poll never blocks
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert torch.equal(b, 2 * BASE * SUM_OF_FACTORS), "allreduce_async_ works in place"
    assert torch.equal(hvd.synchronize(h1), BASE * SUM_OF_FACTORS)
    assert torch.equal(a, mine()), "allreduce_async leaves its input"
    assert hvd.synchronize(h2) is b
    gathered = hvd.synchronize(h3)
    assert torch.equal(gathered, torch.cat([torch.full((r + 1, 2), float(r)) for r in range(N)]))
    assert torch.equal(hvd.synchronize(h4), torch.full((5,), float(N - 1 + 10)))
    assert torch.equal(d, torch.full((5,), float(R + 10))), "broadcast_async leaves its input"
    torch.testing.assert_close(hvd.synchronize(h5), BASE * SUM_OF_FACTORS / N, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError):
        hvd.poll(h1)  # already synchronized: unknown


def test_int64_allreduce_exact():
    big = 2 ** 40  # beyond float32's 24-bit mantissa
    t = torch.tensor([big + R, -big * (R + 1), R], dtype=torch.int64)
    out = hvd.allreduce(t, op=hvd.Sum)
    assert out.dtype == torch.int64
    assert out.tolist() == [N * big + N * (N - 1) // 2, -big * SUM_OF_FACTORS, N * (N - 1) // 2]
    avg = hvd.allreduce(torch.tensor([10 * (R + 1)], dtype=torch.int64), op=hvd.Average)
    assert avg.dtype == torch.int64 and avg.tolist() == [10 * SUM_OF_FACTORS // N]


def test_float64_allreduce_exact():
    tiny = 2.0 ** -40  # lost in float32 next to 1.0
    t = torch.tensor([1.0 + (R + 1) * tiny, 3.0], dtype=torch.float64)
    out = hvd.allreduce(t, op=hvd.Sum)
    assert out.dtype == torch.float64
    assert out.tolist() == [N + SUM_OF_FACTORS * tiny, 3.0 * N]


def test_min_max_product():
    t = torch.tensor([R + 1.0, -(R + 1.0), 2.0])
    assert hvd.allreduce(t, op=hvd.Min).tolist() == [1.0, -float(N), 2.0]
    assert hvd.allreduce(t, op=hvd.Max).tolist() == [float(N), -1.0, 2.0]
    factorial = float(math.factorial(N))
    assert hvd.allreduce(t, op=hvd.Product).tolist() == [factorial, (-1.0) ** N * factorial, 2.0 ** N]
    ints = torch.tensor([R + 1, -(R + 1)], dtype=torch.int64)
    assert hvd.allreduce(ints, op=hvd.Max).tolist() == [N, -1]


def test_prescale_and_postscale():
    out = hvd.allreduce(mine(), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    assert torch.equal(out, BASE * SUM_OF_FACTORS * 0.5)
    # Pre- and postscale differ for a non-linear op: Min of the negated tensors is -Max.
    t = torch.tensor([R + 1.0])
    assert hvd.allreduce(t, op=hvd.Min, prescale_factor=-1.0).tolist() == [-float(N)]
    assert hvd.allreduce(t, op=hvd.Min, postscale_factor=-1.0).tolist() == [-1.0]
    u = mine()
    hvd.allreduce_(u, op=hvd.Average, prescale_factor=3.0, postscale_factor=0.5)
    torch.testing.assert_close(u, BASE * SUM_OF_FACTORS / N * 1.5, rtol=1e-6, atol=1e-6)


def test_allreduce_fp16_compression():
    out = hvd.allreduce(mine(), op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, BASE * SUM_OF_FACTORS, rtol=1e-3, atol=1e-3)


def test_allreduce_has_a_gradient():
    x = mine().requires_grad_()
    y = hvd.allreduce(x, op=hvd.Sum)
    (y * (R + 1)).sum().backward()  # d/dx_r of sum over ranks of (r+1) * allreduce: allreduced too
    assert torch.equal(x.grad, torch.full_like(x, float(SUM_OF_FACTORS)))


def test_allgather_different_first_dimensions():
    t = torch.arange(3, dtype=torch.float32).repeat(R + 1, 1) + 100 * R  # R + 1 rows
    out = hvd.allgather(t)
    expected = torch.cat([torch.arange(3, dtype=torch.float32).repeat(r + 1, 1) + 100 * r for r in range(N)])
    assert out.shape == (SUM_OF_FACTORS, 3)
    assert torch.equal(out, expected)
    ints = hvd.allgather(torch.full((R + 2,), R, dtype=torch.int64))
    assert ints.tolist() == [r for r in range(N) for _ in range(r + 2)]


@pytest.mark.parametrize("root", ["first", "last"])
def test_broadcast_from_root(root):
    root_rank = 0 if root == "first" else N - 1
    t = mine()
    out = hvd.broadcast(t, root_rank=root_rank)
    assert torch.equal(out, (root_rank + 1) * BASE)
    assert torch.equal(t, mine()), "broadcast must not change its input"


@pytest.mark.parametrize("root", ["first", "last"])
def test_broadcast_in_place_from_root(root):
    root_rank = 0 if root == "first" else N - 1
    t = mine()
    assert hvd.broadcast_(t, root_rank=root_rank) is t
    assert torch.equal(t, (root_rank + 1) * BASE)
    ints = torch.tensor([R, 7 * R], dtype=torch.int64)
    hvd.broadcast_(ints, root_rank)
    assert ints.tolist() == [root_rank, 7 * root_rank]


def test_broadcast_object_and_allgather_object():
    obj = {"rank": R, "name": f"worker-{R}", "values": list(range(R + 1))}
    assert hvd.broadcast_object(obj, root_rank=0) == {"rank": 0, "name": "worker-0", "values": [0]}
    last = hvd.broadcast_object(obj, root_rank=N - 1)
    assert last == {"rank": N - 1, "name": f"worker-{N - 1}", "values": list(range(N))}
    everyone = hvd.allgather_object(obj)
    assert everyone == [{"rank": r, "name": f"worker-{r}", "values": list(range(r + 1))} for r in range(N)]
    assert hvd.allgather_object(None if R % 2 else ("x" * (R + 1))) == \
        [None if r % 2 else "x" * (r + 1) for r in range(N)]


def test_adasum_raises_not_implemented():
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(mine(), op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce_(mine(), op=hvd.Adasum)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), op=hvd.Adasum)
    # Still in step with the peers after the refusals.
    assert torch.equal(hvd.allreduce(mine(), op=hvd.Sum), BASE * SUM_OF_FACTORS)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)
        self.out = torch.nn.Linear(3, 2)


def _rank_net(rank):
    """A module whose parameters and BatchNorm running statistics depend on `rank`."""
    torch.manual_seed(1000 + rank)
    net = _Net()
    with torch.no_grad():
        net.bn.running_mean.copy_(torch.randn(3) + rank)
        net.bn.running_var.copy_(torch.rand(3) + 1 + rank)
        net.bn.weight.copy_(torch.randn(3))
    return net


def _everything(net):
    return flat(list(net.parameters()) + [net.bn.running_mean, net.bn.running_var])


def test_broadcast_parameters_state_dict():
    net = _rank_net(R)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    assert_same_on_every_rank(hvd, _everything(net), "parameters and buffers after broadcast_parameters")
    assert torch.equal(_everything(net), _everything(_rank_net(0))), "every rank holds rank 0's module"
    assert torch.equal(net.bn.running_mean, _rank_net(0).bn.running_mean)


def test_broadcast_parameters_named_parameters_from_last_rank():
    net = _rank_net(R)
    hvd.broadcast_parameters(net.named_parameters(), root_rank=N - 1)
    assert_same_on_every_rank(hvd, flat(net.parameters()), "parameters after broadcast_parameters")
    assert torch.equal(flat(net.parameters()), flat(_rank_net(N - 1).parameters()))
    # named_parameters holds no buffers: each rank keeps its own running statistics.
    means = gathered_rows(hvd, net.bn.running_mean)
    for r in range(N):
        assert torch.equal(means[r], _rank_net(r).bn.running_mean)


def test_allreduce_async_completes_while_python_computes():
    """Real asynchrony: the communication thread runs the collective while this thread computes
    (no synchronize, no blocking call): poll() turns True in the middle of the computation."""
    tensor = torch.full((1 << 16,), float(R + 1))
    handle = hvd.allreduce_async(tensor, op=hvd.Sum, name="overlap")
    x = torch.randn(64, 64)
    deadline = time.monotonic() + 60
    while not hvd.poll(handle):
        x = torch.tanh(x @ x)  # Python-side work meanwhile
        assert time.monotonic() < deadline, "the collective did not complete on its own"
    assert torch.equal(hvd.synchronize(handle), torch.full((1 << 16,), N * (N + 1) / 2))


def test_every_dtype_and_op_against_closed_forms():
    ops = {hvd.Sum: lambda s: s.sum(0), hvd.Min: lambda s: s.min(0).values, hvd.Max: lambda s: s.max(0).values,
           hvd.Product: lambda s: s.prod(0)}
    for dtype in [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                  torch.float32, torch.float64]:
        rows = torch.stack([torch.arange(5).add(r).remainder(3).add(1) for r in range(N)])  # 1..3, exact
        for op, oracle in ops.items():
            got = hvd.allreduce(rows[R].to(dtype), op=op)
            assert torch.equal(got, oracle(rows).to(dtype)), (dtype, op, got)
        average = hvd.allreduce(rows[R].to(dtype), op=hvd.Average)
        expected = rows.sum(0).div(N, rounding_mode="trunc") if not dtype.is_floating_point else rows.sum(0) / N
        assert torch.equal(average, expected.to(dtype)), (dtype, average)


def test_autograd_through_collectives_against_finite_differences():
    """d/dx of sum(w * collective(x)) summed over the ranks, by central differences of the same
    objective (every rank perturbs the same element of its own x in turn)."""
    torch.manual_seed(7)
    weights = torch.randn(2 * N, 3, dtype=torch.float64)

    def objective(x, kind):
        if kind == "allreduce":
            y = hvd.allreduce(x, op=hvd.Sum)
            w = weights[:2]
        elif kind == "allgather":
            y = hvd.allgather(x)
            w = weights
        elif kind == "broadcast":
            y = hvd.broadcast(x, root_rank=0)
            w = weights[:2]
        elif kind == "alltoall":
            y = hvd.alltoall(x)
            w = weights[:N]
        else:
            y = hvd.reducescatter(x, op=hvd.Sum)
            w = weights[:y.shape[0]]
        return (w * y).sum()

    for kind in ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]:
        rows = N if kind in ("alltoall", "reducescatter") else 2
        base = torch.arange(rows * 3, dtype=torch.float64).reshape(rows, 3).add(R)
        x = base.clone().requires_grad_()
        objective(x, kind).backward()
        assert x.grad is not None, kind
        # Horovod's gradients: the allreduce of the upstream gradients (Sum), averaged for
        # allgather and broadcast (root only), allgathered (times the set size for Sum) for
        # reducescatter, sent back for alltoall: compare with the finite differences of the
        # objective summed over the ranks, scaled as Horovod scales them.
        scale = {"allreduce": 1.0, "allgather": 1.0 / N, "broadcast": 1.0 / N, "alltoall": 1.0,
                 "reducescatter": float(N)}[kind]
        eps = 1e-3
        for index in [(0, 0), (rows - 1, 2)]:
            totals = []
            for sign in (1, -1):
                probe = base.clone()
                probe[index] += sign * eps
                totals.append(hvd.allreduce(objective(probe, kind).detach().reshape(1), op=hvd.Sum).item())
            numeric = (totals[0] - totals[1]) / (2 * eps)
            # Every rank perturbs its own element at once: the global objective moves by the sum of the
            # ranks' partial derivatives; each rank's gradient is its own share of it.
            shares = hvd.allgather(x.grad[index].reshape(1)).sum().item()
            assert abs(shares / scale - numeric) < 1e-6 * max(1.0, abs(numeric)), (kind, index, shares, numeric)


def test_sync_batch_norm_equals_batch_norm_over_the_whole_batch():
    torch.manual_seed(3)
    whole = torch.randn(4 * N, 3, 5, dtype=torch.float64)
    mine_rows = whole[4 * R:4 * (R + 1)].clone().requires_grad_()
    sync = hvd.SyncBatchNorm(3).double()
    reference = torch.nn.BatchNorm1d(3).double()
    out = sync(mine_rows)
    expected = reference(whole)
    torch.testing.assert_close(out, expected[4 * R:4 * (R + 1)])
    torch.testing.assert_close(sync.running_mean, reference.running_mean)
    torch.testing.assert_close(sync.running_var, reference.running_var)
    # Gradients: each rank's share of d(sum of squares over the whole batch).
    (out ** 2).sum().backward()
    whole_leaf = whole.clone().requires_grad_()
    (torch.nn.BatchNorm1d(3).double()(whole_leaf) ** 2).sum().backward()
    torch.testing.assert_close(mine_rows.grad, whole_leaf.grad[4 * R:4 * (R + 1)])


def test_process_sets_and_a_rank_in_none():
    if N < 2:
        pytest.skip("needs 2 ranks")
    first = hvd.add_process_set([0])
    last = hvd.add_process_set([N - 1])
    assert first.ranks == [0] and first.size() == 1
    if R == 0:
        assert hvd.allreduce(torch.ones(3), op=hvd.Sum, process_set=first).tolist() == [1.0] * 3
        assert first.included() and first.rank() == 0
    elif R == N - 1:
        assert hvd.allgather(torch.full((2,), 5.0), process_set=last).tolist() == [5.0, 5.0]
    # (N == 3: rank 1 is in neither set and took no part)
    with pytest.raises(ValueError):
        hvd.add_process_set([0])  # registered already
    assert hvd.remove_process_set(first) and hvd.remove_process_set(last)
    assert not hvd.remove_process_set(hvd.global_process_set)
    hvd.barrier()


def test_join_with_uneven_batches_returns_the_last_rank():
    for batch in range(R + 1):  # rank r has r + 1 batches
        active = hvd.allreduce(torch.ones(2, dtype=torch.int64), op=hvd.Sum, name=f"batch.{batch}")
        assert active.tolist() == [N - batch] * 2
    assert hvd.join() == N - 1


def test_timeline_as_horovods_test_expects(tmp_path):
    # Horovod's test_timeline_api (which Horovod itself skips): rank 0's file has the tensor's track,
    # NEGOTIATE_ALLREDUCE, ALLREDUCE and, with mark_cycles, CYCLE_START.
    import json
    path = hvd.broadcast_object(str(tmp_path / "timeline.json"))
    for mark_cycles in (True, False):
        hvd.start_timeline(path, mark_cycles=mark_cycles)
        hvd.start_timeline(path, mark_cycles=mark_cycles)  # the same file again: goes on
        hvd.allreduce(torch.tensor([1, 2, 3], dtype=torch.float32), name="test_allreduce")
        hvd.stop_timeline()
        hvd.barrier()
        if R == 0:
            with open(path) as f:
                text = f.read()
            events = json.loads(text)["traceEvents"]
            for word in ("allreduce.test_allreduce", "start_time_since_epoch_in_micros", "NEGOTIATE_ALLREDUCE",
                         "ALLREDUCE"):
                assert word in text
            assert ("CYCLE_START" in text) == mark_cycles
            ready = {e["args"]["worker"] for e in events if e["name"] == "RANK_READY"}
            assert ready == set(range(N))
        hvd.barrier()
    with pytest.raises(ValueError, match="cannot create directory"):
        hvd.start_timeline("/proc/no-such-dir/timeline.json")


def test_what_differs_from_horovod_raises_clearly():
    with pytest.raises(NotImplementedError, match="PartialDistributedOptimizer"):
        hvd.PartialDistributedOptimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    with pytest.raises(hvd.HorovodInternalError):
        hvd.reducescatter(torch.tensor(1.0))
