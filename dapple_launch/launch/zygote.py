"""A parent for the local ranks that imports what every rank needs once, then forks them.

A rank spends seconds importing torch and Lightning before it does anything; four ranks on two
cores spend them four times over. The zygote imports them once and forks each rank from there
(the way a fork server does: nothing but imports has run, no process group, no CUDA, no thread
pool), so a launch starts in the time of one import.

Protocol (launch/local.py drives it): the launcher starts the zygote in its own session, with a
pipe the zygote reports on (fd given as argv[1]); after `ready`, it writes one JSON line per rank
on the zygote's stdin ({"rank", "env", "log", "argv"}) and closes it. The zygote answers
`started RANK PID` for each and, as ranks end, `exit RANK CODE` (a negative code: the signal that
killed it); a rank that fails writes `error RANK LINE` on the same pipe itself (a full disk
cannot swallow it). Every rank runs in a session of its own and dies with the zygote, which dies with
the launcher (PR_SET_PDEATHSIG), so no rank outlives the launcher.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def die_with_parent() -> None:
    """The kernel sends SIGKILL when this process's parent exits, however it exits (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _name(title: str) -> None:
    """The name `ps -o comm` and `top` show (the command line stays the zygote's)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _child(spec: dict, report_fd: int) -> None:
    os.setsid()
    die_with_parent()
    _name(f"dapple-rank-{spec['rank']}")
    os.environ.clear()
    os.environ.update(spec["env"], DAPPLE_REPORT_FD=str(report_fd))  # for the rank's one-line error
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    if spec.get("log"):
        fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    code = 1
    try:
        from .worker import main

        code = main(*spec["argv"])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


def _fork() -> int:
    """os.fork without Python 3.12's warning that this process has threads: importing torch leaves
    one native thread of its own, idle (the one DataLoader's forked workers live beside too); this
    process has run nothing but imports, so no lock is held for a child to inherit. The warning,
    printed at every local GPU launch on the H200, would only alarm."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*use of fork\\(\\) may lead to deadlocks", category=DeprecationWarning
        )
        return os.fork()


def main() -> None:
    report_fd = int(sys.argv[1])
    die_with_parent()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the launcher decides; it signals the ranks
        signal.signal(s, signal.SIG_IGN)
    report = os.fdopen(report_fd, "w", buffering=1)
    import dapple_launch.train  # noqa: F401 - the imports every rank needs, done once

    from . import worker  # noqa: F401

    report.write("ready\n")
    ranks = {}
    for line in sys.stdin:
        spec = json.loads(line)
        pid = _fork()
        if pid == 0:
            _child(spec, report_fd)
        ranks[pid] = spec["rank"]
        report.write(f"started {spec['rank']} {pid}\n")
    while ranks:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid in ranks:
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            report.write(f"exit {ranks.pop(pid)} {code}\n")


if __name__ == "__main__":
    main()
