"""The Slurm tier: the product's own command against a real one-node Slurm (slurm/dev-cluster.sh).

Run with `pytest -m slurm` after `slurm/dev-cluster.sh start`; scripts/test.sh does both.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time

import pytest
import torch

from dapple_launch.runtime.checkpoint import find_checkpoints, read_shards

from .conftest import TINY_GPT, cli
from .test_cli import losses

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(shutil.which("sbatch") is None, reason="no Slurm here")]
TWO_TASKS = [
    *TINY_GPT,
    "cluster=slurm-dev",
    "cluster.nodes=1",
    "cluster.devices_per_node=2",
    "strategy.replicas=[1]",
    "trainer.progress_bar=false",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=10",
    "trainer.limit_val_batches=1",
    "data.num_train=512",
    "data.num_val=32",
    "trainer.lr_decay_steps=300",
]


def job_id(stdout: str) -> str:
    m = re.search(r"Submitted job (\d+)", stdout)
    assert m, stdout
    return m.group(1)


def state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
    return out


def wait_gone(job: str, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if not state(job):
            return
        time.sleep(2)
    raise AssertionError(f"job {job} still {state(job)} after {timeout} s")


def test_submitted_pipelined_job_trains_and_checkpoints(tmp_path):
    run = tmp_path / "run dir with 'quotes' and spaces"
    quoted = str(run).replace("\\", "\\\\").replace("'", "\\'")  # Hydra's override grammar
    out = cli(
        [
            *TWO_TASKS,
            "trainer.max_steps=20",
            "trainer.checkpoint_every_n_steps=10",
            "launcher.wait=true",
            f"hydra.run.dir='{quoted}'",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "finished" in out.stdout
    job = job_id(out.stdout)
    assert (run / "slurm" / "job_id").read_text().strip() == job
    assert (run / "plan.json").is_file()
    got = losses(run)
    assert got[min(got)] > got[max(got)]
    assert [p.name for p in find_checkpoints(run / "checkpoints")][-1] == "step000020.ckpt"


def test_a_plan_whose_device_groups_hold_several_stages_is_submitted_and_trains(tmp_path):
    """ZB-V: four stages on two tasks, each task holding two stages (what the planner picks for
    model=bert cluster=v100x16): submitted as planned, trained, checkpointed."""
    run = tmp_path / "run"
    out = cli(
        [
            *TWO_TASKS,
            "strategy=fixed",
            "strategy.schedule=zbv",
            "strategy.stages=4",
            "strategy.num_micro_batches=4",
            "trainer.max_steps=20",
            "trainer.checkpoint_every_n_steps=10",
            "launcher.wait=true",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "finished" in out.stdout
    assert json.loads((run / "plan.json").read_text())["schedule"] == "zbv"
    got = losses(run)
    assert len(got) == 20 and all(map(math.isfinite, got.values()))
    assert [p.name for p in find_checkpoints(run / "checkpoints")][-1] == "step000020.ckpt"


def test_no_sbatch_is_refused_before_submission(tmp_path):
    env = {"PATH": os.path.dirname(shutil.which("python3") or "/usr/bin/python3")}
    out = cli([*TWO_TASKS, f"hydra.run.dir={tmp_path}/x"], tmp_path, env=env)
    assert out.returncode == 2 and "no sbatch" in out.stderr and "launcher=local" in out.stderr


def test_a_partition_slurm_rejects_surfaces_slurms_own_message(tmp_path):
    out = cli([*TWO_TASKS, "cluster.partition=no-such-partition", f"hydra.run.dir={tmp_path}/p"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Slurm refused the job" in out.stderr and "invalid partition" in out.stderr.lower(), out.stderr
    assert "Traceback" not in out.stderr and "Submitted job" not in out.stdout


def test_preempted_job_requeues_resumes_and_ends_with_the_same_weights(tmp_path):
    """Send a running job Slurm's preemption warning (USR2, as before a time limit or a preempting
    job): every rank saves the current step together, the job requeues itself, comes back, resumes
    that checkpoint and ends with the weights of an uninterrupted run (the same plan, local processes)."""
    steps = ["trainer.max_steps=300", "trainer.checkpoint_every_n_steps=10"]
    run = tmp_path / "preempted"
    out = cli([*TWO_TASKS, *steps, f"hydra.run.dir={run}"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    job = job_id(out.stdout)
    # While it runs: resubmitting into its run directory is refused, and nothing is submitted.
    again = cli([*TWO_TASKS, *steps, "ckpt_path=last", f"hydra.run.dir={run}"], tmp_path)
    assert again.returncode == 2 and f"belongs to job {job}" in again.stderr
    end = time.time() + 120
    while not find_checkpoints(run / "checkpoints") and time.time() < end:
        time.sleep(1)
    assert find_checkpoints(run / "checkpoints"), "no checkpoint before the preemption"
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    # Slurm holds a requeued batch job back (about 2 minutes here); let it start at once.
    for _ in range(30):
        if state(job) == "PENDING":
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
            break
        time.sleep(1)
    straight = tmp_path / "straight"
    local = cli(
        [
            *TWO_TASKS,
            *steps,
            "cluster=local",
            "cluster.devices_per_node=2",
            "launcher=local",
            f"hydra.run.dir={straight}",
        ],
        tmp_path,
    )
    assert local.returncode == 0, local.stdout + local.stderr
    wait_gone(job, 420)
    log = "".join(p.read_text() for p in (run / "slurm").glob(f"{job}_0_log.*"))
    assert "resum" in log.lower() or "Restoring states" in log, log[-2000:]
    saved = re.search(r"saved step \d+ in (\S+step(\d+)\.ckpt); the job requeues", log)
    assert saved, log[-3000:]  # the signal's own checkpoint, at whatever step it arrived
    assert f"resuming from {saved.group(1)}" in log, log[-3000:]
    a, _ = read_shards(find_checkpoints(straight / "checkpoints")[-1])
    b, _ = read_shards(find_checkpoints(run / "checkpoints")[-1])
    assert find_checkpoints(run / "checkpoints")[-1].name == "step000300.ckpt"
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_multirun_sweep_is_one_array_with_each_points_overrides(tmp_path):
    sweep = tmp_path / "sweep"
    out = cli(
        [
            "-m",
            "hydra/launcher=dapple_slurm",
            *TWO_TASKS,
            "trainer.max_steps=4",
            "trainer.checkpoint_every_n_steps=4",
            "strategy.num_micro_batches=2,4",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    job_dirs = sorted(d for d in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", d.name))
    assert len(job_dirs) == 2  # array tasks: <array job>_<index>
    assert len({d.name.split("_")[0] for d in job_dirs}) == 1  # one array
    plans = {json.loads((sweep / str(i) / "plan.json").read_text())["num_micro_batches"] for i in (0, 1)}
    assert plans == {2, 4}
    for i in (0, 1):
        assert find_checkpoints(sweep / str(i) / "checkpoints")


def test_time_limit_shorter_than_the_first_checkpoint_warns(tmp_path):
    out = cli(
        [
            *TWO_TASKS,
            "cluster.time_min=1",
            "trainer.checkpoint_every_n_steps=100000",
            "launcher.script_only=true",
            f"hydra.run.dir={tmp_path}/w",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "warning: the first checkpoint comes after" in out.stderr and "nothing was submitted" in out.stdout
