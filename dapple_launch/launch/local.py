"""Local launcher: one process per rank of the plan on this machine, started with Popen.

Processes are created externally (not spawned by Lightning), so each rank's results stay its own.
Rank 0 writes to this terminal (progress bar); the others to RUN_DIR/logs/rank-N.log. If a
rank fails, the others are stopped and the failing rank's log tail is shown.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..planner.plan import Plan
from .ports import free_port


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which a container or Slurm may narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_rank(ranks: int, cores: int | None = None) -> int:
    """The torch threads each of `ranks` local processes gets: the cores shared out, at least one.
    The measuring profiler and the link probe use the same figure, so they see the ranks' view."""
    return max(1, (cores or usable_cores()) // ranks)


def launch_local(plan: Plan, run_dir: Path, ckpt_path: str | None, cores: int | None = None) -> int:
    world = plan.world_size
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    threads = threads_per_rank(world, cores)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LOCAL_RANK", "RANK", "WORLD_SIZE"))}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), NODE_RANK="0",
                DAPPLE_THREADS=str(threads), DAPPLE_CKPT=ckpt_path or "",
                OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    procs, files = [], []
    for rank in range(world):
        env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
        if rank == 0:
            out = None
        else:
            out = open(logs / f"rank-{rank}.log", "w")
            files.append(out)
        procs.append(subprocess.Popen([sys.executable, "-m", "dapple_launch.launch.worker", str(run_dir)],
                                      env=env, stdout=out, stderr=subprocess.STDOUT if out else None))

    def stop(*_):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
    old = {s: signal.signal(s, lambda *a: (stop(), sys.exit(130))) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            for rank, p in enumerate(procs):
                if p.poll() not in (None, 0):
                    failed = rank
                    break
            time.sleep(0.2)
        if failed is None:
            failed = next((r for r, p in enumerate(procs) if p.returncode), None)
        if failed is not None:
            stop()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
            log = logs / f"rank-{failed}.log"
            tail = "\n".join(log.read_text().splitlines()[-25:]) if failed and log.exists() else ""
            print(f"\nrank {failed} failed with exit code {procs[failed].returncode}; the other ranks were stopped."
                  + (f"\n--- last lines of {log} ---\n{tail}" if tail else ""), file=sys.stderr)
            return procs[failed].returncode or 1
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for f in files:
            f.close()
