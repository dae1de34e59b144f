"""pipesgdrun (pipesgd.run): the mpirun command it builds, --dry-run, and a real 2-rank launch
(run by pytest alone; the launches are child processes)."""
import os

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
