"""One job: plan (or read the plan), check the data and the checkpoint, write the run files, launch.

Every check here runs before any process starts or any job is submitted; a refusal is a
ValueError with one line (the command line turns it into exit code 2).
"""
from __future__ import annotations

import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ..planner.plan import Plan


def plan_of(cfg: DictConfig) -> Plan:
    """The plan, made outside the `${dapple_plan:}` interpolation so its errors arrive as they are."""
    from ..config import check_schema
    from ..plan_config import cached_plan
    check_schema(cfg)
    return cached_plan(cfg)


def check_data(cfg: DictConfig, plan: Plan, model) -> None:
    """Enough samples for one global batch and a validation batch the stages can split."""
    d, G = cfg.data, cfg.global_batch_size
    widest = max(s.replicas for s in plan.stages)
    if d.kind == "synthetic":
        if d.num_train < G:
            raise ValueError(f"data.num_train={d.num_train} is fewer samples than one global batch "
                             f"(global_batch_size={G}): nothing would train; set data.num_train>={G}")
        if d.num_val < widest:
            raise ValueError(f"data.num_val={d.num_val} cannot be split across the {widest} replicas of a stage; "
                             f"set data.num_val>={widest}")
        return
    from ..data.files import check
    check(d, model, G, widest)


def run(cfg: DictConfig) -> int:
    from ..models import identity
    from ..plan_config import model_from_config
    from ..run_dir import resolve_checkpoint, write_run_files
    from .local import launch_local

    plan = plan_of(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    print(plan.explain())
    model = model_from_config(cfg.model) if cfg.model.name != "from_profile" else None
    if model is not None:
        check_data(cfg, plan, model)
    if cfg.dry_run:
        write_run_files(cfg, plan, run_dir)
        print(f"dry run: plan written to {run_dir / 'plan.json'}; nothing started")
        return 0
    if model is None:
        raise ValueError("model=from_profile describes a profile only, for planning (dry_run=true); it has no "
                         "layers to train: pick model=gpt, bert, vgg19 or custom to train")
    launcher = str(cfg.launcher.name)
    if launcher == "auto":
        # Inside a Slurm job (a hydra-submitit sweep point) the ranks start here, on the allocation.
        launcher = "local" if "SLURM_JOB_ID" in os.environ else str(cfg.cluster.launcher)
    if launcher == "slurm":
        from .slurm import check_can_submit, launch_slurm
        check_can_submit(cfg, plan, run_dir)
    ckpt_path = resolve_checkpoint(cfg, run_dir, identity(model))
    write_run_files(cfg, plan, run_dir)
    if ckpt_path:
        print(f"resuming from {ckpt_path}")
    if launcher == "slurm":
        return launch_slurm(cfg, plan, run_dir, ckpt_path)
    code = launch_local(plan, run_dir, ckpt_path)
    if code == 0:
        print(f"done: plan, config, logs and checkpoints are in {run_dir}")
    return code
