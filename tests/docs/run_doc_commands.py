#!/usr/bin/python3
"""Runs every shell command block of the user-facing docs, as a reader would paste it.

    /usr/bin/python3 tests/docs/run_doc_commands.py --build BUILD_DIR [--budget S] [-k TEXT] DOC.md...

A block is a fenced block whose info string is `sh`; output shown in the docs is fenced as `text`
and not run. A `sh` block that cannot run here (it builds the project, needs a second host, or
installs as root) is preceded by the line `<!-- docs-test: skip: WHY -->`; the reason is printed.

Each block runs as one bash script (`set -e`, so every line must succeed) in one scratch directory
shared by all blocks of a doc, in their order (a later block may use an earlier one's files), with
the repository's build/, profiles/, examples/, scripts/ and bench/ linked in, BUILD/python/bin and
a `pipesgd` on PATH, and PYTHONPATH=BUILD/python. A block still running after --budget seconds
(default 60) gets SIGINT, as a user's Ctrl-C: it passes if it then stops within 30 s with the
status of an interrupt (130) and nothing on stderr says "usage" or "unknown": the command was
accepted and ran. A block that runs mpirun itself may stop with 1 instead: that is Open MPI's
mpirun's own status after a Ctrl-C (pipesgdrun's is 130). Prints `ok DOC:LINE` / `FAIL DOC:LINE: why`
per block and a summary line; exits 1 if any block failed.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = re.compile(r"<!--\s*docs-test:\s*skip:\s*(.+?)\s*-->")


def blocks(path):
    """Yields (line, info, text, skip_reason) for each fenced block of a markdown file."""
    lines = open(path).read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, info = i + 1, m.group(1)
        skip = None
        for back in range(i - 1, max(i - 3, -1), -1):  # the marker sits just above the fence
            s = SKIP.search(lines[back])
            if s:
                skip = s.group(1)
                break
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        yield start, info, "\n".join(lines[i + 1:j]), skip
        i = j + 1


def scratch_dir(repo, build):
    work = tempfile.mkdtemp(prefix="pipesgd-docs-")
    for name in ("profiles", "examples", "scripts", "bench"):
        os.symlink(os.path.join(repo, name), os.path.join(work, name))
    os.symlink(build, os.path.join(work, "build"))
    return work


def run_block(text, cwd, env, budget):
    """Runs a block; returns None if it passed, else why it failed."""
    script = "set -eo pipefail\n" + text + "\n"
    err_path = os.path.join(cwd, ".stderr")
    with open(os.path.join(cwd, ".stdout"), "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            status = proc.wait(timeout=budget)
            interrupted = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            interrupted = True
            try:
                status = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return f"still running 30 s after Ctrl-C (after {budget} s)"
    stderr = open(err_path).read()
    if interrupted:
        runs_mpirun = any(line.lstrip().startswith("mpirun ") for line in text.splitlines())
        if status not in (130, -signal.SIGINT) and not (runs_mpirun and status == 1):
            return f"interrupted after {budget} s, then exit status {status}: {stderr[-300:]!r}"
        if re.search(r"usage|unknown option", stderr, re.I):
            return f"interrupted after {budget} s, but stderr shows a usage error: {stderr[-300:]!r}"
        return None
    if status != 0:
        return f"exit status {status}: {stderr[-400:]!r}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--budget", type=float, default=60)
    ap.add_argument("-k", default=None, help="only blocks whose text contains this")
    ap.add_argument("docs", nargs="+")
    args = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    build = os.path.abspath(args.build)
    bin_dir = tempfile.mkdtemp(prefix="pipesgd-docs-bin-")
    os.symlink(os.path.join(build, "pipesgd"), os.path.join(bin_dir, "pipesgd"))
    env = dict(os.environ, PATH=f"{bin_dir}:{build}/python/bin:{os.environ['PATH']}",
               PYTHONPATH=os.path.join(build, "python"), OMP_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    passed = failed = skipped = 0
    for doc in args.docs:
        work = scratch_dir(repo, build)
        try:
            for line, info, text, skip in blocks(doc):
                where = f"{os.path.relpath(doc, repo)}:{line}"
                if info != "sh" or (args.k and args.k not in text):
                    continue
                if skip:
                    skipped += 1
                    print(f"skip {where}: {skip}", flush=True)
                    continue
                started = time.monotonic()
                why = run_block(text, work, env, args.budget)
                took = time.monotonic() - started
                if why:
                    failed += 1
                    print(f"FAIL {where} ({took:.0f} s): {why}", flush=True)
                else:
                    passed += 1
                    print(f"ok {where} ({took:.0f} s)", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(bin_dir, ignore_errors=True)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
