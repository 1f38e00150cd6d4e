"""What each rank is doing, written where the launcher can read it: a heartbeat.

A thread writes RUN_DIR/logs/heartbeat/rank-N.json about every second: the rank's place (stage,
replica, device, pid), the training step, and the action it is in (F3, RG5, the gradient
all-reduce, a checkpoint save, validation) with when it began. The main thread only updates a
small dict per action. A rank that stops (SIGSTOP, a hang holding the interpreter) stops
writing; a rank waiting on a peer keeps writing while it waits, in a receive or a collective. So
the launcher can name the rank that stopped making progress and the action it was in, and say
which ranks were only waiting on it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

INTERVAL_S = 1.0
WAITING = ("RA", "RG", "AR", "collective", "waiting")  # actions that wait on another rank


def heartbeat_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "logs" / "heartbeat"


class Heartbeat:
    def __init__(self):
        self.state = {"step": 0, "action": "starting", "since": time.time()}
        self.where: dict = {}
        self._thread: threading.Thread | None = None
        self._path: Path | None = None

    def start(self, run_dir: str | Path, rank: int, **where) -> None:
        self._path = heartbeat_dir(run_dir) / f"rank-{rank}.json"
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self.where = {"rank": rank, "pid": os.getpid(), **where}
        self._write()
        self._thread = threading.Thread(target=self._loop, name="dapple-heartbeat", daemon=True)
        self._thread.start()

    def action(self, label) -> None:
        """The main thread entered an action (cheap: called per action of the schedule). `label`: a
        string, or an object (a schedule's Action) the writer thread turns into one when it writes."""
        self.state["action"], self.state["since"] = label, time.time()

    def step(self, step: int) -> None:
        self.state["step"] = step

    def end(self, how: str) -> None:
        """The rank leaves (`failed`, `done`): said in its last heartbeat, so a peer that reads it can
        tell a rank that ended from one that vanished with its node (launch/node_loss.py)."""
        if self._path is None:
            return
        self.state["ended"] = how
        self._thread = None  # the loop sees it is no longer the writer and stops
        try:
            self._write()
        except OSError:
            pass

    def _write(self) -> None:
        assert self._path is not None, "start() names the heartbeat's file"
        tmp = self._path.with_suffix(".tmp")
        state = dict(self.state)
        state["action"] = str(state["action"])
        tmp.write_text(json.dumps({**self.where, **state, "time": time.time()}))
        os.replace(tmp, self._path)

    def _loop(self) -> None:
        me = threading.current_thread()
        while self._thread is me:
            time.sleep(INTERVAL_S)
            if self._thread is not me:
                return
            try:
                self._write()
            except OSError:  # a full or vanished disk must not kill the rank: the launcher sees it stale
                pass


BEAT = Heartbeat()


def read_heartbeats(run_dir: str | Path) -> dict[int, dict]:
    out = {}
    for p in heartbeat_dir(run_dir).glob("rank-*.json"):
        try:
            beat = json.loads(p.read_text())
            out[int(beat["rank"])] = beat
        except (OSError, ValueError, KeyError):
            continue  # being replaced right now: read it next time
    return out


def is_waiting(action: str) -> bool:
    return action.startswith(WAITING)


def describe(beat: dict, now: float, alive: bool = True) -> str:
    """`rank 2 (stage 1, replica 0, device 2) in F3 of step 17 for 31 s`, or for a rank that died or
    went silent, where its last heartbeat saw it."""
    where = f"stage {beat.get('stage')}, replica {beat.get('replica')}, device {beat.get('device')}"
    if not alive:
        return f"rank {beat['rank']} ({where}), last seen in {beat.get('action')} of step {beat.get('step')}"
    return (
        f"rank {beat['rank']} ({where}) in {beat.get('action')} of step {beat.get('step')} for "
        f"{now - beat.get('since', now):.0f} s"
    )
