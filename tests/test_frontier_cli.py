"""The frontier and recomputation as a user reaches them: `python -m dapple_launch ...`."""

from __future__ import annotations

import json

import pytest

from .conftest import TINY_GPT, cli

QUIET = [
    "trainer.progress_bar=false",
    "trainer.val_check_interval=100",
    "trainer.limit_val_batches=1",
    "data.num_train=64",
    "data.num_val=8",
]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_pareto_dry_run_writes_the_frontier_and_any_point_of_it_runs(tmp_path):
    """objective=pareto: the table with the chosen point marked, pareto.json (plans in plan.json's
    schema, fastest first) and pareto.svg; then the last (least-memory) point runs from pareto.json
    with strategy=file strategy.plan_index=K on this machine, as written."""
    out = cli(
        [*TINY_GPT, "strategy=auto", "strategy.objective=pareto", "dry_run=true", f"hydra.run.dir={tmp_path}/dry"],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "frontier:" in out.stdout and "→" in out.stdout
    points = json.loads((tmp_path / "dry" / "pareto.json").read_text())
    assert len(points) >= 2
    times = [p["estimate"]["iteration_s"] for p in points]
    assert times == sorted(times)
    assert (tmp_path / "dry" / "pareto.svg").read_text().startswith("<svg")
    k = len(points) - 1
    run = cli(
        [
            *TINY_GPT,
            *QUIET,
            "strategy=file",
            f"strategy.plan_file={tmp_path}/dry/pareto.json",
            f"strategy.plan_index={k}",
            "trainer.max_steps=2",
            f"hydra.run.dir={tmp_path}/run",
        ],
        tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    ran = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert ran["stages"] == points[k]["stages"] and ran["num_micro_batches"] == points[k]["num_micro_batches"]
    assert "done: steps 0..2" in run.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,needle",
    [
        (["strategy=auto", "strategy.memory_budget_gib=0.00001"], "no plan fits strategy.memory_budget_gib"),
        (["strategy.recompute=selective"], "needs exactly one of strategy.recompute_layers"),
        (["model=bert", "model.preset=tiny", "strategy.token_slices=[32,32]"], "does not support token slicing"),
    ],
)
def test_frontier_recompute_and_slice_refusals_end_the_command_in_one_line(tmp_path, args, needle):
    """One of each kind through the command (a plan that fits no budget, a bad recomputation setting,
    slicing a model that cannot be sliced): exit 2, one line, no traceback; the rest in-process below."""
    out = cli([*TINY_GPT, *args, "dry_run=true", f"hydra.run.dir={tmp_path}/bad"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["strategy=file", "strategy.plan_file={dry}/pareto.json"], "pick one with strategy.plan_index=K, K in 0.."),
        (["strategy=file", "strategy.plan_file={dry}/pareto.json", "strategy.plan_index=99"], "strategy.plan_index=K"),
        (["strategy=auto", "strategy.memory_budget_gib=1000"], "strategy.memory_budget_gib=1000 is more than the"),
        (["strategy=auto", "strategy.deadline_s_per_iteration=1"], "apply with strategy.devices=auto only"),
        (
            ["strategy=auto", "strategy.devices=auto", "strategy.deadline_s_per_iteration=0.0000001"],
            "no device count meets strategy.deadline_s_per_iteration",
        ),
        (["strategy.recompute=full", "strategy.schedule=zb_h1"], "a split backward's W would run the recomputed"),
        (["strategy.token_slices=[4,4]"], "sum to 8 tokens but model gpt's sequences have 16"),
        (["strategy.token_slices=[4,4,8]", "strategy.recompute=full"], "recomputed forward would not see"),
        (["strategy.token_slices=sometimes"], "must be none, auto, or a list of token counts"),
    ],
)
def test_frontier_recompute_and_slice_refusals_name_the_rule(tmp_path, args, needle):
    """What the command refuses before starting anything (checked by the same functions it calls)."""
    from dapple_launch.cli import check
    from dapple_launch.plan_config import _choice_for, _plan_key, plan_from_config
    from dapple_launch.planner.frontier import frontier_to_json

    dry = tmp_path / "dry"
    dry.mkdir()
    if "{dry}/pareto.json" in " ".join(args):  # a frontier file for the index checks
        cfg = check([*TINY_GPT, "strategy=auto", "strategy.objective=pareto"])
        (dry / "pareto.json").write_text(frontier_to_json(_choice_for(_plan_key(cfg))))
    with pytest.raises(ValueError) as refused:
        plan_from_config(check([*TINY_GPT, *[a.replace("{dry}", str(dry)) for a in args]]))
    assert needle in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_fixed_layout_trains_with_recomputation_from_the_command_line(tmp_path):
    """strategy.recompute=selective strategy.recompute_counts=[1,2]: plan.json lists the positions, and
    four ranks train with them."""
    out = cli(
        [
            *TINY_GPT,
            *QUIET,
            "strategy.recompute=selective",
            "strategy.recompute_counts=[1,2]",
            "trainer.max_steps=2",
            f"hydra.run.dir={tmp_path}/r",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    firsts = [s["layers"][0] for s in plan["stages"]]
    assert [s["recompute_layers"] for s in plan["stages"]] == [[firsts[0]], [firsts[1], firsts[1] + 1]]
    assert "recomputed" in out.stdout and "done: steps 0..2" in out.stdout


@pytest.mark.slow
def test_devices_auto_plans_the_cheapest_allocation_on_the_cluster(tmp_path):
    """devices=auto with a generous deadline: the fewest device-seconds per sample; the table lists each
    device count and the plan uses the cluster's first devices only."""
    out = cli(
        [
            *TINY_GPT,
            "strategy=auto",
            "strategy.devices=auto",
            "strategy.deadline_s_per_iteration=100",
            "dry_run=true",
            f"hydra.run.dir={tmp_path}/d",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    points = json.loads((tmp_path / "d" / "pareto.json").read_text())
    counts = sorted({sum(s["replicas"] for s in p["stages"]) for p in points})
    assert counts == [1, 2, 3, 4]  # cluster=local: 4 devices on one node
    plan = json.loads((tmp_path / "d" / "plan.json").read_text())
    cost = [sum(s["replicas"] for s in p["stages"]) * p["estimate"]["iteration_s"] for p in points]
    assert sum(s["replicas"] for s in plan["stages"]) * plan["estimate"]["iteration_s"] == pytest.approx(min(cost))
    used = sorted(d for s in plan["stages"] for d in s["devices"])
    assert used == list(range(len(used)))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_token_slices_from_the_command_line_train_and_draw_their_timeline(tmp_path):
    """strategy.token_slices=[4,4,8] on the tiny GPT (16 tokens): schedule terapipe, four ranks train,
    and the pipeline timeline labels each slice."""
    out = cli(
        [
            *TINY_GPT,
            *QUIET,
            "strategy.token_slices=[4,4,8]",
            "trainer.max_steps=3",
            "trainer.profile_pipeline=true",
            "trainer.profile_steps=1",
            f"hydra.run.dir={tmp_path}/t",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    plan = json.loads((tmp_path / "t" / "plan.json").read_text())
    assert plan["schedule"] == "terapipe" and plan["token_slices"] == [4, 4, 8]
    assert "done: steps 0..3" in out.stdout
    timeline = json.loads((tmp_path / "t" / "timeline.json").read_text())
    assert "F0.2" in json.dumps(timeline)
