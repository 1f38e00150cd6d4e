"""Local launcher: one process per rank of the plan on this machine, and their whole life.

Processes are created externally (not spawned by Lightning), so each rank's results stay its own;
they are forked by a zygote that imported torch and Lightning once (launch/zygote.py), so a launch
starts in the time of one import, not one per rank. Rank 0 writes to this terminal; the others to
RUN_DIR/logs/rank-N.log. Each rank runs in its own session (a terminal's Ctrl-C reaches the
launcher only, which decides) and dies with the launcher (PR_SET_PDEATHSIG, through the zygote):
no rank outlives it, ever.

The launcher's signal handlers only count signals; its loop acts on them:
- the first SIGINT/SIGTERM/SIGHUP asks every rank to stop (SIGTERM to each): they finish the
  current step together, save it, and exit; the launcher waits, then says where the checkpoint
  is and how to resume. A second one kills every rank at once.
- a rank that exits with an error ends the run: the others are stopped (all in parallel, killed
  after a grace period), and the message names the rank, its stage and replica, its last action and
  its own one-line error, and says which ranks were only waiting.
- a rank whose heartbeat (runtime/heartbeat.py) is older than trainer.timeout_s has stopped making
  progress: the run ends at once with its name and action.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..host import host_rendezvous, threads_per_rank
from ..log import get_logger
from ..planner.plan import Plan
from ..runtime.heartbeat import describe, is_waiting, read_heartbeats
from .zygote import die_with_parent

GRACE_S = 5.0  # a rank asked to stop after a peer failed gets this long before it is killed
EXIT_STOPPED = 3  # worker: stopped early on a signal, after saving (launch/worker.py)
# when peers have failed (a receive timed out), how stale a live rank's heartbeat may be before it is
# named the cause: its beats come every second, so a rank silent this long is not merely between beats
STALE_WHEN_PEERS_FAIL = 0.75


class _Rank:
    """A rank the zygote forked: its pid, and its exit code once the zygote reports it (the
    interface of subprocess.Popen that the launcher uses)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self.exited_at = float("inf")  # when the zygote reported its end
        self.error = ""  # the one line the rank reported when it failed

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.time() + timeout
        while self.returncode is None:
            if end is not None and time.time() > end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.02)
        return self.returncode


class _Zygote:
    """Starts the zygote, asks it for the ranks, and turns its reports into the ranks' state."""

    def __init__(self, env: dict):
        """Starts the zygote and returns at once: its imports run while this process goes on."""
        import threading

        read, write = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dapple_launch.launch.zygote", str(write)],
            env=env,
            stdin=subprocess.PIPE,
            text=True,
            pass_fds=(write,),
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        os.close(write)
        self.reports = os.fdopen(read)
        self.ranks: dict[int, _Rank] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)

    def start(self, specs: list[dict]) -> list[_Rank]:
        import json

        if self.reports.readline().strip() != "ready":
            raise RuntimeError("the rank zygote failed to start (see the output above)")
        stdin = self.proc.stdin
        assert stdin is not None  # (opened with stdin=PIPE)
        for spec in specs:
            stdin.write(json.dumps(spec) + "\n")
        stdin.close()
        for _ in specs:
            _, rank, pid = self.reports.readline().split()
            self.ranks[int(rank)] = _Rank(int(pid))
        self._reader.start()
        return [self.ranks[s["rank"]] for s in specs]

    def _read(self) -> None:
        for line in self.reports:
            kind, rank, rest = line.rstrip("\n").split(" ", 2)
            r = self.ranks.get(int(rank))
            if r is None:
                continue
            if kind == "exit":
                r.exited_at, r.returncode = time.time(), int(rest)
            elif kind == "error":
                r.error = rest
        for r in self.ranks.values():  # the zygote is gone: so are its ranks
            if r.returncode is None:
                r.returncode = -signal.SIGKILL

    def discard(self) -> None:
        self.proc.kill()
        self.proc.wait()


# The zygote started early for this process's launch (start_zygote_early), until a launch takes it.
_early: _Zygote | None = None


def start_zygote_early() -> None:
    """Start the zygote now, for the local launch this process is about to make: its imports
    (Lightning and torch, 8-9 s of a launch on this 2-core machine) then run beside the launcher's
    own work (composing, planning, the data and checkpoint checks) instead of after it. It only
    imports: nothing of the run exists until a launch hands it the ranks. A launch refused before
    that (one line, exit 2) ends it on the way out, and it dies with this process whatever happens.
    OMP_NUM_THREADS=1 (unless set) for its imports, as the threads per rank are not known before the
    plan (each rank sets its own, launch/worker.py): a BLAS that starts a pool at import then has
    none for the forked ranks to lose."""
    global _early
    if _early is None:
        import atexit

        _early = _Zygote({**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        atexit.register(_discard_early)


def _discard_early() -> None:
    global _early
    if _early is not None:
        _early.discard()
        _early = None


def _zygote(env: dict) -> _Zygote:
    """The zygote started early, else one started now."""
    global _early
    taken, _early = _early, None
    return taken if taken is not None else _Zygote(env)


@dataclass
class LocalRun:
    plan: Plan
    run_dir: Path
    snapshot: Path  # where this launch's config.yaml and plan.json are
    ckpt_path: str | None
    timeout_s: float
    resume_hint: str = ""
    cores: int | None = None
    procs: list = field(default_factory=list)
    interrupts: list = field(default_factory=list)  # signal numbers, appended by the handler only
    store: object = None  # the ranks' rendezvous store, hosted here from start() to the end of run()

    def start(self) -> None:
        world = self.plan.world_size
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for stale in [*logs.glob("error-rank-*.txt"), *(logs / "heartbeat").glob("rank-*.json")]:
            stale.unlink()  # a previous launch's: this run's ranks write their own
        threads = threads_per_rank(world, self.cores)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LOCAL_RANK", "RANK", "WORLD_SIZE"))}
        self.store, rendezvous = host_rendezvous()  # held by this launcher while the ranks live
        base.update(
            rendezvous,
            WORLD_SIZE=str(world),
            NODE_RANK="0",
            DAPPLE_THREADS=str(threads),
            DAPPLE_CKPT=self.ckpt_path or "",
            OMP_NUM_THREADS=str(threads),
            PYTHONUNBUFFERED="1",
        )
        self.zygote = _zygote(base)
        self.procs = self.zygote.start(
            [
                {
                    "rank": rank,
                    "env": dict(base, RANK=str(rank), LOCAL_RANK=str(rank)),
                    "log": str(logs / f"rank-{rank}.log") if rank else None,
                    "argv": [str(self.run_dir), str(self.snapshot)],
                }
                for rank in range(world)
            ]
        )

    def run(self) -> int:
        old = {
            s: signal.signal(s, lambda signum, frame: self.interrupts.append(signum))
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        try:
            self.start()
            return self._watch()
        finally:
            self._kill(list(range(len(self.procs))))  # whatever happened, nothing outlives the launcher
            if getattr(self, "zygote", None) is not None:
                self.zygote.discard()
            self.store = None  # its port is free again (a sweep may launch again from this process)
            for s, h in old.items():
                signal.signal(s, h)

    # ---- the loop ----------------------------------------------------------------------------
    def _watch(self) -> int:
        log = get_logger()
        started, stop_asked = time.time(), None
        while True:
            codes = [p.poll() for p in self.procs]
            if len(self.interrupts) >= 2:
                self._kill(list(range(len(self.procs))))
                log.error(
                    f"stopped at once ({signal.Signals(self.interrupts[1]).name} again): the ranks were "
                    f"killed; the current step is lost" + self._last_saved()
                )
                return 128 + self.interrupts[0]
            if self.interrupts and stop_asked is None:
                stop_asked = time.time()
                log.warning(
                    f"{signal.Signals(self.interrupts[0]).name}: every rank finishes the current step and "
                    f"saves it (press Ctrl-C again to stop at once)"
                )
                self._signal_all(signal.SIGTERM)
            failed = [r for r, c in enumerate(codes) if c not in (None, 0, EXIT_STOPPED)]
            if failed:
                # A peer's receive times out after trainer.timeout_s, as the stalled rank's heartbeat goes
                # stale: on a loaded machine the timeout may be seen first. A live rank silent for most of
                # the timeout while others failed is the cause, not the ranks that waited on it.
                stalled = self._stalled(started, fraction=STALE_WHEN_PEERS_FAIL)
                if stalled is not None and stalled not in failed:
                    return self._stall(stalled)
                return self._failure(failed)
            if all(c is not None for c in codes):
                if stop_asked is not None:
                    return self._stopped(128 + self.interrupts[0])
                if any(c == EXIT_STOPPED for c in codes):
                    log.warning("a rank received a stop signal: the ranks saved and stopped early" + self._last_saved())
                    return EXIT_STOPPED
                return 0
            stalled = self._stalled(started)
            if stalled is not None:
                return self._stall(stalled)
            if stop_asked is not None and time.time() - stop_asked > self.timeout_s:
                self._kill(list(range(len(self.procs))))
                log.error(
                    f"the ranks did not stop within trainer.timeout_s={self.timeout_s:g} s of being asked; "
                    f"they were killed" + self._last_saved()
                )
                return 128 + self.interrupts[0]
            time.sleep(0.2)

    def _stalled(self, started: float, fraction: float = 1.0) -> int | None:
        """A rank whose heartbeat is older than the timeout (`fraction` of it), or never came long after
        the start."""
        now = time.time()
        beats = read_heartbeats(self.run_dir)
        for rank, p in enumerate(self.procs):
            if p.poll() is not None:
                continue
            beat = beats.get(rank)
            if beat is None:
                if now - started > self.timeout_s + 60:  # imports and set-up come first
                    return rank
            elif now - beat["time"] > self.timeout_s * fraction:
                return rank
        return None

    # ---- endings -----------------------------------------------------------------------------
    def _stall(self, rank: int) -> int:
        now = time.time()
        beats = read_heartbeats(self.run_dir)
        self._kill(list(range(len(self.procs))))
        beat = beats.get(rank)
        what = (
            f"{describe(beat, now, alive=False)}, has been silent for {now - beat['time']:.0f} s"
            if beat
            else f"rank {rank} never started"
        )
        get_logger().error(
            f"{what}: it stopped making progress (longer than trainer.timeout_s="
            f"{self.timeout_s:g} s); the run was ended{self._waiting(beats, {rank}, now)}" + self._last_saved()
        )
        return 1

    def _failure(self, failed: list[int]) -> int:
        now = time.time()
        beats = read_heartbeats(self.run_dir)
        # the root cause: a rank a signal killed, else the first to end (the others fail for it)
        # (NCCL's watchdog aborts a rank that only waited: it is the cause last of all)
        first = min(
            failed,
            key=lambda r: (self._aborted_waiting(r, beats), self.procs[r].returncode > 0, self.procs[r].exited_at, r),
        )
        others = [r for r in range(len(self.procs)) if r not in failed]
        self._signal(others, signal.SIGTERM)
        deadline = time.time() + GRACE_S
        while time.time() < deadline and any(self.procs[r].poll() is None for r in others):
            time.sleep(0.1)
        self._kill(others)
        code = self.procs[first].returncode
        why = self._error_line(first) or (
            f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        )
        if code == -signal.SIGABRT and list((self.run_dir / "logs").glob("nccl-trace-rank-*")):
            why += (
                f" (NCCL's watchdog; its flight recorder dumped each rank's last operations: "
                f"{self.run_dir / 'logs' / 'nccl-trace-rank-N'})"
            )
        where = describe(beats[first], now, alive=False) if first in beats else f"rank {first}"
        get_logger().error(
            f"{where} failed: {why}; the other ranks were stopped"
            f"{self._waiting(beats, {first}, now)}" + self._tail_hint(first) + self._last_saved()
        )
        return code if code and code > 0 else 1

    def _aborted_waiting(self, rank: int, beats: dict) -> bool:
        return self.procs[rank].returncode == -signal.SIGABRT and is_waiting(str(beats.get(rank, {}).get("action")))

    def _stopped(self, code: int) -> int:
        log = get_logger()
        found = self._newest()
        if found is None:
            log.warning("stopped before the first step finished: nothing to save")
        else:
            log.warning(f"stopped: the last completed step is saved in {found}; resume with: {self.resume_hint}")
        return code

    # ---- helpers -------------------------------------------------------------------------------
    def _waiting(self, beats: dict, culprits: set[int], now: float) -> str:
        waiting = [
            describe(b, now) for r, b in sorted(beats.items()) if r not in culprits and is_waiting(str(b.get("action")))
        ]
        return f"; only waiting on it: {'; '.join(waiting)}" if waiting else ""

    def _error_line(self, rank: int) -> str:
        return self.procs[rank].error

    def _tail_hint(self, rank: int) -> str:
        if not (self.run_dir / "logs" / f"error-rank-{rank}.txt").is_file():
            return f" (its output: {self.run_dir / 'logs' / f'rank-{rank}.log'})" if rank else ""
        return f" (the traceback: {self.run_dir / 'logs' / f'error-rank-{rank}.txt'})"

    def _newest(self) -> Path | None:
        from ..runtime.checkpoint import find_checkpoints

        found = find_checkpoints(self.run_dir / "checkpoints")
        return found[-1] if found else None

    def _last_saved(self) -> str:
        found = self._newest()
        return f". The newest checkpoint is {found}; resume with: {self.resume_hint}" if found else ""

    def _signal(self, ranks: list[int], sig: int) -> None:
        for r in ranks:
            if self.procs[r].poll() is None:
                try:
                    self.procs[r].send_signal(sig)
                except ProcessLookupError:
                    pass

    def _signal_all(self, sig: int) -> None:
        self._signal(list(range(len(self.procs))), sig)

    def _kill(self, ranks: list[int]) -> None:
        """SIGKILL to all of them first, then reap: in parallel, not one timeout after another."""
        self._signal(ranks, signal.SIGKILL)
        for r in ranks:
            try:
                self.procs[r].wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def launch_local(
    plan: Plan,
    run_dir: Path,
    snapshot: Path,
    ckpt_path: str | None,
    timeout_s: float,
    resume_hint: str = "",
    cores: int | None = None,
) -> int:
    return LocalRun(plan, run_dir, snapshot, ckpt_path, timeout_s, resume_hint, cores).run()
