"""The devices a run asks for, checked before any process starts: a GPU run is a GPU run.

`cluster.device_kind=gpu` on a machine whose torch cannot reach CUDA (a CPU wheel, a driver
mismatch, a login node) would otherwise start the ranks and train on the CPU; two ranks of a
multi-node plan started on one machine would share a GPU (NCCL refuses that); bf16 on a card
without it fails deep inside the first step. Each is one line here, with what was found and the
fix. The ranks check again where they run (train.py), for launches that start them elsewhere.
NCCL's flight recorder is switched on for every GPU run, so a hang that ends in NCCL's watchdog
leaves each rank's last collectives and transfers on disk (`nccl_env`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..host import check_gpu_here


def check_local_gpu_launch(cfg, plan) -> None:
    """A GPU run started by the local launcher: every rank on this machine, each on its own GPU."""
    if str(cfg.cluster.device_kind) != "gpu":
        return
    from ..plan_config import run_precision
    from ..runtime.placement import job_shape

    nodes, per_node = job_shape(plan, int(cfg.cluster.devices_per_node))
    if nodes > 1:
        raise ValueError(
            f"the plan places ranks on {nodes} nodes, but launcher=local starts every rank on this machine, "
            f"which would put ranks of different nodes on the same GPU (NCCL refuses two ranks on one "
            f"GPU); use launcher=slurm, or plan for one node (cluster.nodes=1)"
        )
    check_gpu_here(run_precision(cfg), per_node)


def nccl_env(run_dir: Path, torch_version: str | None = None) -> dict[str, str]:
    """NCCL's flight recorder on, dumping on a watchdog timeout into RUN_DIR/logs (the user's own
    settings win, under either name). torch 2.9 renamed the recorder's variables (TORCH_FR_*) and
    warns at every rank's start where the old names are set; older releases read only the old."""
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    major, minor = (int(x) for x in torch_version.split("+")[0].split(".")[:2])
    new = (major, minor) >= (2, 9)
    names = {  # (the name this torch reads first, the other one)
        "buffer": ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
        "file": ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    }
    wanted = {
        names["buffer"][not new]: "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        names["file"][not new]: str(Path(run_dir) / "logs" / "nccl-trace-rank-"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    given = {k for pair in names.values() if any(n in os.environ for n in pair) for k in pair}
    return {k: os.environ.get(k, v) for k, v in wanted.items() if k not in given or k in os.environ}
