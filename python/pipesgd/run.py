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
list of the failed launches: attempt, exit_code, failed_at_unix_s, seconds; with --min-np also np,
lost_hosts and added_hosts). `pipesgd train` then resumes from the newest commit in its
--checkpoint-dir (docs/user-guide.md, "Surviving failures"). A job that ends with exit status 2 (a
usage error: it would fail again) or that this launcher's user interrupted is not relaunched.

A Ctrl-C (SIGINT) or SIGTERM reaches mpirun and the ranks directly (they run in this launcher's
process group); mpirun ends the job, and pipesgdrun exits with 128 + the signal (130 for Ctrl-C)
after one line, as an interrupted command does, so that a script running it stops too. A signal sent
to pipesgdrun alone is forwarded to mpirun if the job is still running 5 s later.

With --min-np N and -H, a relaunch goes on with the hosts of -H that still answer (each asked to run
`true` through mpirun's rsh agent), with as many ranks as their slots hold up to --max-np. With
--min-np N and --host-discovery-script SCRIPT instead of -H (Horovod's flag and contract: SCRIPT is
an executable that prints one available host per line, HOST or HOST:SLOTS), the hosts come from the
script: it is run before the first launch and again before each relaunch (at most 30 s each time),
the hosts it prints are asked to answer as above, and the launch uses those that do: a host it
prints in place of a lost one replaces it. Hosts already in the job keep the lowest ranks; a launch
names only the hosts its ranks fill. A script that fails, times out or prints no host or a line
that is not HOST[:SLOTS] stops the job with one line. The script is consulted at launch time only:
unlike Horovod Elastic, a running job is not watched, and a host that appears while it runs is not
added to it (only to the next relaunch, if a failure causes one).
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
        prog="pipesgdrun",
        description="Run a pipesgd.torch (Horovod-style) training script, or pipesgd train, on N ranks through mpirun; "
                    "with --restarts, relaunch a failed job (--min-np: on the hosts that answer, of -H or of "
                    "--host-discovery-script).",
        epilog="Examples: pipesgdrun -np 4 /usr/bin/python3 examples/python/pytorch_mnist.py; "
               "pipesgdrun --restarts 3 --min-np 2 -np 4 --host-discovery-script ./discover_hosts.sh "
               "build/pipesgd train --transport mpi --checkpoint-dir /shared/commits --checkpoint-every 50")
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
                        help="with --restarts and -H or --host-discovery-script: relaunch on the hosts that still "
                             "answer, with at least this many ranks (else stop)")
    parser.add_argument("--max-np", type=int, help="with --min-np: relaunch with at most this many ranks (default -np)")
    parser.add_argument("--host-discovery-script", metavar="SCRIPT",
                        help="with --restarts and --min-np, instead of -H/--hostfile: an executable printing one "
                             "available host per line, HOST or HOST:SLOTS (Horovod's contract), run before each launch "
                             "(at most 30 s); a launch uses the printed hosts that answer, so a new host replaces a "
                             "lost one. Consulted only then: no host is added to a running job")
    parser.add_argument("--slots-per-host", "--slots", dest="slots", type=int, metavar="N",
                        help="with --host-discovery-script: the slots of a host printed without :SLOTS (default 1)")
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


DISCOVERY_TIMEOUT_S = 30  # how long --host-discovery-script may run before it counts as failed


class DiscoveryError(Exception):
    """--host-discovery-script failed, timed out or printed no usable host (its message is one line)."""


def parse_discovered_hosts(text, default_slots=1):
    """The hosts a discovery script printed, one a line as HOST or HOST:SLOTS, as [(host, slots)] in
    their order (pure: for tests). Blank lines are skipped, a host printed twice with the same slots
    counts once; anything else that is not HOST[:SLOTS] raises ValueError naming the line."""
    hosts, slots_of = [], {}
    for number, line in enumerate(text.splitlines(), start=1):
        item = line.strip()
        if not item:
            continue
        name, colon, slots = item.partition(":")
        if (not name or any(c.isspace() or c == "," for c in name)
                or (colon and not (slots.isascii() and slots.isdigit() and int(slots) >= 1))):
            raise ValueError(f"line {number} '{item[:80]}' is not HOST or HOST:SLOTS")
        count = int(slots) if colon else default_slots
        if name in slots_of:
            if slots_of[name] != count:
                raise ValueError(f"line {number} '{item[:80]}' gives host {name} other slots than before "
                                 f"({slots_of[name]})")
            continue
        slots_of[name] = count
        hosts.append((name, count))
    if not hosts:
        raise ValueError("printed no host")
    return hosts


def discover_hosts(script, default_slots, environ, timeout=DISCOVERY_TIMEOUT_S):
    """Runs --host-discovery-script and returns its hosts; DiscoveryError with one line if it cannot run,
    exits non-zero, runs past `timeout` seconds (it and its children are killed) or prints no usable host."""
    name = f"--host-discovery-script {script}"
    try:
        child = subprocess.Popen([os.path.abspath(script)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=dict(environ), start_new_session=True)
    except OSError as error:
        raise DiscoveryError(f"{name}: cannot run it: {error.strerror or error}") from None
    try:
        out, errors = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)  # its children too: one holding stdout open would block
        except OSError:
            pass
        child.communicate()
        raise DiscoveryError(f"{name}: still running after {timeout:g} s (killed)") from None
    if child.returncode != 0:
        said = errors.decode(errors="replace").strip().splitlines()
        status = f"exit status {child.returncode}" if child.returncode > 0 else f"killed by signal {-child.returncode}"
        raise DiscoveryError(f"{name}: {status}" + (f" ({said[-1].strip()[:200]})" if said else ""))
    try:
        return parse_discovered_hosts(out.decode(errors="replace"), default_slots)
    except ValueError as error:
        raise DiscoveryError(f"{name}: {error}") from None


def discovered_world(printed, answered, previous, want, min_np):
    """The (np, hosts) of a launch on the printed hosts that answered, or None below min_np (pure: for
    tests). Hosts of the `previous` world come first, in its order (they keep the lowest ranks, rank 0
    stays where the job was), then new hosts in the script's order; np is `want` capped by their
    slots, and the hosts are those the ranks fill (mpirun --map-by slot), the last one's slots cut."""
    available = {name: slots for name, slots in printed if name in answered}
    order = [name for name, _ in previous if name in available]
    order += [name for name, _ in printed if name in available and name not in order]
    np_ = min(want, sum(available.values()))
    if np_ < min_np or np_ < 1:
        return None
    hosts, left = [], np_
    for name in order:
        if left == 0:
            break
        take = min(available[name], left)
        hosts.append((name, take))
        left -= take
    return np_, hosts


def host_changes(before, after):
    """The names (lost, added) between two worlds' host lists (pure: for tests)."""
    old, new = [name for name, _ in before], [name for name, _ in after]
    return [name for name in old if name not in new], [name for name in new if name not in old]


def _world_text(np_, hosts, lost, added, silent):
    notes = [hosts_text(hosts)]
    notes += [f"{label}: {', '.join(names)}" for label, names in
              (("lost", lost), ("added", added), ("not answering", silent)) if names]
    return f"{np_} rank{'s' if np_ != 1 else ''} ({'; '.join(notes)})"


# A signal that mpirun has not ended the job for after this long did not reach it (a `kill` of this
# process alone, not of its process group): it is forwarded then, once. Never at once: mpirun takes a
# second signal as "terminate forcibly" and exits leaving the ranks running.
FORWARD_AFTER_S = 5.0


class Interrupts:
    """The SIGINT / SIGTERM this launcher receives while mpirun runs (the terminal's Ctrl-C reaches
    mpirun and the ranks too: they are in this process group)."""

    def __init__(self):
        self.received = []  # (signal number, time.monotonic())

    def install(self):
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, lambda signum, _frame: self.received.append((signum, time.monotonic())))

    def __bool__(self):
        return bool(self.received)

    def exit_status(self, mpirun_status, err):
        """128 + the first signal, as for any interrupted command, after one line."""
        number = self.received[0][0]
        what = "it had completed" if mpirun_status == 0 else "the job stopped"
        print(f"pipesgdrun: interrupted by {signal.Signals(number).name}: {what} (mpirun exit status {mpirun_status})",
              file=err, flush=True)
        return 128 + number


def run_mpirun(command, env, interrupts):
    """Runs mpirun (in this process group) until it exits; returns its exit status."""
    child = subprocess.Popen(command, env=env)
    forwarded = False
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if interrupts and not forwarded and time.monotonic() - interrupts.received[0][1] >= FORWARD_AFTER_S:
            child.send_signal(interrupts.received[0][0])
            forwarded = True


def run_with_restarts(args, environ=None, launch=None, clock=time.time, err=sys.stderr, probe=probe_host):
    """Runs the job, relaunching it after a failure up to args.restarts times; returns the exit status.
    `launch(command, env)` runs one mpirun and returns its exit status and `probe(host, environ)` says
    whether a host answers (parameters for tests). With --host-discovery-script and no hosts chosen
    yet, the first launch's hosts are discovered here."""
    environ = dict(os.environ if environ is None else environ)
    script = getattr(args, "host_discovery_script", None)
    default_slots = getattr(args, "slots", None) or 1
    max_np = args.np if args.max_np is None else args.max_np
    interrupted = Interrupts()

    def discovered(previous, want):
        """(world or None, printed, silent) from the script; DiscoveryError if it fails."""
        printed = discover_hosts(script, default_slots, environ)
        answered = answering_hosts(printed, environ, probe)
        silent = [name for name, _ in printed if name not in answered]
        return discovered_world(printed, answered, previous, want, args.min_np), printed, silent

    def too_few(printed, silent):
        answering = hosts_text([host for host in printed if host[0] not in silent]) or "none"
        return (f"the hosts --host-discovery-script {script} printed that answer ({answering}"
                f"{'; not answering: ' + ', '.join(silent) if silent else ''}) hold fewer than --min-np "
                f"{args.min_np} ranks")

    if script is not None and not args.hosts:
        try:
            world, printed, silent = discovered([], min(args.np, max_np))
        except DiscoveryError as error:
            print(f"pipesgdrun: {error}", file=err, flush=True)
            return 1
        if world is None:
            print(f"pipesgdrun: {too_few(printed, silent)}", file=err, flush=True)
            return 1
        if world[0] != args.np or silent:
            fewer = f", not -np {args.np}: all the slots of the hosts that answer" if world[0] != args.np else ""
            print(f"pipesgdrun: launching on {_world_text(world[0], world[1], [], [], silent)}{fewer}", file=err,
                  flush=True)
        args.np, args.hosts = world[0], hosts_text(world[1])

    if launch is None:
        def launch(command, env):
            return run_mpirun(command, env, interrupted)
        interrupted.install()
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
            return interrupted.exit_status(0, err) if interrupted else 0
        ended = clock()
        if not should_relaunch(exit_code, attempt, args.restarts, bool(interrupted)):
            if interrupted:
                return interrupted.exit_status(exit_code, err)
            if exit_code != _USAGE_ERROR and args.restarts > 0:
                print(f"pipesgdrun: the job failed (exit status {exit_code}) and --restarts {args.restarts} are used "
                      f"up; the newest commit is still in the job's --checkpoint-dir", file=err, flush=True)
            return exit_code
        attempt += 1
        failure = {"attempt": attempt, "exit_code": exit_code, "failed_at_unix_s": ended,
                   "seconds": round(ended - started, 3)}
        where = ""
        if script is not None:
            previous = parse_hosts(args.hosts)
            try:
                world, printed, silent = discovered(previous, max_np)
            except DiscoveryError as error:
                print(f"pipesgdrun: the job failed (exit status {exit_code}) and is not relaunched: {error}; the "
                      f"newest commit is still in the job's --checkpoint-dir", file=err, flush=True)
                return exit_code
            if world is None:
                print(f"pipesgdrun: the job failed (exit status {exit_code}) and {too_few(printed, silent)}; the "
                      f"newest commit is still in the job's --checkpoint-dir", file=err, flush=True)
                return exit_code
            new_np, kept = world
            lost, added = host_changes(previous, kept)
            if new_np != args.np or lost or added or silent:
                where = " on " + _world_text(new_np, kept, lost, added, silent)
            failure.update({"np": new_np, "lost_hosts": lost, "added_hosts": added})
            args.np, args.hosts = new_np, hosts_text(kept)
        elif args.min_np is not None:
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
                where = " on " + _world_text(new_np, kept, lost, [], [])
            failure.update({"np": new_np, "lost_hosts": lost, "added_hosts": []})
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
    script = args.host_discovery_script
    if script is not None:
        if args.hosts:
            parser.error("--host-discovery-script and -H are mutually exclusive: the script names the hosts")
        if args.hostfile:
            parser.error("--host-discovery-script and --hostfile are mutually exclusive: the script names the hosts")
        if args.restarts < 1 or args.min_np is None:
            parser.error("--host-discovery-script needs --restarts R and --min-np N (it chooses the hosts of each "
                         "launch)")
        found = script if os.path.isfile(script) or os.sep in script else shutil.which(script)
        if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
            parser.error(f"--host-discovery-script: '{script}' is not an executable file")
        args.host_discovery_script = os.path.abspath(found)
    if args.slots is not None:
        if script is None:
            parser.error("--slots-per-host needs --host-discovery-script")
        if args.slots < 1:
            parser.error(f"--slots-per-host must be >= 1, got {args.slots}")
    if args.min_np is not None:
        if args.restarts < 1 or not (args.hosts or script):
            parser.error("--min-np needs --restarts R and -H or --host-discovery-script (the hosts a relaunch "
                         "chooses among)")
        args.max_np = args.np if args.max_np is None else args.max_np
        if not 1 <= args.min_np <= args.np <= args.max_np:
            parser.error(f"need 1 <= --min-np <= -np <= --max-np, got {args.min_np}, {args.np}, {args.max_np}")
        if args.hosts:
            try:
                parse_hosts(args.hosts)
            except ValueError as error:
                parser.error(str(error))
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the command each rank runs, e.g. /usr/bin/python3 train.py")
    if script is not None and args.dry_run:  # the script runs; the hosts are not asked to answer
        return run_with_restarts(args, launch=lambda command, env: print(" ".join(command), flush=True) or 0,
                                 probe=lambda host, environ: True)
    command = None if script is not None else mpirun_command(args)
    if command and (args.dry_run or args.verbose):
        print(" ".join(command), flush=True)
    if args.dry_run:
        return 0
    if shutil.which("mpirun") is None:
        print("pipesgdrun: mpirun not found: install openmpi-bin (bash scripts/install-deps.sh)", file=sys.stderr)
        return 127
    if args.restarts > 0:
        return run_with_restarts(args)
    interrupts = Interrupts()
    interrupts.install()
    status = run_mpirun(command, os.environ, interrupts)
    return interrupts.exit_status(status, sys.stderr) if interrupts else status


if __name__ == "__main__":
    sys.exit(main())
