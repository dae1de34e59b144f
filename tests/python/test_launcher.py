"""pipesgdrun (pipesgd.run): the mpirun command it builds, --dry-run, and a real 2-rank launch
(run by pytest alone; the launches are child processes)."""
import os
import re
import signal
import subprocess
import time

import pytest

from pipesgd import run as launcher
from psgd_testlib import PIPESGDRUN, PYTHON, clean_env
from psgd_testlib import run as run_child


def command(argv, environ=None, cpu_count=2, euid=1000):
    args = launcher._parser().parse_args(argv)
    return launcher.mpirun_command(args, environ={} if environ is None else environ, cpu_count=cpu_count, euid=euid)


def exported(cmd):
    return [cmd[i + 1] for i, item in enumerate(cmd) if item == "-x"]


def test_basic_command():
    cmd = command(["-np", "2", PYTHON, "train.py", "--epochs", "3"])
    assert cmd[:3] == ["mpirun", "-np", "2"]
    assert cmd[-4:] == [PYTHON, "train.py", "--epochs", "3"]
    assert "--oversubscribe" not in cmd and "--allow-run-as-root" not in cmd
    assert cmd[cmd.index("--bind-to") + 1] == "none"


def test_root_allows_run_as_root():
    assert "--allow-run-as-root" in command(["-np", "2", PYTHON, "x.py"], euid=0)
    assert "--allow-run-as-root" not in command(["-np", "2", PYTHON, "x.py"], euid=1000)


def test_more_ranks_than_cores_oversubscribes():
    assert "--oversubscribe" in command(["-np", "3", PYTHON, "x.py"], cpu_count=2)
    assert "--oversubscribe" not in command(["-np", "2", PYTHON, "x.py"], cpu_count=2)
    assert "--oversubscribe" in command(["-np", "2", "--oversubscribe", PYTHON, "x.py"], cpu_count=8)
    # With hosts given, the slots are theirs to count: no automatic oversubscription.
    assert "--oversubscribe" not in command(["-np", "3", "-H", "a:2,b:2", PYTHON, "x.py"], cpu_count=2)


def test_hosts_are_passed():
    cmd = command(["-np", "4", "-H", "host1:2,host2:2", PYTHON, "x.py"])
    assert cmd[cmd.index("-H") + 1] == "host1:2,host2:2"
    cmd = command(["-np", "4", "--hostfile", "hosts.txt", PYTHON, "x.py"])
    assert cmd[cmd.index("--hostfile") + 1] == "hosts.txt"
    assert "-H" not in command(["-np", "2", PYTHON, "x.py"])


def test_environment_is_exported():
    environ = {"PYTHONPATH": "/somewhere", "OMP_NUM_THREADS": "1", "PIPESGD_TIMEOUT": "30", "HOME": "/root",
               "LD_LIBRARY_PATH": "/lib"}
    cmd = command(["-np", "2", PYTHON, "x.py"], environ=environ)
    assert sorted(exported(cmd)) == ["LD_LIBRARY_PATH", "OMP_NUM_THREADS", "PIPESGD_TIMEOUT", "PYTHONPATH"]
    assert "-x" not in command(["-np", "2", PYTHON, "x.py"], environ={"HOME": "/root"})
    # The -x options come before the command, which ends the list untouched.
    assert cmd.index("-x") < cmd.index(PYTHON) and cmd[-2:] == [PYTHON, "x.py"]


def test_mpi_args_are_passed():
    cmd = command(["-np", "2", "--mpi-args", "--mca btl self,tcp", PYTHON, "x.py"])
    assert cmd[-5:] == ["--mca", "btl", "self,tcp", PYTHON, "x.py"]


def test_dry_run_prints_the_command():
    result = run_child([PIPESGDRUN, "--dry-run", "-np", "2", PYTHON, "x.py"], timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    words = lines[0].split()
    assert words[:3] == ["mpirun", "-np", "2"] and words[-2:] == [PYTHON, "x.py"]
    assert "PYTHONPATH" in exported(words)


def test_pipesgdrun_launches_two_ranks(tmp_path):
    # Each rank writes its own file: mpirun forwards the ranks' stdout in pieces that can interleave
    # mid-line ("sizesize 2 rank 1" was seen in CI), so stdout is no place to count ranks.
    script = ("import sys, pipesgd.torch as hvd; hvd.init(); "
              "open(f'{sys.argv[1]}/rank{hvd.rank()}', 'w').write(f'size {hvd.size()} rank {hvd.rank()}')")
    env = clean_env()
    env.pop("PYTHONPATH")  # pipesgdrun puts its own package on the path
    if os.geteuid() == 0:  # pipesgdrun's --allow-run-as-root must be what lets mpirun run
        env.pop("OMPI_ALLOW_RUN_AS_ROOT")
        env.pop("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
    result = run_child([PIPESGDRUN, "-np", "2", PYTHON, "-c", script, str(tmp_path)], timeout=100, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    written = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert written == {"rank0": "size 2 rank 0", "rank1": "size 2 rank 1"}, (written, result.stdout + result.stderr)


# Ctrl-C: the terminal signals the whole process group (pipesgdrun, mpirun, the ranks); mpirun ends
# the job and exits 1, and pipesgdrun exits 130 after one line (a shell script running it stops: the
# README's blocks are run so). A signal to pipesgdrun alone reaches mpirun FORWARD_AFTER_S later.
SLEEPING_RANK = ("import os, sys, time; rank = os.environ['OMPI_COMM_WORLD_RANK']; "
                 "open(f'{sys.argv[1]}/rank{rank}', 'w').write(str(os.getpid())); time.sleep(300)")


def start_sleeping_ranks(tmp_path, restarts):
    child = subprocess.Popen([PIPESGDRUN, "--restarts", str(restarts), "-np", "2", PYTHON, "-c", SLEEPING_RANK,
                              str(tmp_path)], env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 100
    while len(list(tmp_path.glob("rank*"))) < 2:
        assert child.poll() is None and time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)
    time.sleep(0.5)  # both pids written
    return child, [int(path.read_text()) for path in tmp_path.glob("rank*")]


def assert_ranks_gone(pids):
    deadline = time.monotonic() + 30
    for pid in pids:
        while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
            assert time.monotonic() < deadline, f"rank process {pid} still runs"
            time.sleep(0.1)


@pytest.mark.parametrize("restarts", [0, 1])
def test_ctrl_c_ends_the_job_and_exits_130(tmp_path, restarts):
    child, pids = start_sleeping_ranks(tmp_path, restarts)
    os.killpg(child.pid, signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, (child.returncode, err)
    assert re.fullmatch(r"pipesgdrun: interrupted by SIGINT: the job stopped \(mpirun exit status [1-9]\d*\)",
                        err.strip().splitlines()[-1]), err
    assert_ranks_gone(pids)


def test_a_signal_to_pipesgdrun_alone_reaches_the_job(tmp_path):
    child, pids = start_sleeping_ranks(tmp_path, 0)
    started = time.monotonic()
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 143, (child.returncode, err)
    assert time.monotonic() - started >= launcher.FORWARD_AFTER_S, "forwarded at once: mpirun would get it twice"
    assert err.strip().splitlines()[-1].startswith("pipesgdrun: interrupted by SIGTERM: the job stopped"), err
    assert_ranks_gone(pids)


# --restarts: the relaunch rule, the environment each launch gets, and a real relaunch of a
# `pipesgd train` job whose rank is killed: the job resumes from its newest commit and ends with the
# weights of a run never interrupted.
class Args:
    def __init__(self, restarts, np_=2, hosts=None, min_np=None, max_np=None, script=None, slots=None):
        self.restarts, self.np, self.hosts, self.hostfile = restarts, np_, hosts, None
        self.oversubscribe, self.mpi_args, self.verbose, self.command = False, "", False, ["true"]
        self.min_np, self.max_np = min_np, max_np
        self.host_discovery_script, self.slots = script, slots


def test_relaunch_rule():
    assert launcher.should_relaunch(137, attempt=0, restarts=1, interrupted=False)
    assert not launcher.should_relaunch(137, attempt=1, restarts=1, interrupted=False)  # used up
    assert not launcher.should_relaunch(0, attempt=0, restarts=1, interrupted=False)
    assert not launcher.should_relaunch(2, attempt=0, restarts=3, interrupted=False)  # a usage error
    assert not launcher.should_relaunch(1, attempt=0, restarts=3, interrupted=True)  # the user stopped it


def test_each_launch_is_told_its_attempt_and_the_failures_before():
    launches = []
    codes = iter([137, 1, 0])
    clock = iter([10.0, 12.5, 20.0, 21.0, 30.0, 31.0])

    def launch(command, env):
        launches.append({k: env[k] for k in env if k.startswith("PIPESGD_RESTART")})
        assert "PIPESGD_RESTART_FAILURES" in command  # exported with -x to every rank
        return next(codes)

    import io
    err = io.StringIO()
    assert launcher.run_with_restarts(Args(2), environ={}, launch=launch, clock=lambda: next(clock), err=err) == 0
    assert [entry["PIPESGD_RESTART"] for entry in launches] == ["0", "1", "2"]
    assert {entry["PIPESGD_RESTARTS"] for entry in launches} == {"2"}
    import json
    assert json.loads(launches[0]["PIPESGD_RESTART_FAILURES"]) == []
    failures = json.loads(launches[2]["PIPESGD_RESTART_FAILURES"])
    assert [(f["attempt"], f["exit_code"], f["failed_at_unix_s"]) for f in failures] == [(1, 137, 12.5), (2, 1, 21.0)]
    assert err.getvalue().count("relaunching it") == 2, err.getvalue()


def test_restarts_used_up_keeps_the_exit_status():
    import io
    err = io.StringIO()
    status = launcher.run_with_restarts(Args(1), environ={}, launch=lambda command, env: 137, clock=lambda: 0.0, err=err)
    assert status == 137
    assert "--restarts 1 are used up" in err.getvalue()
    assert launcher.run_with_restarts(Args(3), environ={}, launch=lambda command, env: 2, clock=lambda: 0.0,
                                      err=err) == 2  # a usage error is not relaunched


def test_negative_restarts_is_refused():
    result = run_child([PIPESGDRUN, "--restarts", "-1", "-np", "2", PYTHON, "x.py"], timeout=60)
    assert result.returncode == 2 and "--restarts must be >= 0" in result.stderr, result.stderr


def test_killed_rank_is_relaunched_and_the_job_resumes_exactly(tmp_path):
    import json
    from psgd_testlib import CLI
    common = ["train", "--transport", "mpi", "--algo", "pipe", "--iters", "80", "--data", "synthetic", "--no-eval",
              "--quiet"]
    env = clean_env(OMP_NUM_THREADS="1")
    whole = run_child([PIPESGDRUN, "-np", "2", CLI] + common + ["--out", str(tmp_path / "whole")], timeout=200, env=env)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    killed = run_child([PIPESGDRUN, "--restarts", "1", "-np", "2", CLI] + common +
                       ["--out", str(tmp_path / "killed"), "--checkpoint-dir", str(tmp_path / "commits"),
                        "--checkpoint-every", "20", "--inject-fault", "rank=1,iter=50,kind=crash"], timeout=200, env=env)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "relaunching it (restart 1 of 1)" in killed.stderr, killed.stderr
    expected = json.loads((tmp_path / "whole" / "summary.json").read_text())
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["weights_checksum"] == expected["weights_checksum"]
    recoveries = summary["recoveries"]
    assert recoveries["count"] == 1, recoveries
    failure = recoveries["failures"][0]
    assert failure["rolled_back_to"] == 40 and failure["attempt"] == 1, failure
    assert "exit status" in failure["failure"], failure
    assert failure["resumed_at_unix_s"] >= failure["failed_at_unix_s"] > 0, failure
    lines = [json.loads(line) for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines if line["type"] == "iteration"] == list(range(80))
    assert [line["to_iteration"] for line in lines if line["type"] == "rollback"] == [40]


# --min-np/--max-np: a relaunch goes on with the hosts that still answer, smaller, and says so.
def test_hosts_parse_and_resize():
    assert launcher.parse_hosts("h1:2,h2,h3:1") == [("h1", 2), ("h2", 1), ("h3", 1)]
    for bad in ("h1:0", "h1:x", ":2", "h1,,h2"):
        try:
            launcher.parse_hosts(bad)
            raise AssertionError(f"accepted {bad!r}")
        except ValueError:
            pass
    hosts = [("h1", 1), ("h2", 1), ("h3", 2)]
    assert launcher.resized_world(hosts, {"h1", "h3"}, min_np=2, max_np=3) == (3, [("h1", 1), ("h3", 2)])
    assert launcher.resized_world(hosts, {"h1", "h3"}, min_np=2, max_np=2) == (2, [("h1", 1), ("h3", 2)])
    assert launcher.resized_world(hosts, {"h2"}, min_np=2, max_np=4) is None


def test_a_lost_host_is_left_out_of_the_relaunch():
    import io
    import json
    commands, failures = [], []
    codes = iter([137, 0])

    def launch(command, env):
        commands.append(command)
        failures.append(json.loads(env["PIPESGD_RESTART_FAILURES"]))
        return next(codes)

    err = io.StringIO()
    args = Args(1, np_=3, hosts="h1:1,h2:1,h3:1", min_np=2, max_np=3)
    status = launcher.run_with_restarts(args, environ={}, launch=launch, clock=lambda: 1.0, err=err,
                                        probe=lambda host, environ: host != "h2")
    assert status == 0, err.getvalue()
    assert commands[0][commands[0].index("-np") + 1] == "3"
    assert commands[1][commands[1].index("-np") + 1] == "2"
    assert commands[1][commands[1].index("-H") + 1] == "h1:1,h3:1"
    assert "relaunching it on 2 ranks (h1:1,h3:1; lost: h2) (restart 1 of 1)" in err.getvalue(), err.getvalue()
    assert failures[1][0]["np"] == 2 and failures[1][0]["lost_hosts"] == ["h2"], failures
    assert failures[1][0]["added_hosts"] == [], failures  # -H brings no host in


def test_too_few_hosts_left_stops_with_one_line():
    import io
    err = io.StringIO()
    args = Args(2, np_=2, hosts="h1:1,h2:1", min_np=2, max_np=2)
    status = launcher.run_with_restarts(args, environ={}, launch=lambda command, env: 137, clock=lambda: 1.0, err=err,
                                        probe=lambda host, environ: host == "h1")
    assert status == 137
    assert "hold fewer than --min-np 2 ranks" in err.getvalue() and "lost: h2" in err.getvalue(), err.getvalue()


def test_min_np_needs_restarts_and_hosts():
    for argv, message in ((["--min-np", "1", "-np", "2", "x"],
                           "--min-np needs --restarts R and -H or --host-discovery-script"),
                          (["--max-np", "3", "-np", "2", "x"], "--max-np needs --min-np"),
                          (["--restarts", "1", "-H", "a:1,b:1", "--min-np", "3", "-np", "2", "x"],
                           "need 1 <= --min-np <= -np <= --max-np")):
        result = run_child([PIPESGDRUN] + argv, timeout=60)
        assert result.returncode == 2 and message in result.stderr, (argv, result.stderr)


# --host-discovery-script: Horovod's contract (an executable printing HOST or HOST:SLOTS a line), run
# before the first launch and each relaunch; a host it prints in place of a lost one replaces it.
def test_discovered_hosts_parse():
    parse = launcher.parse_discovered_hosts
    assert parse("h1:2\nh2\n\n  h3:1 \nh1:2\n") == [("h1", 2), ("h2", 1), ("h3", 1)]  # a repeat counts once
    assert parse("h1\nh2:3\n", default_slots=4) == [("h1", 4), ("h2", 3)]  # --slots-per-host
    for text, line in (("h1\nh1:0\n", "line 2 'h1:0'"), ("h1:x", "line 1 'h1:x'"), (":2", "line 1 ':2'"),
                       ("h1 h2", "line 1 'h1 h2'"), ("h1,h2", "line 1 'h1,h2'"), ("h1:2\nh1:3", "line 2 'h1:3'"),
                       ("Traceback (most recent call last):", "line 1 'Traceback"), ("\n \n", "printed no host")):
        try:
            launcher.parse_discovered_hosts(text)
            raise AssertionError(f"accepted {text!r}")
        except ValueError as error:
            assert line in str(error), (text, str(error))


def test_discovered_world_keeps_the_old_hosts_first_and_names_only_the_hosts_filled():
    world = launcher.discovered_world
    printed = [("h4", 2), ("h1", 1), ("h3", 1)]
    everyone = {"h1", "h3", "h4"}
    # The first launch: the script's order, cut to -np (mpirun --map-by slot fills h4 first).
    assert world(printed, everyone, [], want=3, min_np=2) == (3, [("h4", 2), ("h1", 1)])
    assert world(printed, everyone, [], want=2, min_np=2) == (2, [("h4", 2)])
    # A relaunch: the survivors keep their place (rank 0 stays on h1), the new hosts follow.
    assert world(printed, everyone, [("h1", 1), ("h2", 1)], want=2, min_np=2) == (2, [("h1", 1), ("h4", 1)])
    assert world(printed, everyone, [("h1", 1), ("h2", 1)], want=9, min_np=2) == (4, [("h1", 1), ("h4", 2),
                                                                                     ("h3", 1)])
    # Printed but silent: left out; too few slots: None.
    assert world(printed, {"h1", "h3"}, [("h1", 1)], want=4, min_np=2) == (2, [("h1", 1), ("h3", 1)])
    assert world(printed, {"h1"}, [("h1", 1)], want=4, min_np=2) is None
    assert launcher.host_changes([("h1", 1), ("h2", 1)], [("h1", 2), ("h3", 1)]) == (["h2"], ["h3"])
    assert launcher.host_changes([("h1", 1)], [("h1", 1)]) == ([], [])


def discovery_script(tmp_path, *outputs, then="exit 0"):
    """An executable printing outputs[k] on its k-th run (counted in a file), then running `then`
    past the last one; returns (path, a function giving how many times it ran)."""
    counter = tmp_path / "runs"
    counter.write_text("0")
    cases = "".join(f"  {k}) printf '{text}' ;;\n" for k, text in enumerate(outputs))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nk=$(cat '{counter}')\necho $((k + 1)) >'{counter}'\n"
                      f"case $k in\n{cases}  *) {then} ;;\nesac\n")
    script.chmod(0o755)
    return str(script), lambda: int(counter.read_text())


def relaunches(args, codes, probe=lambda host, environ: True, on_launch=lambda: None):
    """run_with_restarts with a fake mpirun exiting with `codes` in turn (calling on_launch first):
    (status, the -np and -H of each launch, the failure records each launch saw, stderr)."""
    import io
    import json
    launches, records = [], []
    codes = iter(codes)

    def launch(command, env):
        launches.append((command[command.index("-np") + 1], command[command.index("-H") + 1]))
        records.append(json.loads(env["PIPESGD_RESTART_FAILURES"]))
        on_launch()
        return next(codes)

    err = io.StringIO()
    status = launcher.run_with_restarts(args, environ={}, launch=launch, clock=lambda: 1.0, err=err, probe=probe)
    return status, launches, records, err.getvalue()


def test_a_host_the_script_prints_replaces_a_lost_one(tmp_path):
    script, runs = discovery_script(tmp_path, "h1\\nh2\\n", "h1\\nh3\\n", "h1\\nh3\\nh4\\n")
    args = Args(2, np_=2, min_np=2, max_np=2, script=script)
    status, launches, records, err = relaunches(args, [137, 0])
    assert status == 0, err
    assert launches == [("2", "h1:1,h2:1"), ("2", "h1:1,h3:1")], launches
    assert "relaunching it on 2 ranks (h1:1,h3:1; lost: h2; added: h3) (restart 1 of 2)" in err, err
    assert records[0] == [] and records[1][0]["lost_hosts"] == ["h2"] and records[1][0]["added_hosts"] == ["h3"]
    assert records[1][0]["np"] == 2, records
    assert runs() == 2, "the script runs once per launch"


def test_a_printed_host_that_does_not_answer_is_left_out(tmp_path):
    # h2 dies during the first launch and the script still prints it: h3, new, takes its place; a
    # second failure grows the job to --max-np 3 with h4, which the script prints by then.
    script, runs = discovery_script(tmp_path, "h1\\nh2\\n", "h1\\nh2\\nh3\\n", "h1\\nh3\\nh4\\n")
    silent = set()
    args = Args(2, np_=2, min_np=2, max_np=3, script=script)
    status, launches, records, err = relaunches(args, [137, 1, 0], probe=lambda host, environ: host not in silent,
                                                on_launch=lambda: silent.add("h2"))
    assert status == 0, err
    assert launches == [("2", "h1:1,h2:1"), ("2", "h1:1,h3:1"), ("3", "h1:1,h3:1,h4:1")], launches
    assert "relaunching it on 2 ranks (h1:1,h3:1; lost: h2; added: h3; not answering: h2) (restart 1 of 2)" in err
    assert "relaunching it on 3 ranks (h1:1,h3:1,h4:1; added: h4) (restart 2 of 2)" in err, err
    assert [(r["lost_hosts"], r["added_hosts"]) for r in records[2]] == [(["h2"], ["h3"]), ([], ["h4"])], records
    assert runs() == 3


def test_the_first_launch_uses_the_printed_hosts_that_answer(tmp_path):
    script, runs = discovery_script(tmp_path, "h1:2\\nh2\\nh3\\n")
    args = Args(1, np_=4, min_np=2, max_np=4, script=script)
    status, launches, _, err = relaunches(args, [0], probe=lambda host, environ: host != "h2")
    assert status == 0 and launches == [("3", "h1:2,h3:1")] and runs() == 1, (launches, err)
    assert err.strip() == "pipesgdrun: launching on 3 ranks (h1:2,h3:1; not answering: h2), not -np 4: all the " \
                          "slots of the hosts that answer", err


def test_a_failing_script_stops_the_job_with_one_line(tmp_path):
    for n, (then, expected) in enumerate((("echo 'no inventory' >&2; exit 3", "exit status 3 (no inventory)"),
                                          ("echo 'h1 slots=2'", "line 1 'h1 slots=2' is not HOST or HOST:SLOTS"),
                                          ("true", "printed no host"))):
        directory = tmp_path / str(n)
        directory.mkdir()
        script, runs = discovery_script(directory, "h1\\nh2\\n", then=then)
        status, launches, _, err = relaunches(Args(3, np_=2, min_np=1, script=script), [137, 0])
        assert status == 137 and len(launches) == 1 and runs() == 2, (then, status, launches, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and f"--host-discovery-script {script}: {expected}" in lines[0], (then, err)
        assert "the job failed (exit status 137) and is not relaunched" in lines[0], err
    # Before the first launch: nothing is launched, exit status 1.
    script, _ = discovery_script(tmp_path, then="exit 4")
    status, launches, _, err = relaunches(Args(1, np_=2, min_np=1, script=script), [0])
    assert status == 1 and launches == [] and f"--host-discovery-script {script}: exit status 4" in err, err


def test_too_few_answering_hosts_stop_the_job(tmp_path):
    # Before the first launch: the hosts are asked too; too few that answer launch nothing.
    script, _ = discovery_script(tmp_path, "h1\\nh2\\n")
    status, launches, _, err = relaunches(Args(2, np_=2, min_np=2, script=script), [0],
                                          probe=lambda host, environ: host == "h1")
    assert status == 1 and launches == [], (launches, err)
    assert f"the hosts --host-discovery-script {script} printed that answer (h1:1; not answering: h2) hold fewer " \
           "than --min-np 2 ranks" in err, err
    # At a relaunch: the job stops with mpirun's exit status.
    script, _ = discovery_script(tmp_path, "h1\\nh2\\n", "h1\\n")
    status, launches, _, err = relaunches(Args(2, np_=2, min_np=2, script=script), [137, 0])
    assert status == 137 and len(launches) == 1, (launches, err)
    assert "the job failed (exit status 137) and the hosts --host-discovery-script" in err, err
    assert "(h1:1) hold fewer than --min-np 2 ranks" in err, err


def test_a_script_past_its_timeout_is_killed(tmp_path):
    script = tmp_path / "slow.sh"
    script.write_text("#!/bin/sh\necho h1\nsleep 60\necho h2\n")  # sleep, a child, holds stdout open
    script.chmod(0o755)
    try:
        launcher.discover_hosts(str(script), 1, {"PATH": os.environ["PATH"]}, timeout=0.5)
        raise AssertionError("a script past its timeout was accepted")
    except launcher.DiscoveryError as error:
        assert str(error) == f"--host-discovery-script {script}: still running after 0.5 s (killed)", str(error)


def test_host_discovery_script_parser_errors(tmp_path, capsys):
    script, _ = discovery_script(tmp_path, "h1\\n")
    plain = tmp_path / "plain.sh"
    plain.write_text("echo h1\n")  # not executable
    for argv, message in (
            (["-H", "a:1,b:1"], "--host-discovery-script and -H are mutually exclusive"),
            (["--hostfile", "hosts.txt"], "--host-discovery-script and --hostfile are mutually exclusive"),
            (["--restarts", "0"], "--host-discovery-script needs --restarts R and --min-np N"),
            (["--min-np", None], "--host-discovery-script needs --restarts R and --min-np N"),
            (["--host-discovery-script", str(plain)], f"--host-discovery-script: '{plain}' is not an executable file"),
            (["--slots-per-host", "0"], "--slots-per-host must be >= 1, got 0"),
            (["--min-np", "3"], "need 1 <= --min-np <= -np <= --max-np, got 3, 2, 2")):
        options = {"--restarts": "1", "--min-np": "1", "--host-discovery-script": script}
        extra = []
        for name, value in zip(argv[::2], argv[1::2]):
            if name in options:
                options[name] = value
            else:
                extra += [name, value]
        full = [word for name, value in options.items() if value is not None for word in (name, value)]
        try:
            launcher.main(full + extra + ["-np", "2", "x"])
            raise AssertionError(f"accepted {argv}")
        except SystemExit as exit_:
            assert exit_.code == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[-1].startswith(f"pipesgdrun: error: {message}"), (argv, lines)
    try:
        launcher.main(["--slots", "2", "-np", "2", "x"])
        raise AssertionError("accepted --slots without a script")
    except SystemExit as exit_:
        assert exit_.code == 2
    assert "--slots-per-host needs --host-discovery-script" in capsys.readouterr().err


def test_dry_run_shows_the_discovered_hosts(tmp_path, capsys):
    script, _ = discovery_script(tmp_path, "h1:2\\nh2\\nh3:4\\n")
    assert launcher.main(["--dry-run", "--restarts", "1", "--min-np", "2", "-np", "3", "--host-discovery-script",
                          script, "x"]) == 0
    words = capsys.readouterr().out.split()
    assert words[words.index("-np") + 1] == "3" and words[words.index("-H") + 1] == "h1:2,h2:1", words
