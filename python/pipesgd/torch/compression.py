"""Horovod's compressors for collectives (``Compression.none``, ``Compression.fp16``). In
DistributedOptimizer, ``Compression.fp16`` selects pipesgd's 16-bit in-ring codec instead
(optimizer.py).
"""

import torch


class Compressor:
    """Interface of Horovod's compressors: compress(tensor) -> (tensor, ctx), decompress(tensor, ctx)."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """In collectives: sends float tensors as float16. In DistributedOptimizer: pipesgd's 16-bit
    in-ring codec (``--codec bf16``, Pipe-SGD's 16-bit truncation), which every allreduce method takes."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx is not None else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
