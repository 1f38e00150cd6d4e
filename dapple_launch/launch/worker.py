"""One rank: `python -m dapple_launch.launch.worker RUN_DIR` (RANK, WORLD_SIZE, ... in the environment).

It reads the plan and resolved config the submitting command wrote, so every rank runs the plan
that was made once, at launch time, and never re-plans.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf


def main(run_dir: str) -> None:
    run = Path(run_dir)
    threads = int(os.environ.get("DAPPLE_THREADS", "1"))
    torch.set_num_threads(threads)
    from ..planner.plan import Plan
    from ..train import fit
    cfg = OmegaConf.load(run / "config.yaml")
    plan = Plan.load(run / "plan.json")
    ckpt = os.environ.get("DAPPLE_CKPT") or None
    fit(cfg, plan, run, ckpt)
    _leave_together()


def _leave_together() -> None:
    """Tear the process group down on purpose once every rank is done. Left to interpreter exit,
    gloo's threads are destroyed in whatever order the runtime picks, and now and then a rank
    aborts ("terminate called without an active exception", exit -6) after a run that succeeded."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
