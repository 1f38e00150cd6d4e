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


def nccl_env(run_dir: Path) -> dict[str, str]:
    """NCCL's flight recorder on, dumping on a watchdog timeout into RUN_DIR/logs (the user's own
    settings win)."""
    wanted = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(Path(run_dir) / "logs" / "nccl-trace-rank-"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    return {k: os.environ.get(k, v) for k, v in wanted.items()}
