"""examples/python/pytorch_mnist.py, Horovod's example on pipesgd.torch (run by pytest alone; the
script runs under mpirun -np 2 as a child process).

The script is run with its own options on a small cut of Fashion-MNIST (--data-source: the first
TRAIN and TEST examples of Debian's copy, written as IDX files), so one epoch takes seconds; it must
end and print its "test accuracy: NN.NN%" line. Its source must be Horovod's: the only
pipesgd-specific code is the import `import pipesgd.torch as hvd` and the optional --method
plumbing, and every hvd.* it uses is Horovod's API.
"""
import ast
import gzip
import os
import re
import struct
import subprocess

import pytest

from psgd_testlib import MPIRUN, PYTHON, SOURCE, clean_env

SCRIPT = os.path.join(SOURCE, "examples", "python", "pytorch_mnist.py")
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
TRAIN, TEST = 2048, 512

# Horovod's torch API the script may use (horovod.torch's names).
HOROVOD_API = {
    "init", "shutdown", "rank", "size", "local_rank", "local_size", "allreduce", "allreduce_", "allgather",
    "broadcast", "broadcast_", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "DistributedOptimizer", "Compression", "Average", "Sum", "Adasum", "join", "synchronize", "poll",
    "allreduce_async", "allreduce_async_", "nccl_built", "mpi_threads_supported",
}


def _cut_idx(source, destination, count):
    """The first `count` records of a gzipped IDX file, written uncompressed."""
    with gzip.open(source, "rb") as f:
        header = f.read(4)
        dims = list(struct.unpack(">" + "I" * header[3], f.read(4 * header[3])))
        record = 1
        for d in dims[1:]:
            record *= d
        data = f.read(count * record)
    dims[0] = count
    with open(destination, "wb") as f:
        f.write(header + struct.pack(">" + "I" * len(dims), *dims) + data)


@pytest.fixture(scope="module")
def small_fashion_mnist(tmp_path_factory):
    if not os.path.isdir(FASHION_MNIST):
        pytest.skip(f"{FASHION_MNIST} (Debian's dataset-fashion-mnist) is not installed")
    source = tmp_path_factory.mktemp("fashion-mnist-cut")
    for name, count in (("train-images-idx3-ubyte", TRAIN), ("train-labels-idx1-ubyte", TRAIN),
                        ("t10k-images-idx3-ubyte", TEST), ("t10k-labels-idx1-ubyte", TEST)):
        _cut_idx(os.path.join(FASHION_MNIST, name + ".gz"), source / name, count)
    return source


@pytest.mark.parametrize("extra", [[], ["--method", "pipe", "--fp16-allreduce"]],
                         ids=["horovod-defaults", "method-pipe-fp16"])
def test_script_runs_to_completion_under_mpirun(small_fashion_mnist, tmp_path, extra):
    command = [MPIRUN, "-np", "2", "--oversubscribe", PYTHON, SCRIPT, "--epochs", "1", "--batch-size", "64",
               "--log-interval", "8", "--data-source", str(small_fashion_mnist), "--data-dir", str(tmp_path)] + extra
    result = subprocess.run(command, capture_output=True, text=True, timeout=110, env=clean_env(), cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    accuracy = re.findall(r"^test accuracy: (\d+\.\d\d)%$", result.stdout, re.MULTILINE)
    assert len(accuracy) == 1, output  # rank 0 only
    assert 20.0 < float(accuracy[0]) <= 100.0, output  # learned something in 32 steps (10 classes)
    assert re.search(r"^Train Epoch: 1 \[0/1024 ", result.stdout, re.MULTILINE), output  # 2 ranks' shards


def _pipesgd_mentions(tree):
    """(line, what) of every mention of pipesgd in code (not comments): imports, names, attributes,
    string constants."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any("pipesgd" in (n or "") for n in names):
                found.append((node.lineno, "import"))
        elif isinstance(node, ast.Name) and "pipesgd" in node.id.lower():
            found.append((node.lineno, "name " + node.id))
        elif isinstance(node, ast.Attribute) and "pipesgd" in node.attr.lower():
            found.append((node.lineno, "attribute " + node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "pipesgd" in node.value.lower():
            found.append((node.lineno, "string"))
    return found


def test_script_is_horovods_but_for_the_import():
    with open(SCRIPT) as f:
        source = f.read()
    tree = ast.parse(source)
    lines = source.splitlines()
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
               and any("pipesgd" in (a.name or "") for a in n.names)]
    assert [lines[n.lineno - 1].strip() for n in imports] == ["import pipesgd.torch as hvd"]
    assert not any(isinstance(n, ast.ImportFrom) and "pipesgd" in (n.module or "") for n in ast.walk(tree))

    # The --method plumbing: its add_argument call and the keyword dict passed to DistributedOptimizer.
    allowed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value in ("--method",):
            allowed.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "ArgumentParser":
            allowed.update(range(node.lineno, node.end_lineno + 1))  # its description names the package
    docstring = tree.body[0]
    assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)
    allowed.update(range(docstring.lineno, docstring.end_lineno + 1))
    allowed.update(n.lineno for n in imports)
    stray = [(line, what, lines[line - 1].strip()) for line, what in _pipesgd_mentions(tree) if line not in allowed]
    assert stray == [], f"pipesgd-specific code beyond the import and --method: {stray}"

    # Every hvd.* is Horovod's API, and DistributedOptimizer gets Horovod's arguments plus **method_kwargs.
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "hvd"}
    assert used and used <= HOROVOD_API, used - HOROVOD_API
    calls = [n for n in ast.walk(tree)
             if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "DistributedOptimizer"]
    assert len(calls) == 1
    keywords = {k.arg for k in calls[0].keywords}
    assert None in keywords, "the --method plumbing: **method_kwargs"
    assert keywords - {None} <= {"named_parameters", "compression", "op", "gradient_predivide_factor",
                                 "backward_passes_per_step"}
    method_lines = [line for line in lines if "method" in line and not line.lstrip().startswith("#")]
    assert any("args.method" in line for line in method_lines)
