"""The product as a user runs it: `python -m dapple_launch ...` in a subprocess.

Runs use a tiny GPT so each takes seconds; the multi-process ones start 4 gloo ranks.
"""

from __future__ import annotations

import csv
import json
import re
import uuid
from pathlib import Path

import pytest
import torch

from dapple_launch.runtime.checkpoint import find_checkpoints, read_shards

from .conftest import TINY_GPT, cli

FAST = [
    *TINY_GPT,
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=1",
    "trainer.log_every_n_steps=1",
    "trainer.lr_decay_steps=8",
    "trainer.warmup_steps=2",
    "trainer.progress_bar=false",
    "data.num_train=256",
    "data.num_val=32",
]


def losses(run_dir: Path) -> dict[int, float]:
    (metrics,) = run_dir.rglob("metrics.csv")
    return {int(r["step"]): float(r["train_loss"]) for r in csv.DictReader(metrics.open()) if r.get("train_loss")}


@pytest.mark.slow
def test_dry_run_contract(tmp_path):
    out = cli(
        [
            "model=bert",
            "cluster=v100x16",
            "strategy=fixed",
            "strategy.replicas=[8]",
            "global_batch_size=128",
            "strategy.num_micro_batches=8",
            "dry_run=true",
            f"hydra.run.dir={tmp_path}/dry",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads((tmp_path / "dry" / "plan.json").read_text())
    assert [s["replicas"] for s in plan["stages"]] == [8, 8]
    assert plan["stages"][1]["devices"] == list(range(8, 16))
    assert plan["micro_batch_size"] * plan["num_micro_batches"] == plan["global_batch_size"] == 128
    assert len(plan["estimate"]["peak_memory_bytes"]) == 2
    assert "nothing started" in out.stdout and not (tmp_path / "dry" / "logs").exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["strategy.replicas=[3]"], "uses 6 devices but cluster local has 4"),
        (["strategy.stages=9", "strategy.replicas=[1]"], "only 4 layers"),
        (["global_batch_size=10"], "not divisible by strategy.num_micro_batches=4"),
        (
            ["strategy.stages=4", "strategy.replicas=[1]", "strategy.num_micro_batches=2", "global_batch_size=8"],
            "needs at least 4 micro-batches",
        ),
        (["+model.hidn=3"], "model.hidn is not a setting of model=gpt; did you mean model.hidden"),
        (["model.hidn=3"], "model.hidn is not a setting of model=gpt; did you mean model.hidden"),
        # refused after planning, as the ranks' zygote imports beside it
        (["ckpt_path=/nonexistent/step000004.ckpt"], "ckpt_path=/nonexistent/step000004.ckpt does not exist"),
    ],
)
@pytest.mark.slow
def test_bad_input_is_refused_before_any_process_starts(tmp_path, args, needle):
    mark = f"refused-{uuid.uuid4().hex}"  # in the environment of every process the launch starts
    out = cli([*FAST, *args, f"hydra.run.dir={tmp_path}/bad"], tmp_path, env={"DAPPLE_TEST_MARK": mark})
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "bad" / "logs").exists()
    # the ranks' zygote, started beside the planning, went with the refusal
    assert not processes_marked(mark)


def processes_marked(mark: str) -> list[int]:
    """The live processes whose environment holds DAPPLE_TEST_MARK=mark."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"DAPPLE_TEST_MARK={mark}".encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def test_unknown_model_lists_valid_ones(tmp_path):
    out = cli(["model=gtp", "dry_run=true", f"hydra.run.dir={tmp_path}/x"], tmp_path)
    assert out.returncode == 2 and "model=gtp is not an option of model; did you mean model=gpt?" in out.stderr
    assert "custom" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.multiprocess
def test_default_job_contract_resume_and_layout_change(tmp_path):
    """Train 8 steps straight; train 4, stop, resume to 8: same weights. Resume the step-4
    checkpoint as 1 stage × 4 replicas and 4 stages × 1: the same losses continue."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    out = cli(
        [
            *FAST,
            "logger=csv",
            "trainer.max_steps=8",
            "trainer.checkpoint_every_n_steps=4",
            "trainer.profile_pipeline=true",
            f"hydra.run.dir={straight}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # trainer.profile_pipeline: every rank's recorded actions, next to the simulator's prediction
    timeline = json.loads((straight / "timeline.json").read_text())
    assert [it["step"] for it in timeline["measured"]] == [2, 3, 4]
    plan = json.loads((straight / "plan.json").read_text())
    for it in timeline["measured"]:
        for r in it["ranks"]:
            labels = [e["label"] for e in r["events"]]
            for kind in "FB":  # each micro-batch's forward and backward, once
                assert sorted(x for x in labels if x[0] == kind) == [
                    f"{kind}{m}" for m in range(plan["num_micro_batches"])
                ]
            assert all(0 <= e["start"] <= e["end"] <= it["iteration_s"] for e in r["events"])
    assert len(timeline["predicted"]["ranks"]) == 4 and timeline["predicted"]["iteration_s"] > 0
    assert (straight / "timeline.svg").read_text().startswith("<svg")
    # the same file as a Chrome trace: a process per rank measured and per rank estimated, a thread per stream
    trace = timeline["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs) == [0, 1, 2, 3, 10_000, 10_001, 10_002, 10_003]
    assert procs[0].startswith("rank 0 (stage 0, replica 0) measured") and procs[10_003].endswith("estimated")
    spans = [e for e in trace if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == set(procs) and all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    threads = {e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "send", "receive (waiting)", "gradient all-reduce"} <= threads
    assert {e["name"][0] for e in spans if e["tid"] == 0} >= {"F", "B"}
    # The contract outside checks rely on.
    assert json.loads((straight / "plan.json").read_text())["stages"][0]["replicas"] == 2
    assert find_checkpoints(straight / "checkpoints")
    assert "done: steps 0..8; train loss" in out.stdout and "per iteration measured" in out.stdout
    # the estimate is compared with the pipeline's span (what it describes), not with the whole step
    summary = json.loads((straight / "summary.json").read_text())
    assert 0 < summary["measured_s_per_iteration"] < summary["measured_s_per_step"], summary
    assert summary["samples_per_s"] == pytest.approx(plan["global_batch_size"] / summary["measured_s_per_step"])
    assert f"checkpoints: {straight / 'checkpoints'} (newest: step000008.ckpt)" in out.stdout
    assert f"timeline: {straight / 'timeline.svg'}" in out.stdout
    ref = losses(straight)
    assert ref[min(ref)] > ref[max(ref)], ref  # the loss falls

    out = cli([*FAST, "trainer.max_steps=4", "trainer.checkpoint_every_n_steps=4", f"hydra.run.dir={split}"], tmp_path)
    assert out.returncode == 0, out.stderr
    # A new run into a directory with checkpoints is refused, and nothing there is touched.
    again = cli([*FAST, "trainer.max_steps=4", f"hydra.run.dir={split}"], tmp_path)
    assert again.returncode == 2 and "already holds 1 checkpoint" in again.stderr
    out = cli(
        [
            *FAST,
            "trainer.max_steps=8",
            "trainer.checkpoint_every_n_steps=4",
            "ckpt_path=last",
            f"hydra.run.dir={split}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    a, _ = read_shards(find_checkpoints(straight / "checkpoints")[-1])
    b, _ = read_shards(find_checkpoints(split / "checkpoints")[-1])
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k

    step4 = [p for p in find_checkpoints(split / "checkpoints") if p.name == "step000004.ckpt"]
    assert step4, "the step-4 checkpoint is kept"
    # ZB-V: 4 stages on 2 device groups × 2 replicas, each group holding both ends of a V, validated
    # and profiled (its timeline names each step's stage)
    for name, layout in (
        ("dp", ["strategy.stages=1", "strategy.replicas=[4]"]),
        ("deep", ["strategy.stages=4", "strategy.replicas=[1]", "data.num_workers=1"]),  # (same data from a worker)
        (
            "zbv",
            ["strategy.schedule=zbv", "strategy.stages=4", "strategy.replicas=[2]", "trainer.profile_pipeline=true"],
        ),
    ):
        out = cli(
            [*FAST, *layout, "trainer.max_steps=8", f"ckpt_path={step4[0]}", f"hydra.run.dir={tmp_path / name}"],
            tmp_path,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        got = losses(tmp_path / name)
        assert sorted(got) == [s for s in sorted(ref) if s >= 4]  # logged step = optimizer steps before it
        for s, v in got.items():
            assert v == pytest.approx(ref[s], rel=1e-4), (name, s)
    # each rank read only what its stages use: a middle stage nothing, the last stage the targets
    deep_logs = tmp_path / "deep" / "logs"
    assert "this rank reads nothing of each global batch" in (deep_logs / "rank-1.log").read_text()
    assert "reads the targets of 16 of each global batch's 16 samples" in (deep_logs / "rank-3.log").read_text()
    zbv_ends = (tmp_path / "zbv" / "logs" / "rank-1.log").read_text()  # replica 1 of the group holding 0 and 3
    assert "reads the inputs of 8 and the targets of 8 of each global batch's 16 samples" in zbv_ends
    timeline = json.loads((tmp_path / "zbv" / "timeline.json").read_text())
    rows = timeline["measured"][0]["ranks"]
    assert [r["stages"] for r in rows] == [[0, 3], [0, 3], [1, 2], [1, 2]]
    assert {e["label"] for e in rows[0]["events"]} >= {f"{k}{m}·s{s}" for k in "FIW" for m in range(4) for s in (0, 3)}


@pytest.mark.multiprocess
def test_checkpoint_from_another_model_is_refused(tmp_path):
    run = tmp_path / "gpt"
    out = cli([*FAST, "trainer.max_steps=2", "trainer.checkpoint_every_n_steps=2", f"hydra.run.dir={run}"], tmp_path)
    assert out.returncode == 0, out.stderr
    ckpt = find_checkpoints(run / "checkpoints")[-1]
    out = cli([*FAST, "model.hidden=48", f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path}/other"], tmp_path)
    assert out.returncode == 2 and "saved from another model" in out.stderr and "hidden" in out.stderr


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "args",
    [
        ["model=bert", "model.preset=tiny", "strategy.stages=4", "strategy.replicas=[1]"],
        ["model=vgg19", "model.preset=tiny", "model.width_divisor=16", "model.fc_width=32", "strategy.schedule=gpipe"],
        ["logger=wandb_disabled"],
        ["logger=wandb"],
        ["logger=none"],
    ],
)
def test_shipped_configs_run_a_few_steps(tmp_path, args):
    extra = [] if any(a.startswith("model=") for a in args) else TINY_GPT
    out = cli(
        [
            *extra,
            *args,
            "trainer.max_steps=2",
            "trainer.checkpoint_every_n_steps=2",
            "trainer.progress_bar=false",
            "data.num_train=64",
            "data.num_val=16",
            "trainer.limit_val_batches=1",
            f"hydra.run.dir={tmp_path}/run",
        ],
        tmp_path,
        env={"WANDB_MODE": "offline"} if "logger=wandb" in args else None,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert find_checkpoints(tmp_path / "run" / "checkpoints")
    if "logger=wandb" in args:
        assert list((tmp_path / "run").rglob("offline-run-*")), "wandb wrote its offline run in the run directory"


BERT48 = Path(__file__).resolve().parent.parent / "dapple_launch" / "profiles" / "bert-48-pbs-2.txt"


@pytest.mark.slow
def test_plan_any_model_from_a_profile_file_with_auto(tmp_path):
    out = cli(
        [
            "model=from_profile",
            f"model.profile={BERT48}",
            "model.profile_batch_size=2",
            "cluster=v100x16",
            "global_batch_size=128",
            "strategy=auto",
            "dry_run=true",
            f"hydra.run.dir={tmp_path}/p",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert plan["stages"][0]["layer_names"][0] == "node1"  # the profile's node ids
    # (a stage's entry lists its device group's devices, which hold several stages under ZB-V or interleaving)
    assert len({d for s in plan["stages"] for d in s["devices"]}) <= 16
    assert plan["estimate"]["speedup_over_data_parallel"] > 1
    # the proven claim: optimal, or (a chunked family chosen: their bound is weaker) within a stated gap
    assert "runners-up:" in out.stdout
    assert re.search(r"(optimal|within [0-9.]+% of the optimum) under the cost model", out.stdout), out.stdout[:400]


@pytest.mark.slow
def test_resolved_config_shows_the_plan(tmp_path):
    out = cli([*TINY_GPT, "--cfg", "job", "--resolve"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "plan:" in out.stdout and "num_micro_batches: 4" in out.stdout and "replicas: 2" in out.stdout


@pytest.mark.slow
def test_malformed_profile_names_line_and_reason(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text(BERT48.read_text().replace("forward_compute_time=2.69", "forward_compute_time=fast", 1))
    out = cli(
        [
            "model=from_profile",
            f"model.profile={bad}",
            "model.profile_batch_size=2",
            "cluster=v100x16",
            "global_batch_size=128",
            "dry_run=true",
            f"hydra.run.dir={tmp_path}/p",
        ],
        tmp_path,
    )
    assert out.returncode == 2 and "bad.txt:5" in out.stderr and "not a number" in out.stderr


@pytest.mark.multiprocess
def test_multirun_sweep_runs_locally_with_submitit_local(tmp_path):
    """The sweep users send to Slurm as an array runs on this machine with hydra/launcher=submitit_local:
    every point trains with its own override and leaves its plan and a checkpoint."""
    sweep = tmp_path / "sweep"
    out = cli(
        [
            "-m",
            "hydra/launcher=submitit_local",
            *TINY_GPT,
            "trainer.max_steps=2",
            "trainer.checkpoint_every_n_steps=2",
            "trainer.progress_bar=false",
            "strategy.num_micro_batches=2,4",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for point, m in ((0, 2), (1, 4)):
        assert json.loads((sweep / str(point) / "plan.json").read_text())["num_micro_batches"] == m
        assert [p.name for p in find_checkpoints(sweep / str(point) / "checkpoints")] == ["step000002.ckpt"]


CUSTOM = [
    "model=custom",
    "model.target=tests.custom_models.skipnet:build",
    "model.args={hidden:16,layers:4,seq_len:8}",
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=1",
    "trainer.log_every_n_steps=1",
    "trainer.lr_decay_steps=8",
    "trainer.warmup_steps=2",
    "trainer.progress_bar=false",
    "data.num_train=256",
    "data.num_val=32",
]


@pytest.mark.multiprocess
def test_a_custom_model_trains_and_resumes_on_another_layout(tmp_path):
    """model=custom from a package outside dapple_launch (tuple carries, a tied weight): 8 steps on
    2 stages × 2 replicas; its step-4 checkpoint resumed on 3 stages 2:1:1 continues the same losses."""
    root = Path(__file__).resolve().parent.parent  # where `tests.custom_models` is importable from
    straight = tmp_path / "straight"
    out = cli([*CUSTOM, "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=4", f"hydra.run.dir={straight}"], root)
    assert out.returncode == 0, out.stdout + out.stderr
    ref = losses(straight)
    assert ref[min(ref)] > ref[max(ref)], ref
    step4 = next(p for p in find_checkpoints(straight / "checkpoints") if p.name == "step000004.ckpt")
    state, _ = read_shards(step4)
    assert "layers.0.token.weight" in state and "layers.5.out.weight" not in state  # the tied weight, once
    out = cli(
        [
            *CUSTOM,
            "strategy.stages=3",
            "strategy.replicas=[2,1,1]",
            "trainer.max_steps=8",
            f"ckpt_path={step4}",
            f"hydra.run.dir={tmp_path / 'other'}",
        ],
        root,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    got = losses(tmp_path / "other")
    assert sorted(got) == [s for s in sorted(ref) if s >= 4]
    for s, v in got.items():
        assert v == pytest.approx(ref[s], rel=1e-4), s


@pytest.mark.slow
def test_a_custom_model_that_cannot_be_built_is_refused(tmp_path):
    root = Path(__file__).resolve().parent.parent
    for target, needle in (
        ("no_such_module:build", "cannot import no_such_module"),
        ("tests.custom_models.skipnet:nothing", "has no callable 'nothing'"),
        ("tests.custom_models.skipnet", "must name a factory as PACKAGE.MODULE:CALLABLE"),
    ):
        out = cli(["model=custom", f"model.target={target}", "dry_run=true", f"hydra.run.dir={tmp_path}/x"], root)
        assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = cli(
        [
            "model=custom",
            "model.target=tests.custom_models.skipnet:build",
            "+model.args.colour=3",
            "dry_run=true",
            f"hydra.run.dir={tmp_path}/x",
        ],
        root,
    )
    assert out.returncode == 2 and "refused model.args={'colour': 3}" in out.stderr, out.stderr


@pytest.mark.slow
def test_the_plan_reads_at_a_glance_and_plan_json_holds_the_proof(tmp_path):
    """The statement is a headline of two lines (layout, schedule, estimate, proven gap, the runner-up it
    beat); strategy.explain=true adds how it was chosen; plan.json carries the proof as data."""
    args = ["strategy=auto", "strategy.profile_source=analytic", "dry_run=true"]
    out = cli([*args, f"hydra.run.dir={tmp_path / 'a'}"], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("Plan for gpt on local:"))
    assert "estimated" in lines[first] and "per iteration" in lines[first]
    assert re.search(
        r"(optimal|within [0-9.]+% of the optimum) under the cost model over \d+ families", lines[first + 1]
    )
    assert "runner-up" in lines[first + 1] and lines[first + 2].lstrip().startswith("stage")
    assert "how it was chosen" not in out.stdout
    proof = json.loads((tmp_path / "a" / "plan.json").read_text())["proof"]
    assert set(proof) == {"gap", "families", "candidates", "seconds"} and proof["gap"] >= 0 and proof["candidates"] > 0
    out = cli([*args, "strategy.explain=true", f"hydra.run.dir={tmp_path / 'b'}"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "how it was chosen: auto:" in out.stdout
