"""Horovod's functions over the collectives: broadcast_parameters, broadcast_optimizer_state,
broadcast_object, allgather_object.
"""

import io
import pickle

import torch

from pipesgd import _C
from pipesgd.torch._runtime import _worker
from pipesgd.torch.basics import rank
from pipesgd.torch.mpi_ops import _check_root, allgather, broadcast_, broadcast_async_, synchronize
from pipesgd.torch.optimizer import _DistributedOptimizer
from pipesgd.torch.process_sets import global_process_set


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` (pickled) on every member."""
    _check_root(root_rank, "broadcast_object")
    payload = b""
    if rank() == root_rank:
        buffer = io.BytesIO()
        pickle.dump(obj, buffer, protocol=pickle.HIGHEST_PROTOCOL)
        payload = buffer.getvalue()
    length = torch.tensor([len(payload)], dtype=torch.int64)
    length = broadcast_(length, root_rank, None if name is None else f"{name}.length", process_set)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else \
        torch.empty(int(length.item()), dtype=torch.uint8)
    data = broadcast_(data, root_rank, None if name is None else f"{name}.data", process_set)
    if rank() == root_rank:
        return obj
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every member's `obj` (pickled), in rank order."""
    payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
    lengths = allgather(torch.tensor([payload.numel()], dtype=torch.int64),
                        None if name is None else f"{name}.lengths", process_set).tolist()
    gathered = allgather(payload, None if name is None else f"{name}.data", process_set).numpy().tobytes()
    objects, offset = [], 0
    for length in lengths:
        objects.append(pickle.loads(gathered[offset:offset + length]))
        offset += length
    return objects


def broadcast_parameters(params, root_rank, prefix=None):
    """Every worker's parameters (and buffers) become root_rank's, in place.

    `params`: a state_dict (``model.state_dict()``; its tensors share the module's storage) or an
    iterable of (name, tensor) pairs such as ``model.named_parameters()``.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = list(params)
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError(f"invalid params of type: {type(params)}: expected a state_dict or (name, tensor) pairs")
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = []
    for name, tensor in items:
        if tensor is None:
            continue
        if not torch.is_tensor(tensor):
            raise ValueError(f"broadcast_parameters: expected tensors, got {type(tensor)}")
        # Negotiated together (a round lists up to 32), each under its name.
        handles.append(broadcast_async_(tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor, root_rank,
                                        name=f"broadcast_parameters.{name}" if isinstance(name, str) else None))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Every worker's optimizer state becomes root_rank's.

    For a pipesgd DistributedOptimizer: its hyper-parameters (param_groups) and the method's state
    (momentum, moments, ...: valid before its first backward, as after a load). For a plain
    torch.optim optimizer: its state_dict.
    """
    if isinstance(optimizer, _DistributedOptimizer) and not optimizer.fused_update:
        # The wrapped optimizer's state as Horovod broadcasts it, and root's method state, which a
        # worker whose optimizer has not stepped yet takes too (the usual resume: root loaded a checkpoint).
        payload = None
        if rank() == root_rank:
            try:
                method_state = optimizer._pipesgd.save_state()
            except ValueError:  # after a backward, before its step: the method's state stays each rank's
                method_state = None
            payload = (optimizer._wrapped_class.state_dict(optimizer), method_state)
        state, method_state = broadcast_object(payload, root_rank)
        if rank() != root_rank:
            optimizer._wrapped_class.load_state_dict(optimizer, state)
            if method_state is not None and optimizer.iteration == 0:
                optimizer._pipesgd.load_state(method_state)
        return
    if isinstance(optimizer, _DistributedOptimizer):
        groups = broadcast_object([{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
                                  root_rank)
        for group, values in zip(optimizer.param_groups, groups):
            group.update(values)
        _C.broadcast_optimizer_state(_worker(), optimizer._pipesgd, root_rank)
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"broadcast_optimizer_state: expected a torch.optim.Optimizer, got {type(optimizer)}")
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)
