"""The Slurm a run finds itself in, as plain data: the allocation it runs inside (`cluster=from_slurm`)
and the development cluster that is up (`cluster=slurm-dev`).

Read from Slurm's own words only: the job's environment inside an allocation, `sinfo` for the
development cluster. The configs reach these through the `${dapple_allocation:KEY}` and
`${dapple_slurm_dev:KEY}` resolvers (config.py), so a dry run plans for exactly what is there.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Allocation:
    job_id: str
    hostnames: tuple[str, ...]
    tasks_per_node: int
    gpus_per_node: int  # 0: a CPU allocation
    source: str  # the variables it was read from, for the dry run's line

    @property
    def nodes(self) -> int:
        return len(self.hostnames)

    @property
    def device_kind(self) -> str:
        return "gpu" if self.gpus_per_node else "cpu"

    @property
    def devices_per_node(self) -> int:
        # a GPU run puts one rank on each GPU; a CPU run one rank on each task slot
        return self.gpus_per_node or self.tasks_per_node

    def describe(self) -> str:
        what = f"{self.gpus_per_node} GPUs" if self.gpus_per_node else f"{self.tasks_per_node} CPU tasks"
        return (
            f"cluster=from_slurm read job {self.job_id}: {self.nodes} node(s) ({','.join(self.hostnames)}) × "
            f"{what} per node, from {self.source}"
        )


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's compressed host list ("n[1-3,7],gpu01") as names, in Slurm's order."""
    names: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?(?:,|$)", text.strip()):
        stem, ranges = m.group(1), m.group(2)
        if not stem and not ranges:
            continue
        if ranges is None:
            names.append(stem)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{stem}{str(i).zfill(len(lo))}")
    return tuple(names)


def expand_counts(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE's form ("2(x3),1") as one count per node."""
    counts: list[int] = []
    for part in filter(None, text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"cannot read Slurm's task counts {text!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _gpus(env: Mapping[str, str]) -> tuple[int, str]:
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        value = env.get(key, "")
        m = re.search(r"(\d+)$", value)  # "4" or "a100:4"
        if m:
            return int(m.group(1)), key
    jobs = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS")
    if jobs:
        return len([g for g in jobs.split(",") if g.strip()]), "SLURM_JOB_GPUS"
    return 0, ""


def allocation(env: Mapping[str, str] | None = None) -> Allocation:
    """The allocation this process runs in; a ValueError naming what is missing outside one."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        raise ValueError(
            "cluster=from_slurm reads the Slurm allocation it runs in, but SLURM_JOB_ID is not set: run "
            "it inside one (salloc -N2 --ntasks-per-node=4, or an sbatch script), or pick a cluster "
            "config (cluster=slurm-dev, cluster=a100x64, ...)"
        )
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    if not hosts:
        raise ValueError(f"job {job} has no SLURM_JOB_NODELIST: cluster=from_slurm cannot tell its nodes")
    counts_text = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    counts = expand_counts(counts_text) if counts_text else []
    if "SLURM_NTASKS_PER_NODE" in env:
        counts = [int(env["SLURM_NTASKS_PER_NODE"])] * len(hosts)
    if len(set(counts)) > 1:
        raise ValueError(
            f"job {job} has {counts_text} tasks on its {len(hosts)} nodes; cluster=from_slurm needs the "
            f"same count on each: allocate with --ntasks-per-node"
        )
    gpus, gpu_key = _gpus(env)
    tasks = counts[0] if counts else (gpus or 1)
    source = "SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE" + (f", {gpu_key}" if gpu_key else "")
    return Allocation(job_id=job, hostnames=hosts, tasks_per_node=tasks, gpus_per_node=gpus, source=source)


@functools.lru_cache(maxsize=1)
def gpu_memory_gib() -> float | None:
    """The smallest GPU's memory on this node (nvidia-smi), None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        values = [float(v) / 1024 for v in out.split() if v.replace(".", "").isdigit()]
    except (OSError, subprocess.SubprocessError):
        return None
    return min(values) if values else None


@dataclass(frozen=True)
class DevCluster:
    nodes: int
    cpus_per_node: int
    up: bool  # False: no Slurm answers; the figures are the one-node default a dry run plans for


# what slurm/dev-cluster.sh starts with no options: one node of 4 task slots
DEV_DEFAULT = DevCluster(nodes=1, cpus_per_node=4, up=False)
USABLE = {"idle", "mixed", "allocated", "completing"}


@functools.lru_cache(maxsize=1)
def dev_cluster(partition: str = "debug") -> DevCluster:
    """The nodes of the development Slurm that are up now (sinfo), each node's task slots."""
    if shutil.which("sinfo") is None:
        return DEV_DEFAULT
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-p", partition, "-o", "%N %c %T"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return DEV_DEFAULT
    rows = [line.split() for line in out.stdout.splitlines() if len(line.split()) == 3]
    up = [(name, int(cpus)) for name, cpus, state in rows if state.rstrip("*~#") in USABLE]
    if out.returncode or not up:
        return DEV_DEFAULT
    return DevCluster(nodes=len({n for n, _ in up}), cpus_per_node=min(c for _, c in up), up=True)
