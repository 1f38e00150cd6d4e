"""A node lost mid-run, seen from the ranks that survive it, and the job that comes back for it.

Survivors fail fast (a reset connection) or at trainer.timeout_s (a cut link). A rank that ends says
so in its last heartbeat (runtime/heartbeat.py); a rank that vanished with its node just stops. So
after its own failure every surviving task lets the heartbeats settle and reads them: a node all of
whose ranks stopped without a word is lost (a node where some rank ended with an error is alive, and
the failure is an ordinary one, reported as such).

Then one survivor (the first to claim slurm/lost-JOB.json) decides, so the queue never holds a pile:
- strategy=auto: one successor job, sized for the nodes left (Slurm's own requeue would keep the
  first allocation's task count and wait for the lost node forever), excluding the lost nodes; the
  job is then cancelled so Slurm does not requeue it as well. The successor re-plans for the nodes it
  is given (`replanned_snapshot`) and resumes the newest complete checkpoint: the steps since it are
  what was lost, and the fate line says so.
- a fixed layout (strategy=fixed or file): it cannot run on fewer nodes; the job stops with one line.

Every outcome is also written to slurm/fate-JOB.json, which the launcher reads (launch/follow.py).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import cast

from ..config.choices import mapping
from ..log import get_logger
from ..runtime.heartbeat import INTERVAL_S, read_heartbeats

STALE_S = 2.5 * INTERVAL_S  # a live rank writes every INTERVAL_S; this much silence means it is gone
SETTLE_S = STALE_S + 1.5 * INTERVAL_S  # after our own failure: long enough for a vanished rank to look stale


def fate_path(run_dir: str | Path, job_id: str) -> Path:
    return Path(run_dir) / "slurm" / f"fate-{job_id}.json"


def write_fate(run_dir: str | Path, job_id: str, state: str, line: str, **extra) -> None:
    path = fate_path(run_dir, job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"job": job_id, "state": state, "line": line, "time": time.time(), **extra}))
    tmp.replace(path)


def lost_nodes(run_dir: str | Path, job_id: str, now: float | None = None) -> dict[str, list[int]]:
    """Node → its ranks, for every node of this job all of whose ranks stopped without a word."""
    now = time.time() if now is None else now
    by_node: dict[str, list[dict]] = defaultdict(list)
    for beat in read_heartbeats(run_dir).values():
        if str(beat.get("job")) == str(job_id) and beat.get("node"):
            by_node[beat["node"]].append(beat)
    return {
        node: sorted(b["rank"] for b in beats)
        for node, beats in sorted(by_node.items())
        if all(not b.get("ended") and now - b.get("time", now) > STALE_S for b in beats)
    }


def slurmd_port() -> int:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"^SlurmdPort\s*=\s*(\d+)", out, flags=re.M)
    return int(m.group(1)) if m else 6818


def unreachable(hosts: list[str], port: int, timeout_s: float = 2.0) -> list[str]:
    """The hosts whose slurmd does not answer a connection from here (a cut link, a dead node)."""
    import socket

    gone = []
    for host in hosts:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError:
            gone.append(host)
    return gone


def controller_answers() -> bool:
    """This node still reaches slurmctld: only then may it decide for the job (a node cut off sees
    every other node as lost, and could not submit anyway)."""
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "UP" in out


def _last_step(run_dir: str | Path, job_id: str) -> int:
    return max(
        (int(b.get("step", 0)) for b in read_heartbeats(run_dir).values() if str(b.get("job")) == str(job_id)),
        default=0,
    )


def _claim(run_dir: Path, job_id: str) -> bool:
    path = run_dir / "slurm" / f"lost-{job_id}.json"
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


# what this task's rank was given (by Slurm, submitit, the worker): a new job gets its own
TASK_VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "DAPPLE_CKPT",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "CUDA_VISIBLE_DEVICES",
)


def without_job_env():
    """This task's own variables, out of the way of a new submission: sbatch passes the submitting
    environment on, and the new job's tasks would start with a rank and rendezvous that are not theirs."""
    saved = {
        k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SUBMITIT_", "SBATCH_")) or k in TASK_VARIABLES
    }
    for k in saved:
        del os.environ[k]
    return saved


def after_failure(task, job) -> str | None:
    """Called by every task whose rank failed. None: no node was lost (an ordinary failure); else the
    fate line (the same on every survivor's log)."""
    from omegaconf import OmegaConf

    from ..runtime.checkpoint import find_checkpoints

    log = get_logger()
    run_dir, job_id = Path(task.run_dir), str(job.job_id)
    failed_at = time.time()
    time.sleep(SETTLE_S)
    lost = lost_nodes(run_dir, job_id)
    here = socket.gethostname()
    peers = [h for h in job.hostnames if h != here and h not in lost]
    beats = read_heartbeats(run_dir)
    for host in unreachable(peers, slurmd_port()):  # alive, maybe, but cut off from this node
        lost[host] = sorted(b["rank"] for b in beats.values() if str(b.get("job")) == job_id and b.get("node") == host)
    if not lost:
        return None
    if not controller_answers():
        line = (
            f"{here} reaches neither node {', '.join(lost)} nor the Slurm controller: this node is the one cut "
            f"off, and leaves the job to the others"
        )
        log.error(line)
        return line
    ranks = sorted(r for rs in lost.values() for r in rs)
    names = ", ".join(lost)
    if not _claim(run_dir, job_id):
        line = f"node {names} lost (ranks {', '.join(map(str, ranks))}); another survivor sees to the job"
        log.error(line)
        return line
    cfg = mapping(OmegaConf.load(Path(task.snapshot) / "config.yaml"))
    left = [h for h in job.hostnames if h not in lost]
    found = find_checkpoints(run_dir / "checkpoints")
    step = _last_step(run_dir, job_id)
    kept = found[-1].name if found else None
    since = (
        f"the steps since {kept} (up to step {step}) are lost"
        if kept
        else f"no checkpoint was written yet: the {step} steps so far are lost"
    )
    head = (
        f"node {names} lost (ranks {', '.join(map(str, ranks))}, job {job_id}, detected {SETTLE_S:.0f} s after "
        f"the first failure)"
    )
    facts = dict(lost=lost, ranks=ranks, step=step, checkpoint=kept, failed_at=failed_at)
    if str(cfg.strategy.name) != "auto":
        line = (
            f"{head}: the plan's fixed layout (strategy={cfg.strategy.name}) needs {len(job.hostnames)} nodes and "
            f"{len(left)} are left, so the job stops; strategy=auto re-plans for the nodes left, or resume when the "
            f"node is back with ckpt_path=last ({since})"
        )
        write_fate(run_dir, job_id, "stopped", line, **facts)
        log.error(line)
        _cancel(job_id)
        return line
    successor = _submit_successor(task, cfg, job, left, lost)
    (run_dir / "slurm" / "job_id").write_text(f"{successor}\n")
    line = f"{head}: job {successor} resumes on {len(left)} node(s) ({', '.join(left)}), re-planned for them, from " + (
        f"{kept}; {since}" if kept else f"the start; {since}"
    )
    write_fate(run_dir, job_id, "replaced", line, successor=successor, **facts)
    log.error(line)
    _cancel(job_id)  # so Slurm does not requeue it beside its successor
    return line


def _submit_successor(task, cfg, job, left: list[str], lost: dict) -> str:
    from .sbatch import executor_for

    tasks_per_node = job.num_tasks // max(job.num_nodes, 1)
    ex = executor_for(cfg, len(left), tasks_per_node, Path(task.run_dir), exclude=",".join(lost))
    saved = without_job_env()
    try:
        new = ex.submit(task.successor())
    finally:
        os.environ.update(saved)
    return str(new.job_id)


def _cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True)


def replanned_snapshot(task, job) -> str:
    """The successor of a job that lost a node: task 0 plans for the nodes this job was given and
    writes the plan where every task reads it (the run's plan.json and config.yaml too); the others
    wait for it. Planning is done once, so the ranks cannot disagree."""
    from omegaconf import OmegaConf

    run_dir = Path(task.run_dir)
    where = run_dir / ".dapple" / f"replan-{job.job_id}"
    done = where / "plan.json"
    if job.global_rank == 0:
        from ..plan_config import cached_plan

        cfg = mapping(OmegaConf.load(Path(task.snapshot) / "config.yaml"))
        cfg.pop("plan", None)
        cfg.cluster.nodes = job.num_nodes
        cfg.cluster.devices_per_node = job.num_tasks // job.num_nodes
        plan = cached_plan(cfg)
        resolved = cast(dict, OmegaConf.to_container(cfg, resolve=True))
        resolved["plan"] = plan.to_dict()
        where.mkdir(parents=True, exist_ok=True)
        text = OmegaConf.to_yaml(OmegaConf.create(resolved))
        for place in (run_dir, where):
            (place / "config.yaml.tmp").write_text(text)
            (place / "config.yaml.tmp").replace(place / "config.yaml")
        plan.save(run_dir / "plan.json")
        plan.save(done)  # last (and atomic): its presence means both files are whole
        get_logger().info(
            f"re-planned for {job.num_nodes} node(s) × {cfg.cluster.devices_per_node}: {plan.explain().splitlines()[0]}"
        )
    else:
        end = time.time() + 600
        while not done.is_file():
            if time.time() > end:
                raise RuntimeError(f"task 0 of job {job.job_id} wrote no plan in {where} within 600 s")
            time.sleep(0.2)
    return str(where)
