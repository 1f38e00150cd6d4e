"""One process: the generated sbatch script equals a recorded copy reviewed like code."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from dapple_launch.launch.slurm import submission_script
from dapple_launch.plan_config import plan_from_config
from dapple_launch.planner.plan import Plan

GOLDEN = Path(__file__).resolve().parent / "golden" / "v100x16-bert.sbatch"
RUN_DIR = Path('/shared/runs/bert "large" it\'s here')


def render(compose_cfg) -> str:
    cfg = compose_cfg(
        [
            "model=bert",
            "cluster=v100x16",
            "strategy=fixed",
            "global_batch_size=128",
            "strategy.num_micro_batches=8",
            "cluster.partition=gpu",
            "cluster.account=ml-team",
            "cluster.time_min=120",
            "cluster.setup=[module load cuda/12.4,source /opt/env/bin/activate]",
        ]
    )
    plan = Plan.from_dict(plan_from_config(cfg).to_dict())
    # The interpreter's path differs between machines; everything else is fixed by the config.
    return submission_script(cfg, plan, RUN_DIR).replace(sys.executable, "PYTHON")


@pytest.mark.skipif(
    shutil.which("srun") is None,
    reason="submitit renders the script only where srun exists (a Slurm client; the Slurm tier installs one)",
)
@pytest.mark.slow  # (over a second: out of the fast tier)
def test_generated_script_matches_the_recorded_copy(compose_cfg):
    text = render(compose_cfg)
    if not GOLDEN.exists():  # first run records it; review the file like code
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=8" in text and "--gpus-per-node=8" in text
    assert "module load cuda/12.4" in text and "#SBATCH --partition=gpu" in text and "#SBATCH --account=ml-team" in text


@pytest.mark.skipif(
    shutil.which("srun") is None,
    reason="submitit renders the script only where srun exists (a Slurm client; the Slurm tier installs one)",
)
@pytest.mark.slow  # (over a second: out of the fast tier)
def test_devices_auto_submits_exactly_the_nodes_and_tasks_its_plan_uses(compose_cfg):
    """strategy.devices=auto chose fewer devices than the cluster has: the job asks for those nodes,
    tasks and GPUs only (what the user pays for)."""
    from dapple_launch.runtime.placement import job_shape

    cfg = compose_cfg(
        [
            "model=bert",
            "cluster=v100x16",
            "strategy=auto",
            "strategy.devices=auto",
            "strategy.max_devices=3",
            "global_batch_size=64",
            "cluster.partition=gpu",
        ]
    )
    plan = plan_from_config(cfg)
    assert plan.world_size <= 3
    nodes, tasks = job_shape(plan, 8)
    text = submission_script(cfg, plan, RUN_DIR)
    assert f"#SBATCH --nodes={nodes}" in text and f"#SBATCH --ntasks-per-node={tasks}" in text
    assert f"--gpus-per-node={tasks}" in text and nodes == 1 and tasks == plan.world_size
