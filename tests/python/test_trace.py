"""hvd.init(trace=..., trace_iterations=...): the world's timeline (run by pytest alone; each world
is a child interpreter without a launcher, a world of one worker: Session.join_alone).

* A few pipe steps and shutdown(): the file parses; process "worker 0" has a "compute" track whose
  "step" spans are the steps 0..N-1, with "update" and "wait" spans, and a comm track with the
  allreduces.
* trace_iterations="1:3" keeps steps 1 and 2 only.
* An uncaught exception (the excepthook fails the session) still writes the events up to it, with
  the exception in otherData.failure.
* A malformed window is a ValueError naming trace_iterations, and init() then leaves the script
  uninitialised.
"""
import json
import textwrap

from psgd_testlib import PYTHON, run

_TRAIN = textwrap.dedent("""
    import sys
    import torch
    import torch.nn.functional as F
    import pipesgd.torch as hvd

    path, window, steps, fail_at = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), int(sys.argv[4])
    hvd.init(trace=path, trace_iterations=window)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), method="pipe")
    for step in range(steps):
        if step == fail_at:
            raise RuntimeError("boom")  # uncaught
        F.cross_entropy(model(torch.randn(5, 4)), torch.randint(0, 2, (5,))).backward()
        opt.step()
    hvd.shutdown()
    print("SHUT DOWN", flush=True)
""")


def _train(tmp_path, window="", steps=5, fail_at=-1):
    script = tmp_path / "train.py"
    script.write_text(_TRAIN)
    path = tmp_path / "trace.json"
    result = run([PYTHON, str(script), str(path), window, str(steps), str(fail_at)], timeout=120)
    return result, path


def _tracks(trace):
    """{thread name: [(span name, iteration)]} of process 0, and the process names."""
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault(names[(e["pid"], e["tid"])], []).append((e["name"], e["args"]["iteration"]))
    return tracks, processes


def test_init_trace_writes_the_timeline_at_shutdown(tmp_path):
    result, path = _train(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "SHUT DOWN" in result.stdout
    trace = json.loads(path.read_text())
    assert trace["otherData"] == {"dropped_events": 0}
    tracks, processes = _tracks(trace)
    assert processes == {0: "worker 0"}
    assert set(tracks) == {"compute", "comm (pipe-sgd)"}, tracks.keys()
    compute = tracks["compute"]
    assert sorted(i for name, i in compute if name == "step") == [0, 1, 2, 3, 4]
    assert {"update", "wait"} <= {name for name, _ in compute}
    assert {name for name, _ in tracks["comm (pipe-sgd)"]} == {"bucket", "allreduce"}


def test_trace_iterations_keeps_its_steps_only(tmp_path):
    result, path = _train(tmp_path, window="1:3")
    assert result.returncode == 0, result.stderr
    tracks, _ = _tracks(json.loads(path.read_text()))
    assert {i for spans in tracks.values() for _, i in spans} == {1, 2}
    assert sorted(i for name, i in tracks["compute"] if name == "step") == [1, 2]


def test_an_uncaught_exception_writes_the_trace_up_to_it(tmp_path):
    result, path = _train(tmp_path, steps=6, fail_at=3)
    assert result.returncode != 0 and "RuntimeError: boom" in result.stderr, result.stderr
    assert "SHUT DOWN" not in result.stdout
    trace = json.loads(path.read_text())
    assert trace["otherData"]["failure"] == "RuntimeError: boom"
    tracks, _ = _tracks(trace)
    assert sorted(i for name, i in tracks["compute"] if name == "step") == [0, 1, 2]


def test_a_malformed_window_is_a_value_error(tmp_path):
    script = textwrap.dedent(f"""
        import pipesgd.torch as hvd
        try:
            hvd.init(trace={str(tmp_path / "t.json")!r}, trace_iterations="7")
        except ValueError as error:
            print("ValueError:", error)
        print("initialized:", hvd.is_initialized())
    """)
    result = run([PYTHON, "-c", script], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "ValueError: trace_iterations '7': expected A:B" in result.stdout, result.stdout
    assert "initialized: False" in result.stdout
