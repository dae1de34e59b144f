"""Errors of pipesgd.torch (run by pytest alone; the worlds under test are child processes).

* hvd.rank() before hvd.init() is a ValueError (a fresh interpreter, no launcher); so is
  hvd.init(servers=1) without a launcher.
* A rank that dies: under mpirun -np 2, rank 1 raises an uncaught RuntimeError("boom") after 2
  steps; rank 0's next step must raise pipesgd.PeerFailedError (a CommError) naming rank 1 and
  "boom" well within init(timeout=20), and the whole run must end (no hang).
* An uncaught exception in an interactive interpreter (python -i, the REPL: sys.excepthook runs and
  the process goes on) must not leave pipesgd.torch crashing (SIGSEGV) on the next call.
* A method option the C++ checks refuse is named as the Python caller wrote it (staleness=,
  warmup_iters=, ...), never as the CLI's flag (--staleness-k).
"""
import re
import subprocess
import sys
import textwrap

import pytest

from psgd_testlib import MPIRUN, PYTHON, clean_env, run


def test_rank_before_init_raises_value_error():
    script = textwrap.dedent("""
        import pipesgd.torch as hvd
        assert not hvd.is_initialized() and not hvd.is_worker()
        for call in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size):
            try:
                call()
            except ValueError as error:
                print(call.__name__, "ValueError:", error)
            else:
                print(call.__name__, "returned")
    """)
    result = run([PYTHON, "-c", script], timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["rank", "size", "local_rank", "local_size"]
    for line in lines:
        assert "ValueError:" in line and "hvd.init()" in line, line


def test_servers_without_a_launcher_raise_value_error():
    script = textwrap.dedent("""
        import pipesgd.torch as hvd
        try:
            hvd.init(servers=1)
        except ValueError as error:
            print("ValueError:", error)
        print("initialized:", hvd.is_initialized())
    """)
    result = run([PYTHON, "-c", script], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "ValueError: servers=1" in result.stdout and "pipesgdrun" in result.stdout, result.stdout
    assert "initialized: False" in result.stdout


_DYING_RANK = textwrap.dedent("""
    import sys
    import torch
    import torch.nn.functional as F
    import pipesgd
    import pipesgd.torch as hvd

    hvd.init(timeout=20)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), method=sys.argv[1])
    for step in range(10):
        if hvd.rank() == 1 and step == 2:
            raise RuntimeError("boom")  # uncaught: the rank dies after 2 steps
        F.cross_entropy(model(torch.randn(5, 4)), torch.randint(0, 2, (5,))).backward()
        try:
            opt.step()
        except pipesgd.CommError as error:
            print(f"RANK0-CAUGHT {type(error).__name__} "
                  f"peer={isinstance(error, pipesgd.PeerFailedError)} at step {step}: {error}", flush=True)
            sys.exit(3)
        print(f"rank {hvd.rank()} stepped {step}", flush=True)
    print("RANK0-NO-ERROR", flush=True)
""")


@pytest.mark.parametrize("method", ["dsync", "pipe"])
def test_a_dying_rank_fails_its_peer_with_peer_failed_error(tmp_path, method):
    script = tmp_path / "dying_rank.py"
    script.write_text(_DYING_RANK)
    try:
        result = subprocess.run([MPIRUN, "-np", "2", "--oversubscribe", PYTHON, str(script), method],
                                capture_output=True, text=True, timeout=100, env=clean_env())
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the run hung (no end within 100 s): {expired.stdout!r} {expired.stderr!r}")
    output = result.stdout + result.stderr
    assert "RuntimeError: boom" in result.stderr, output  # rank 1's traceback
    caught = [line for line in result.stdout.splitlines() if line.startswith("RANK0-CAUGHT")]
    assert len(caught) == 1, output
    line = caught[0]
    assert line.startswith("RANK0-CAUGHT PeerFailedError peer=True"), line
    assert "rank 1" in line and "boom" in line, line
    assert "RANK0-NO-ERROR" not in output
    assert result.returncode != 0
    print(line, file=sys.stderr)


# Fed to `python -i` on stdin: each statement is run as typed at the prompt (compound statements end
# with a blank line), and an uncaught exception goes to sys.excepthook, which pipesgd.torch
# replaced, and the session goes on.
_INTERACTIVE = """
import torch
import pipesgd.torch as hvd
hvd.init()
model = torch.nn.Linear(2, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
print("BEFORE rank", hvd.rank(), flush=True)
a_name_that_is_not_defined
def attempt(what, call):
    try:
        print("AFTER", what, "returned", call(), flush=True)
    except Exception as error:
        print("AFTER", what, "raised", type(error).__name__, error, flush=True)

attempt("rank", hvd.rank)
attempt("allreduce", lambda: hvd.allreduce(torch.ones(2)))
model(torch.ones(1, 2)).sum().backward()
attempt("step", opt.step)
print("END", flush=True)
"""


def test_uncaught_exception_in_an_interactive_session_does_not_crash():
    """After an uncaught exception at the prompt, hvd.rank(), hvd.allreduce and opt.step() either
    work or raise a Python exception; the interpreter must not die of a segmentation fault."""
    result = run([PYTHON, "-i"], input=_INTERACTIVE, timeout=60)
    output = result.stdout + result.stderr
    assert "BEFORE rank 0" in result.stdout, output
    assert "NameError" in result.stderr, output
    assert result.returncode == 0, f"the interpreter died (status {result.returncode}): {output}"
    for what in ("rank", "allreduce", "step"):
        assert re.search(rf"^(>>> )*AFTER {what} (returned|raised)", result.stdout, re.MULTILINE), output
    assert "END" in result.stdout, output


def test_torchrun_style_launch_is_refused_naming_the_variables():
    """Two processes started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT;
    no MPI launcher): each refuses in init() with one line, instead of training alone."""
    script = textwrap.dedent("""
        import pipesgd.torch as hvd
        try:
            hvd.init()
        except RuntimeError as error:
            print("RuntimeError:", error)
        print("initialized:", hvd.is_initialized())
    """)
    children = []
    for rank in range(2):
        env = clean_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
        children.append(subprocess.Popen([PYTHON, "-c", script], env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))
    for rank, child in enumerate(children):
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        lines = [line for line in out.splitlines() if line.startswith("RuntimeError:")]
        assert len(lines) == 1, out
        assert f"RANK={rank} WORLD_SIZE=2 LOCAL_RANK={rank}" in lines[0] and "MASTER_ADDR=127.0.0.1" in lines[0]
        assert "pipesgdrun -np N" in lines[0]
        assert "initialized: False" in out
    # A torchrun world of one process is a world of one.
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    result = run([PYTHON, "-c", "import pipesgd.torch as hvd; hvd.init(); print(hvd.size())"], timeout=60, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "1", result.stderr


_OPTION_ERRORS = textwrap.dedent("""
    import json, sys
    import torch
    import pipesgd.torch as hvd
    hvd.init()
    model = torch.nn.Linear(4, 2)
    cases = json.loads(sys.argv[1])
    for keywords, fused in cases:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        try:
            hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), fused_update=fused,
                                     **keywords)
        except ValueError as error:
            print("ValueError:", error)
        else:
            print("accepted:", keywords)
""")


def test_option_errors_name_the_python_keywords_not_cli_flags():
    """A method option refused by the C++ checks (which serve the CLI too) is named as the Python
    caller wrote it: staleness=, warmup_iters=, allreduce=, timeout=, never --staleness-k & co."""
    import json
    cases = [
        ({"method": "pipe", "staleness": 0}, None, ["staleness="]),
        ({"method": "pipe", "k": 0}, None, ["k="]),
        ({"method": "dsync", "warmup_iters": 5}, None, ["warmup_iters="]),
        ({"method": "dsync", "allreduce": "butterfly"}, None, ["allreduce="]),
        ({"method": "dsync", "calibration": "c.json"}, None, ["calibration=", "allreduce= auto"]),
        ({"method": "sapipe", "stale_layers": -1}, None, ["stale_layers="]),
        ({"method": "sapipe", "compensation": "zz"}, None, ["compensation="]),
        ({"method": "nocomm", "codec": "int8"}, None, ["codec="]),
        ({"method": "pipe", "warmup_epochs": 1}, None, ["warmup_epochs=", "warmup_iters="]),
        ({"method": "dsync", "timeout": -1}, True, ["timeout"]),
    ]
    result = run([PYTHON, "-c", _OPTION_ERRORS, json.dumps([[keywords, fused] for keywords, fused, _ in cases])],
                 timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(cases), result.stdout
    for (keywords, _, names), line in zip(cases, lines):
        assert line.startswith("ValueError: "), (keywords, line)
        assert "--" not in line, f"{keywords}: a CLI flag in the Python error: {line}"
        for name in names:
            assert name in line, f"{keywords}: {name!r} not in {line!r}"
