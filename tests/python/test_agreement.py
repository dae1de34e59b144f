"""Peers agree before bytes move (run with 2 and 3 ranks): collectives are matched by name (by order
when unnamed), and any difference of operation, shape, dtype, root, reduction op or count between
the ranks raises on every rank, sends nothing, and leaves the ranks in step for the next collective.

Each test issues different collectives on different ranks on purpose and ends by checking that an
ordinary allreduce still gives the closed-form sum.
"""
import time

import pytest
import torch

import pipesgd.torch as hvd

hvd.init(timeout=60)
torch.set_num_threads(1)

R = hvd.rank()
N = hvd.size()


def still_in_step():
    assert hvd.allreduce(torch.tensor([R + 1.0]), op=hvd.Sum).item() == N * (N + 1) / 2
    assert hvd.broadcast_object(("token", R), root_rank=N - 1) == ("token", N - 1)


def raises_on_every_rank(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()
    still_in_step()


def test_shape_mismatch():
    raises_on_every_rank(lambda: hvd.allreduce(torch.ones(17 + R, 3)), "Mismatched allreduce tensor shapes")


def test_same_count_different_shape():
    shape = (17, 23 * 57) if R == 0 else (17, 23, 57)
    raises_on_every_rank(lambda: hvd.allreduce(torch.ones(*shape)), "Mismatched allreduce tensor shapes")


def test_dtype_mismatch_broadcast_int32_into_float32():
    tensor = torch.full((3,), 7, dtype=torch.int32 if R == 0 else torch.float32)
    raises_on_every_rank(lambda: hvd.broadcast_(tensor, root_rank=0), "Mismatched data types")
    assert tensor.tolist() == [7, 7, 7], "nothing was received"


def test_root_mismatch():
    raises_on_every_rank(lambda: hvd.broadcast(torch.ones(3), root_rank=R), "root ranks")


def test_reduction_op_mismatch():
    op = hvd.Sum if R == 0 else hvd.Max
    raises_on_every_rank(lambda: hvd.allreduce(torch.ones(3), op=op), "reduction operations")


def test_operation_mismatch():
    def call():
        if R == 0:
            hvd.allreduce(torch.ones(4))
        else:
            hvd.allgather(torch.ones(4))
    raises_on_every_rank(call, "Mismatched operations")


def test_allgather_shape_mismatch_after_dimension_0():
    raises_on_every_rank(lambda: hvd.allgather(torch.ones(2, 3 + R)), "Mismatched allgather tensor shapes")


def test_count_mismatch_named():
    """Rank 0 issues a collective no other rank issues while the others wait on another: after the
    stall limit both fail, on every rank, and the next collective pairs again."""
    name = "only-on-rank-0" if R == 0 else "only-on-the-others"
    raises_on_every_rank(lambda: hvd.allreduce(torch.ones(2), name=name), "not submitted by rank")


def test_count_mismatch_unnamed():
    """Unnamed collectives match by order: rank 0 issues an allreduce where the others issue none and
    wait on a named one; both fail, and the unnamed counter agrees again afterwards."""
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == N

    def call():
        if R == 0:
            hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
        else:
            hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="named")
    raises_on_every_rank(call, "not submitted by rank")
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == N


def test_unnamed_collectives_of_different_kinds_in_the_same_place():
    def call():
        if R == 0:
            hvd.allreduce(torch.ones(4))
        else:
            hvd.barrier()
    raises_on_every_rank(call, "Mismatched operations: One rank did an allreduce, but another rank did an barrier")


def test_named_async_collectives_match_by_name_not_order():
    a, b = torch.full((3,), R + 1.0), torch.full((2,), 10.0 * (R + 1))
    if R % 2 == 0:
        handles = {"a": hvd.allreduce_async(a, name="a", op=hvd.Sum), "b": hvd.allreduce_async(b, name="b", op=hvd.Sum)}
    else:
        handles = {"b": hvd.allreduce_async(b, name="b", op=hvd.Sum), "a": hvd.allreduce_async(a, name="a", op=hvd.Sum)}
    total = N * (N + 1) / 2
    assert hvd.synchronize(handles["a"]).tolist() == [total] * 3
    assert hvd.synchronize(handles["b"]).tolist() == [10 * total] * 2
    still_in_step()


def test_duplicate_name_raises_value_error_and_the_pending_one_still_runs():
    # Each rank in turn submits the name while its peers have not (they do after the barrier), so
    # the name is surely pending when it submits it again (were both ranks' first submissions in
    # place, the allreduce could complete, and free the name, before the second).
    tensor = torch.full((3,), R + 1.0)
    for first in range(N):
        name = f"duplicate_name.{first}"
        handle = None
        if R == first:
            handle = hvd.allreduce_async(tensor, name=name, op=hvd.Sum)
            with pytest.raises(ValueError, match="same name"):
                hvd.allreduce_async(tensor, name=name, op=hvd.Sum)
        hvd.barrier()  # does not wait for the pending allreduce
        if R != first:
            handle = hvd.allreduce_async(tensor, name=name, op=hvd.Sum)
        assert hvd.synchronize(handle).tolist() == [N * (N + 1) / 2] * 3
    still_in_step()


def test_horovod_duplicate_name_pattern():
    """Horovod's test: rank 0 submits 'dup' before a barrier, the others after it; they still pair."""
    tensor = torch.full((2,), R + 1.0)
    handle = None
    if R == 0:
        handle = hvd.allreduce_async(tensor, name="dup", op=hvd.Sum)
    hvd.barrier()
    if R > 0:
        handle = hvd.allreduce_async(tensor, name="dup", op=hvd.Sum)
    hvd.barrier()
    assert hvd.synchronize(handle).tolist() == [N * (N + 1) / 2] * 2
    still_in_step()


def test_a_mismatch_in_a_group_fails_that_tensor_only():
    tensors = [torch.ones(3), torch.ones(4 + R), torch.ones(5)]
    handles = [hvd.allreduce_async(t, name=f"group.{k}", op=hvd.Sum) for k, t in enumerate(tensors)]
    assert hvd.synchronize(handles[0]).tolist() == [N] * 3
    with pytest.raises(RuntimeError, match="tensor shapes"):
        hvd.synchronize(handles[1])
    assert hvd.synchronize(handles[2]).tolist() == [N] * 5
    still_in_step()


def test_init_again_begins_a_phase_that_drops_what_an_earlier_one_left_behind():
    """As between two tests of a suite: rank 0 went on (an assertion failed there before its
    collective) and called init() again; the others' collective of the earlier phase fails at once
    (not after the stall limit), and the next phase's collectives pair as usual."""
    if R != 0:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="called init\\(\\) again"):
            hvd.allreduce(torch.ones(2), name="left-behind")
        waited = time.monotonic() - started
        print(f"rank {R}: the left-behind collective failed after {waited:.2f} s")
    hvd.init()
    still_in_step()
