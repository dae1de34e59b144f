"""pipesgdrun / python3 -m pipesgd.run: horovodrun's launcher for pipesgd.torch scripts.

    pipesgdrun -np 4 /usr/bin/python3 train.py --epochs 3
    pipesgdrun -np 8 -H host1:4,host2:4 /usr/bin/python3 train.py

It runs mpirun with what the script needs: one process per rank, no core binding (LibTorch
schedules its own threads), oversubscription when the ranks exceed this machine's cores (or
always with --oversubscribe), running as root allowed when this user is root (CI machines and
containers), and the environment (PYTHONPATH, PATH, LD_LIBRARY_PATH, OMP_NUM_THREADS, PIPESGD_*)
exported to every host. Parameter-server methods: -np counts the server ranks too (the script
calls hvd.init(servers=S); the last S ranks serve).
"""

import argparse
import os
import shutil
import sys

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


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.np < 1:
        parser.error(f"-np must be >= 1, got {args.np}")
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
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
