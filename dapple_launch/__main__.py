"""`python -m dapple_launch [overrides]`: compose → validate → plan → launch, nothing else."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .config import CONF_DIR


def _plan(cfg: DictConfig):
    from .planner.plan import Plan
    try:
        return Plan.from_dict(OmegaConf.to_container(cfg.plan, resolve=True))
    except OmegaConfBaseException as exc:  # a ValueError raised inside the plan resolver
        cause = exc.__cause__ or exc
        raise cause if isinstance(cause, ValueError) else ValueError(str(exc)) from None


def run(cfg: DictConfig) -> int:
    from .launch.local import launch_local
    from .plan_config import model_from_config
    from .run_dir import resolve_checkpoint, write_run_files

    plan = _plan(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    print(plan.explain())
    if cfg.dry_run:
        write_run_files(cfg, plan, run_dir)
        print(f"dry run: plan written to {run_dir / 'plan.json'}; nothing started")
        return 0
    launcher = cfg.launcher.name
    if launcher == "auto":
        # Inside a Slurm job (a hydra-submitit sweep point) the ranks start here, on the allocation.
        launcher = "local" if "SLURM_JOB_ID" in os.environ else cfg.cluster.launcher
    if launcher not in ("local", "slurm"):
        raise ValueError(f"unknown launcher {launcher!r}; valid launchers: auto, local, slurm")
    if launcher == "slurm":
        from .launch.slurm import check_can_submit, launch_slurm
        check_can_submit(cfg, plan, run_dir)
    ckpt_path = resolve_checkpoint(cfg, run_dir, model_from_config(cfg.model).describe())
    write_run_files(cfg, plan, run_dir)
    if ckpt_path:
        print(f"resuming from {ckpt_path}")
    if launcher == "slurm":
        return launch_slurm(cfg, plan, run_dir, ckpt_path)
    code = launch_local(plan, run_dir, ckpt_path)
    if code == 0:
        print(f"done: plan, config, logs and checkpoints are in {run_dir}")
    return code


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        code = run(cfg)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    if code:
        sys.exit(code)


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
