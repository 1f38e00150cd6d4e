"""Placement (pure): ranks follow planned devices; a plan the cluster cannot run is refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dapple_launch.cluster import Topology
from dapple_launch.planner.plan import Plan, StagePlan
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.placement import check_plan_runs_on, check_world_size, idle_devices, job_shape, place

from .conftest import TINY_GPT, cli

TOPO = Topology("two-by-four", 2, 4, 16e9, 10.0, 100e9, 10e9)


def plan_with(devices, layers=((0, 2), (2, 4)), dpn=4):
    from dapple_launch.planner.plan import Estimate

    stages = tuple(
        StagePlan(lr, tuple(f"l{i}" for i in range(*lr)), len(ds), tuple(ds)) for lr, ds in zip(layers, devices)
    )
    return Plan(
        "m", "two-by-four", 8, 4, 2, "1f1b", stages, Estimate(1.0, 8.0, (0.0,) * len(stages)), devices_per_node=dpn
    )


def test_ranks_follow_device_ids_and_place_on_node_and_local_device():
    plan = plan_with([[4, 5, 6], [0]])  # stage 0 on node 1, stage 1 on node 0
    grid = ProcessGrid.from_plan(plan)
    assert grid.stage_ranks(0) == [1, 2, 3] and grid.stage_ranks(1) == [0]
    assert [grid.position(r) for r in range(4)] == [(1, 0), (0, 0), (0, 1), (0, 2)]
    p = place(plan, 3, 4)
    assert (p.device, p.node, p.local) == (6, 1, 2)
    assert grid.rank_of_device(6) == 3 and grid.rank_of_device(1) is None
    # the Slurm job has a task on every device of the nodes the plan touches; the rest stay idle
    assert job_shape(plan, 4) == (2, 3)
    assert idle_devices(plan, 4) == [1, 2]


@pytest.mark.parametrize(
    "devices,layers,dpn,words",
    [
        ([[0, 1], [8]], ((0, 2), (2, 4)), 4, ["device(s) [8]", "ids 0..7", "cluster.nodes"]),
        ([[0, 1], [1, 2]], ((0, 2), (2, 4)), 4, ["device 1 is given to stages [0, 1]", "its own device"]),
        ([[0], [1]], ((0, 2), (3, 4)), 4, ["stage 1 covers layers [3, 4)", "must start at 2"]),
        ([[0], [1]], ((0, 2), (2, 4)), 8, ["made for 8 devices per node", "cluster.devices_per_node=4"]),
    ],
)
def test_a_plan_the_cluster_cannot_run_is_refused_with_the_numbers(devices, layers, dpn, words):
    with pytest.raises(ValueError) as err:
        check_plan_runs_on(plan_with(devices, layers, dpn), TOPO, num_layers=4)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_wrong_layer_count_and_rank_count_are_refused():
    with pytest.raises(ValueError, match="cover 4 layers but the model has 6"):
        check_plan_runs_on(plan_with([[0], [1]]), TOPO, num_layers=6)
    with pytest.raises(ValueError, match="needs 4 ranks .* but this run has 3; launch exactly 4"):
        check_world_size(plan_with([[0, 1, 2], [3]]), 3)


@pytest.mark.slow
def test_a_plan_file_runs_as_written_or_is_refused_before_anything_starts(tmp_path):
    out = cli(["dry_run=true", f"hydra.run.dir={tmp_path / 'a'}", *TINY_GPT], tmp_path)
    assert out.returncode == 0, out.stderr
    made = json.loads((tmp_path / "a" / "plan.json").read_text())
    # the same plan, read back through strategy=file, is accepted unchanged
    ok = cli(
        [
            "dry_run=true",
            "strategy=file",
            f"strategy.plan_file={tmp_path / 'a' / 'plan.json'}",
            f"hydra.run.dir={tmp_path / 'b'}",
            *TINY_GPT,
        ],
        tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "b" / "plan.json").read_text())["stages"] == made["stages"]
    # edited so two stages share device 0: refused, nothing started, the numbers and the fix named
    made["stages"][1]["devices"][0] = made["stages"][0]["devices"][0]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(made))
    out = cli(["strategy=file", f"strategy.plan_file={bad}", f"hydra.run.dir={tmp_path / 'c'}", *TINY_GPT], tmp_path)
    assert out.returncode == 2
    assert "device 0 is given to stages [0, 1]" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "c" / "logs").exists()


def test_a_plan_holding_nan_or_infinity_is_refused_where_it_is_read(tmp_path):
    """json reads NaN and Infinity as numbers: a plan.json with one is refused, with the fix, rather
    than printing a NaN estimate or failing inside the runtime."""
    from dapple_launch.plan_config import plan_from_file

    plan = plan_with([[0], [1]])
    for field, value in (("iteration_s", "NaN"), ("samples_per_s", "Infinity")):
        text = plan.to_json().replace(f'"{field}": {getattr(plan.estimate, field)!r}', f'"{field}": {value}')
        assert value in text
        with pytest.raises(ValueError, match=f"{value} is not a finite number"):
            Plan.from_json(text)
        path = tmp_path / f"{field}.json"
        path.write_text(text)
        with pytest.raises(ValueError, match=f"is not a readable plan .*{value} is not a finite number.*dry_run=true"):
            plan_from_file(str(path), None, plan.num_layers, plan.global_batch_size)


def test_plans_carry_the_devices_per_node_they_were_made_for():
    plan = plan_with([[0], [1]])
    assert Plan.from_json(plan.to_json()).devices_per_node == 4
    old = json.loads(plan.to_json())
    del old["devices_per_node"]  # a plan.json written before the field existed still loads
    assert Plan.from_dict(old) == dataclasses.replace(plan, devices_per_node=0)


def test_each_rank_binds_the_gpu_the_plan_placed_it_on(monkeypatch):
    """Rank 3 of a plan that puts it on device 6 (node 1, local 2) uses cuda:2 and says node 1;
    Lightning's own numbering (node × devices + local rank) is not used."""
    import torch

    from dapple_launch.runtime.placement import PlannedEnvironment
    from dapple_launch.runtime.strategy import DappleStrategy

    plan = plan_with([[4, 5, 6], [0]])
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    env = PlannedEnvironment(plan, 4)
    strategy = DappleStrategy(
        plan, cluster_environment=env, parallel_devices=[torch.device("cuda", i) for i in range(4)]
    )
    assert (env.global_rank(), env.node_rank(), env.local_rank()) == (3, 1, 2)
    assert strategy.root_device == torch.device("cuda", 2)
    # a task that sees only its own GPU (CUDA_VISIBLE_DEVICES per task, --gpus-per-task): that one
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert strategy.root_device == torch.device("cuda", 0)
    monkeypatch.undo()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    strategy.set_world_ranks()
    assert strategy.global_rank == 3 and strategy.world_size == 4
    assert (strategy.stage, strategy.replica) == (0, 2)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="needs 4 ranks"):
        PlannedEnvironment(plan, 4)


CHUNKED_FIXED = {
    "zbv": ["strategy.stages=8", "strategy.num_micro_batches=4"],
    "interleaved_1f1b": ["strategy.stages=8", "strategy.chunks=2", "strategy.num_micro_batches=4"],
    "interleaved_zb": ["strategy.stages=8", "strategy.chunks=2", "strategy.num_micro_batches=4"],
    "chimera": ["strategy.stages=4", "strategy.num_micro_batches=4"],
}


@pytest.mark.parametrize("schedule", sorted(CHUNKED_FIXED))
def test_a_plan_whose_device_groups_hold_several_stages_runs_from_its_file_and_on_slurm(
    schedule, compose_cfg, tmp_path
):
    """Interleaved, ZB-V and Chimera put several stages on one device group: the checks that Slurm
    submission and strategy=file run accept such a plan as planned (they refused every shared
    device, so `python -m dapple_launch model=bert cluster=v100x16` stopped after planning a ZB-V
    plan), and refuse a group whose stages disagree on its devices, or a device in two groups."""
    from dapple_launch.plan_config import plan_from_config, plan_from_file, topology_from_config

    cfg = compose_cfg(
        [
            "model=from_profile",
            "model.profile=bert-48-pbs-2",
            "cluster=v100x16",
            "strategy=fixed",
            f"strategy.schedule={schedule}",
            *CHUNKED_FIXED[schedule],
        ]
    )  # (a profile file: no model to trace)
    plan, topo = plan_from_config(cfg), topology_from_config(cfg.cluster)
    assert len({d for s in plan.stages for d in s.devices}) < sum(s.replicas for s in plan.stages)  # shared
    check_plan_runs_on(plan, topo, plan.num_layers)
    path = tmp_path / "plan.json"
    plan.save(path)
    assert plan_from_file(str(path), topo, plan.num_layers, plan.global_batch_size) == Plan.load(path)
    last = plan.stages[-1]  # shares a group with stage 0 (ZB-V, Chimera) or with a middle stage
    for devices, words in (
        (tuple(reversed(last.devices)), "list the same devices in the same order"),
        ((plan.stages[1].devices[0], *last.devices[1:]), "same devices in the same order"),
        ((last.devices[0],) * last.replicas, "more than once"),
    ):
        edited = dataclasses.replace(plan, stages=(*plan.stages[:-1], dataclasses.replace(last, devices=devices)))
        with pytest.raises(ValueError, match=words):
            check_plan_runs_on(edited, topo, plan.num_layers)


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_the_headline_plan_passes_the_submission_checks(compose_cfg):
    """`python -m dapple_launch model=bert cluster=v100x16`: whatever schedule the planner picks,
    the plan it prints is one the cluster's checks accept."""
    from dapple_launch.plan_config import plan_from_config, topology_from_config

    cfg = compose_cfg(["model=bert", "cluster=v100x16"])
    plan = plan_from_config(cfg)
    check_plan_runs_on(plan, topology_from_config(cfg.cluster), plan.num_layers)
