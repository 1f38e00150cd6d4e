"""The resolvers the configs interpolate: what a Slurm allocation holds (`${dapple_allocation:KEY}`,
cluster=from_slurm), the development Slurm that is up (`${dapple_slurm_dev:KEY}`, cluster=slurm-dev)
and the GPUs a Slurm job requests. The plan's (`${dapple_plan:}`) is plan_config's, the layer that
plans: it registers it when imported (the config package stays below the planner)."""

from __future__ import annotations

from omegaconf import OmegaConf


def _gpus_per_node(device_kind, devices_per_node):
    """What a Slurm allocation must request per node: the node's GPUs on a GPU cluster, none on CPUs."""
    return int(devices_per_node) if str(device_kind) == "gpu" else None


def _allocation_value(key):
    """`${dapple_allocation:KEY}`: what cluster=from_slurm reads from the allocation it runs in."""
    from ..allocation import allocation, gpu_memory_gib

    a = allocation()
    if key == "device_memory_gib":
        if a.device_kind == "cpu":
            return 4.0
        found = gpu_memory_gib()
        if found is None:
            raise ValueError(
                f"job {a.job_id} has {a.gpus_per_node} GPUs per node but nvidia-smi does not say how much "
                f"memory each holds here: set cluster.device_memory_gib"
            )
        return found
    return getattr(a, str(key))


def _slurm_dev_value(key):
    """`${dapple_slurm_dev:KEY}`: the development Slurm that is up now (one node of 4 slots if none)."""
    from ..allocation import dev_cluster

    return getattr(dev_cluster(), str(key))


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("dapple_gpus_per_node"):
        OmegaConf.register_new_resolver("dapple_gpus_per_node", _gpus_per_node)
    for name, fn in (("dapple_allocation", _allocation_value), ("dapple_slurm_dev", _slurm_dev_value)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
