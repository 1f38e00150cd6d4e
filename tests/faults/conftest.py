"""The fault tier's tools: a real `python -m dapple_launch` process tree, real signals, real files.

Each case starts the product as a user's shell would (the launcher in its own process group, as a
terminal's foreground job), watches its ranks' heartbeats to act mid-run, and checks afterwards
that no rank outlived the launcher. Every case records what it measured in
RUN_DIR/../fault-report.json (time to detect, what was lost, the message) for the issue's table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dapple_launch.runtime.heartbeat import read_heartbeats

ROOT = Path(__file__).resolve().parent.parent.parent
FAST = [
    "model.num_layers=2",
    "model.hidden=32",
    "model.heads=2",
    "model.seq_len=16",
    "trainer.val_check_interval=1000",
    "trainer.limit_val_batches=1",
    "trainer.log_every_n_steps=1",
    "trainer.lr_decay_steps=100",
    "trainer.warmup_steps=2",
    "trainer.progress_bar=false",
    "data.num_train=512",
    "data.num_val=32",
]
REPORT = Path(os.environ.get("DAPPLE_FAULT_REPORT", ROOT / "fault-report.json"))


def env() -> dict:
    return {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}


LAUNCHED: list = []


@pytest.fixture(autouse=True)
def _nothing_left_running():
    """Whatever a case asserts, no launch of it survives it (its ranks die with the launcher)."""
    yield
    while LAUNCHED:
        launch = LAUNCHED.pop()
        if launch.proc.poll() is None:
            os.killpg(launch.proc.pid, signal.SIGKILL)
            launch.proc.wait()


class Launch:
    """`python -m dapple_launch ARGS hydra.run.dir=RUN` in the background, its own process group."""

    def __init__(self, args: list[str], run: Path, wrap: list[str] = ()):
        LAUNCHED.append(self)
        self.run = run
        self.out, self.err = run.parent / f"{run.name}.out", run.parent / f"{run.name}.err"
        run.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [*wrap, sys.executable, "-m", "dapple_launch", *args, f"hydra.run.dir={run}"],
            cwd=ROOT,
            env=env(),
            stdout=open(self.out, "w"),  # noqa: SIM115 - the child's, for its whole life
            stderr=open(self.err, "w"),  # noqa: SIM115
            start_new_session=True,
        )
        self.started = time.time()

    def wait_for_step(self, step: int, timeout: float = 120) -> None:
        end = time.time() + timeout
        while time.time() < end:
            beats = read_heartbeats(self.run)
            if beats and min(b.get("step", 0) for b in beats.values()) >= step:
                return
            assert self.proc.poll() is None, self.stderr
            time.sleep(0.1)
        raise AssertionError(f"no rank reached step {step} in {timeout} s")

    def signal_terminal(self, sig: int) -> float:
        """What a terminal does on Ctrl-C: the signal to the foreground process group."""
        os.killpg(self.proc.pid, sig)
        return time.time()

    def wait(self, timeout: float = 180) -> int:
        return self.proc.wait(timeout=timeout)

    @property
    def stderr(self) -> str:
        return self.err.read_text() if self.err.exists() else ""

    @property
    def stdout(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def rank_pids(self) -> dict[int, int]:
        """rank -> pid, from the ranks' heartbeats."""
        return {r: int(b["pid"]) for r, b in read_heartbeats(self.run).items()}

    def worker_pids(self) -> list[int]:
        """The ranks of this launch still running (a zombie waiting to be reaped is not)."""
        return [pid for pid in self.rank_pids().values() if _running(pid)]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def run_to_end(args: list[str], run: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-m", "dapple_launch", *args, f"hydra.run.dir={run}"],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return out


def no_process_left(launch: Launch, within: float = 5.0) -> bool:
    end = time.time() + within
    while time.time() < end:
        if not launch.worker_pids():
            return True
        time.sleep(0.1)
    return False


def record(case: str, detect_s: float | None, lost: str, message: str) -> None:
    """One row of the fault table (the issue note quotes it)."""
    rows = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    rows[case] = {
        "detect_s": None if detect_s is None else round(detect_s, 1),
        "lost": lost,
        "message": " ".join(message.split())[:400],
    }
    REPORT.write_text(json.dumps(rows, indent=1))


def first_error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(("error:", "warning:"))]
    return lines[-1] if lines else text.strip().splitlines()[-1] if text.strip() else ""


@pytest.fixture(scope="session")
def straight(tmp_path_factory):
    """The uninterrupted reference: 60 steps, checkpoint at the end."""
    from dapple_launch.runtime.checkpoint import find_checkpoints, read_shards

    run = tmp_path_factory.mktemp("straight") / "run"
    out = run_to_end([*FAST, "trainer.max_steps=60", "trainer.checkpoint_every_n_steps=1000"], run)
    assert out.returncode == 0, out.stdout + out.stderr
    state, _ = read_shards(find_checkpoints(run / "checkpoints")[-1])
    return state


signal_names = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}
