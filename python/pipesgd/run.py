"""pipesgdrun / python3 -m pipesgd.run: horovodrun's launcher for pipesgd.torch scripts.

    pipesgdrun -np 4 /usr/bin/python3 train.py --epochs 3
    pipesgdrun -np 8 -H host1:4,host2:4 /usr/bin/python3 train.py

It runs mpirun with what the script needs: one process per rank, no core binding (LibTorch
schedules its own threads), oversubscription when the ranks exceed this machine's cores (or
always with --oversubscribe), running as root allowed when this user is root (CI machines and
containers), and the environment (PYTHONPATH, PATH, LD_LIBRARY_PATH, OMP_NUM_THREADS, PIPESGD_*)
exported to every host. Parameter-server methods: -np counts the server ranks too (the script
calls hvd.init(servers=S); the last S ranks serve).

With --restarts R, a job that fails (a rank killed, a host lost: Open MPI then ends the whole job)
is launched again, up to R times, on the same hosts. Every rank sees PIPESGD_RESTART (0 on the
first launch, k on the k-th relaunch), PIPESGD_RESTARTS (R) and PIPESGD_RESTART_FAILURES (a JSON
list of the failed launches: attempt, exit_code, failed_at_unix_s, seconds). `pipesgd train` then
resumes from the newest commit in its --checkpoint-dir (docs/user-guide.md, "Surviving failures").
A job that ends with exit status 2 (a usage error: it would fail again) or that this launcher's user
interrupted is not relaunched.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

_EXPORTED = ("PYTHONPATH", "PATH", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _parser():
    parser = argparse.ArgumentParser(
        prog="pipesgdrun", description="Run a pipesgd.torch (Horovod-style) training script on N ranks through mpirun.",
        epilog="Example: pipesgdrun -np 4 /usr/bin/python3 examples/python/pytorch_mnist.py")
    parser.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks (processes)")
    parser.add_argument("-H", "--hosts", help="hosts and their slots, e.g. host1:2,host2:2 (default: this machine)")
    parser.add_argument("--hostfile", help="an mpirun hostfile (lines 'host slots=N')")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="allow more ranks than cores (automatic on one machine when -np exceeds its cores)")
    parser.add_argument("--mpi-args", default="", help="extra arguments for mpirun, one string")
    parser.add_argument("--restarts", type=int, default=0,
                        help="relaunch a job that failed up to R times; `pipesgd train` resumes from its newest commit "
                             "(give it --checkpoint-dir)")
    parser.add_argument("--min-np", type=int,
                        help="with --restarts and -H: relaunch on the hosts that still answer, with at least this many "
                             "ranks (else stop)")
    parser.add_argument("--max-np", type=int, help="with --min-np: relaunch with at most this many ranks (default -np)")
    parser.add_argument("--dry-run", action="store_true", help="print the mpirun command instead of running it")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the mpirun command before running it")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    return parser


def mpirun_command(args, environ=None, cpu_count=None, euid=None):
    """The mpirun argument list for parsed `args` (pure: for tests)."""
    environ = os.environ if environ is None else environ
    cpu_count = (os.cpu_count() or 1) if cpu_count is None else cpu_count
    euid = os.geteuid() if euid is None else euid
    command = ["mpirun", "-np", str(args.np), "--bind-to", "none", "--map-by", "slot"]
    if euid == 0:
        command.append("--allow-run-as-root")
    if args.oversubscribe or (args.hosts is None and args.hostfile is None and args.np > cpu_count):
        command.append("--oversubscribe")
    if args.hosts:
        command += ["-H", args.hosts]
    if args.hostfile:
        command += ["--hostfile", args.hostfile]
    for name in sorted(environ):
        if name in _EXPORTED or name.startswith("PIPESGD_"):
            command += ["-x", name]
    if args.mpi_args:
        command += args.mpi_args.split()
    return command + args.command


_USAGE_ERROR = 2  # pipesgd's exit status for a usage error: a relaunch would fail the same way


def restart_environment(attempt, restarts, failures):
    """The PIPESGD_RESTART* variables of launch `attempt` (pure: for tests)."""
    return {"PIPESGD_RESTART": str(attempt), "PIPESGD_RESTARTS": str(restarts),
            "PIPESGD_RESTART_FAILURES": json.dumps(failures, separators=(",", ":"))}


def should_relaunch(exit_code, attempt, restarts, interrupted):
    """Whether a launch that ended with `exit_code` is relaunched (pure: for tests)."""
    return exit_code != 0 and exit_code != _USAGE_ERROR and not interrupted and attempt < restarts


def parse_hosts(text):
    """-H's "h1:2,h2" as [("h1", 2), ("h2", 1)] (pure: for tests)."""
    hosts = []
    for item in text.split(","):
        name, _, slots = item.strip().partition(":")
        if not name or (slots and (not slots.isdigit() or int(slots) < 1)):
            raise ValueError(f"-H: '{item}' is not HOST or HOST:SLOTS")
        hosts.append((name, int(slots) if slots else 1))
    return hosts


def hosts_text(hosts):
    return ",".join(f"{name}:{slots}" for name, slots in hosts)


def resized_world(hosts, answered, min_np, max_np):
    """The (np, hosts) of a relaunch on the hosts that answered, or None below min_np (pure)."""
    kept = [(name, slots) for name, slots in hosts if name in answered]
    np_ = min(max_np, sum(slots for _, slots in kept))
    return (np_, kept) if np_ >= min_np else None


_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def probe_host(host, environ, timeout=15):
    """Whether `host` runs a command through mpirun's rsh agent (OMPI_MCA_plm_rsh_agent, else ssh)."""
    if host in _LOCAL_NAMES or host == socket.gethostname():
        return True
    agent = (environ.get("OMPI_MCA_plm_rsh_agent") or "ssh").split()
    if os.path.basename(agent[0]) == "ssh":
        agent += ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    try:
        return subprocess.run(agent + [host, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def answering_hosts(hosts, environ, probe=probe_host):
    """The names of `hosts` that answer, probed at once."""
    answered = set()
    lock = threading.Lock()

    def check(name):
        if probe(name, environ):
            with lock:
                answered.add(name)

    threads = [threading.Thread(target=check, args=(name,)) for name, _ in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answered


def run_with_restarts(args, environ=None, launch=None, clock=time.time, err=sys.stderr, probe=probe_host):
    """Runs the job, relaunching it after a failure up to args.restarts times; returns the exit status.
    `launch(command, env)` runs one mpirun and returns its exit status (a parameter for tests)."""
    environ = dict(os.environ if environ is None else environ)
    interrupted = []

    def on_signal(number, _frame):
        interrupted.append(number)  # mpirun gets the terminal's signal too and ends the job

    if launch is None:
        def launch(command, env):
            return subprocess.run(command, env=env, check=False).returncode
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, on_signal)
    failures = []
    attempt = 0
    while True:
        environ.update(restart_environment(attempt, args.restarts, failures))
        command = mpirun_command(args, environ=environ)
        if args.verbose:
            print(" ".join(command), flush=True)
        started = clock()
        exit_code = launch(command, environ)
        if exit_code == 0:
            return 0
        ended = clock()
        if not should_relaunch(exit_code, attempt, args.restarts, bool(interrupted)):
            if exit_code != _USAGE_ERROR and not interrupted and args.restarts > 0:
                print(f"pipesgdrun: the job failed (exit status {exit_code}) and --restarts {args.restarts} are used "
                      f"up; the newest commit is still in the job's --checkpoint-dir", file=err, flush=True)
            return exit_code
        attempt += 1
        failure = {"attempt": attempt, "exit_code": exit_code, "failed_at_unix_s": ended,
                   "seconds": round(ended - started, 3)}
        where = ""
        if args.min_np is not None:
            hosts = parse_hosts(args.hosts)
            answered = answering_hosts(hosts, environ, probe)
            lost = [name for name, _ in hosts if name not in answered]
            world = resized_world(hosts, answered, args.min_np, args.max_np)
            if world is None:
                print(f"pipesgdrun: the job failed (exit status {exit_code}) and the hosts that answer "
                      f"({hosts_text([h for h in hosts if h[0] in answered]) or 'none'}; lost: {', '.join(lost)}) "
                      f"hold fewer than --min-np {args.min_np} ranks; the newest commit is still in the job's commit "
                      f"directory", file=err, flush=True)
                return exit_code
            new_np, kept = world
            if new_np != args.np or lost:
                where = f" on {new_np} rank{'s' if new_np != 1 else ''} ({hosts_text(kept)}" + \
                        (f"; lost: {', '.join(lost)})" if lost else ")")
            failure.update({"np": new_np, "lost_hosts": lost})
            args.np, args.hosts = new_np, hosts_text(kept)
        failures.append(failure)
        print(f"pipesgdrun: the job failed (exit status {exit_code}) after {ended - started:.1f} s; relaunching it"
              f"{where} (restart {attempt} of {args.restarts}): it resumes from its newest commit", file=err, flush=True)


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.np < 1:
        parser.error(f"-np must be >= 1, got {args.np}")
    if args.restarts < 0:
        parser.error(f"--restarts must be >= 0, got {args.restarts}")
    if args.max_np is not None and args.min_np is None:
        parser.error("--max-np needs --min-np")
    if args.min_np is not None:
        if args.restarts < 1 or not args.hosts:
            parser.error("--min-np needs --restarts R and -H (the hosts a relaunch chooses among)")
        args.max_np = args.np if args.max_np is None else args.max_np
        if not 1 <= args.min_np <= args.np <= args.max_np:
            parser.error(f"need 1 <= --min-np <= -np <= --max-np, got {args.min_np}, {args.np}, {args.max_np}")
        try:
            parse_hosts(args.hosts)
        except ValueError as error:
            parser.error(str(error))
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the command each rank runs, e.g. /usr/bin/python3 train.py")
    command = mpirun_command(args)
    if args.dry_run or args.verbose:
        print(" ".join(command), flush=True)
    if args.dry_run:
        return 0
    if shutil.which("mpirun") is None:
        print("pipesgdrun: mpirun not found: install openmpi-bin (bash scripts/install-deps.sh)", file=sys.stderr)
        return 127
    if args.restarts > 0:
        return run_with_restarts(args)
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
