"""The sbatch request submitit makes for a job: one task per device of the nodes the plan uses, the
GPUs those tasks sit on, and the cluster's partition, account, QoS and limits (launch/slurm.py submits
it; launch/node_loss.py submits a successor through it)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from ..planner.plan import Plan
from ..runtime.placement import job_shape


def executor(cfg: DictConfig, plan: Plan, run_dir: Path):
    # one task per device of the nodes the plan touches; tasks on devices it leaves idle exit at once
    nodes, tasks_per_node = job_shape(plan, cfg.cluster.devices_per_node)
    return executor_for(cfg, nodes, tasks_per_node, run_dir)


def executor_for(cfg: DictConfig, nodes: int, tasks_per_node: int, run_dir: Path, exclude: str | None = None):
    import submitit

    c = cfg.cluster
    ex = submitit.AutoExecutor(folder=str(run_dir / "slurm"), cluster="slurm", slurm_max_num_timeout=c.max_num_timeout)
    params = dict(
        nodes=nodes,
        tasks_per_node=tasks_per_node,
        cpus_per_task=c.cpus_per_task,
        timeout_min=c.time_min,
        name=f"dapple-{cfg.model.name}",
        slurm_setup=list(c.setup),
    )
    if c.device_kind == "gpu":  # the GPUs the plan's tasks sit on, no more (strategy.devices=auto may use few)
        params["gpus_per_node"] = tasks_per_node
    for key, value in (
        ("slurm_partition", c.partition),
        ("slurm_account", c.account),
        ("slurm_qos", c.qos),
        ("slurm_constraint", c.constraint),
        ("mem_gb", c.mem_gb),
        ("slurm_exclude", exclude),
    ):
        if value:
            params[key] = value
    ex.update_parameters(**params)
    return ex
