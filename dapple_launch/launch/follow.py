"""`launcher.wait=true`: follow a submitted job to its real end, from Slurm and the run directory.

submitit's result files can be stale (a job Slurm requeued may already hold a failure's result), so
the job's state comes from `squeue`, its fate from slurm/fate-JOB.json (written by its tasks:
launch/slurm.py, launch/node_loss.py), and the job to follow from slurm/job_id, which names the
successor when a lost node made one. While the job waits, each new reason is said once, with the
nodes it waits for.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from ..log import get_logger
from .node_loss import fate_path

POLL_S = 2.0


def queue_state(job_id: str) -> tuple[str, str, str] | None:
    """(state, reason, nodes) while Slurm holds the job, None once it is gone."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"], capture_output=True, text=True)
    line = out.stdout.strip().splitlines()
    if not line:
        return None
    state, reason, nodes = (line[0].split("|") + ["", ""])[:3]
    return state, reason, nodes


def waiting_for(reason: str) -> str:
    """The nodes a pending job waits for, in words ("" when it waits for nothing in particular)."""
    m = re.search(r"UnavailableNodes:(\S+)", reason)
    if m:
        return f"waiting for node(s) {m.group(1)}"
    if reason.startswith(("ReqNodeNotAvail", "Resources", "NodeDown")):
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-t", "down,drain,fail,no_respond", "-o", "%N"], capture_output=True, text=True
        ).stdout.split()
        return f"waiting for node(s) {','.join(sorted(set(out)))}" if out else "waiting for free nodes"
    return ""


def _fate(run_dir: Path, job_id: str) -> dict | None:
    try:
        return json.loads(fate_path(run_dir, job_id).read_text())
    except (OSError, ValueError):
        return None


def follow(run_dir: Path, job_id: str, poll_s: float = POLL_S) -> int:
    log = get_logger()
    said = None
    gone_since = None
    while True:
        current = (
            (run_dir / "slurm" / "job_id").read_text().strip() if (run_dir / "slurm" / "job_id").is_file() else job_id
        )
        if current != job_id:
            log.info(f"job {job_id} was replaced by job {current}; following it")
            job_id, said, gone_since = current, None, None
        q = queue_state(job_id)
        if q is not None:
            state, reason, nodes = q
            words = f"job {job_id} is {state.lower()}" + (f" on {nodes}" if state == "RUNNING" and nodes else "")
            if state == "PENDING" and reason not in ("None", ""):
                why = waiting_for(reason)
                words += f" ({reason}" + (f"; {why}" if why else "") + ")"
            if words != said:
                log.info(words)
                said = words
            gone_since = None
            time.sleep(poll_s)
            continue
        fate = _fate(run_dir, job_id)
        if fate and fate.get("state") == "replaced":
            time.sleep(poll_s)  # slurm/job_id names the successor (written before the job was cancelled)
            continue
        if fate is None:
            # a fate is written just before the tasks end; give the file system a moment
            gone_since = gone_since or time.time()
            if time.time() - gone_since < 10:
                time.sleep(poll_s)
                continue
            log.error(
                f"job {job_id} left the queue without a word from its ranks (killed, or out of time): see "
                f"{run_dir / 'slurm'}/{job_id}_0_log.err and {run_dir / 'logs'}"
            )
            return 1
        if fate["state"] == "done":
            log.info(f"job {job_id} finished: outputs are in {run_dir}")
            return 0
        log.error(f"job {job_id} {fate['state']}: {fate['line']}")
        return 1
