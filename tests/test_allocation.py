"""cluster=from_slurm and cluster=slurm-dev: what is read from Slurm (pure; no Slurm needed)."""

from __future__ import annotations

import pytest

from dapple_launch.allocation import allocation, expand_counts, expand_hostlist


@pytest.mark.parametrize(
    "text,names",
    [
        ("n1", ("n1",)),
        ("dapple-n[1-2]", ("dapple-n1", "dapple-n2")),
        ("gpu[01-03,07],login", ("gpu01", "gpu02", "gpu03", "gpu07", "login")),
    ],
)
def test_host_lists_expand_in_slurms_order(text, names):
    assert expand_hostlist(text) == names


def test_task_counts_expand_per_node():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]


def test_an_allocation_is_read_from_slurms_environment():
    a = allocation(
        {
            "SLURM_JOB_ID": "9",
            "SLURM_JOB_NODELIST": "g[1-4]",
            "SLURM_TASKS_PER_NODE": "8(x4)",
            "SLURM_GPUS_ON_NODE": "8",
        }
    )
    assert (a.nodes, a.devices_per_node, a.device_kind) == (4, 8, "gpu")
    assert "4 node(s) (g1,g2,g3,g4) × 8 GPUs per node" in a.describe()
    cpu = allocation({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "c1", "SLURM_NTASKS_PER_NODE": "3"})
    assert (cpu.nodes, cpu.devices_per_node, cpu.device_kind) == (1, 3, "cpu")


@pytest.mark.parametrize(
    "env,needle",
    [
        ({}, "SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "c[1-2]", "SLURM_TASKS_PER_NODE": "3,1"}, "needs the same count"),
    ],
)
def test_what_cannot_be_read_is_refused_in_one_line(env, needle):
    with pytest.raises(ValueError, match=needle):
        allocation(env)


def test_from_slurm_outside_an_allocation_is_one_line_and_exit_2(tmp_path):
    import os

    from .conftest import cli

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = cli(
        ["cluster=from_slurm", "dry_run=true", f"hydra.run.dir={tmp_path / 'r'}"],
        tmp_path,
        env=None if not any(k.startswith("SLURM_") for k in os.environ) else env,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: cluster=from_slurm reads the Slurm allocation")


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_from_slurm_plans_for_the_allocation_it_reads(tmp_path):
    from .conftest import cli

    out = cli(
        [
            "model.num_layers=2",
            "model.hidden=32",
            "cluster=from_slurm",
            "dry_run=true",
            "global_batch_size=16",
            f"hydra.run.dir={tmp_path / 'r'}",
        ],
        tmp_path,
        env={"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"},
    )
    assert out.returncode == 0, out.stderr
    assert "cluster=from_slurm read job 7: 2 node(s) (n1,n2) × 2 CPU tasks per node" in out.stdout + out.stderr
    import json

    assert sum(len(st["devices"]) for st in json.loads((tmp_path / "r" / "plan.json").read_text())["stages"]) == 4
