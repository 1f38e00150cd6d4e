"""Several gloo processes: pipelined loss and every gradient equal a single-process reference."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dapple_launch.cluster import Topology
from dapple_launch.models import build_model
from dapple_launch.planner import Limits, fixed_plan
from dapple_launch.profile import analytic_profile
from dapple_launch.runtime.executor import GradientSync, StageExecutor
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.module import PipelineModule
from dapple_launch.runtime.p2p import PointToPoint
from dapple_launch.runtime.precision import MixedPrecision
from dapple_launch.runtime.tied import TiedSync, local_tied_parameters, tied_groups
from dapple_launch.schedule import Action, Kind, Schedule, StageCosts, build_schedule, simulate

from .custom_models.skipnet import build as build_skipnet
from .multiproc import run_ranks
from .rank_batches import rank_batch
from .saved_bytes import SavedBytes, saved_and_freed_at_input

pytestmark = pytest.mark.multiprocess


def tiny_model(name="gpt"):
    if name == "vgg19":
        return build_model("vgg19", "tiny", width_divisor=16, fc_width=32, image_size=32)
    if name == "skipnet":  # a user's model from outside the package: tuple carries, a tied weight
        return build_skipnet(vocab=24, hidden=16, layers=4, seq_len=6)
    if name == "llama":  # grouped-query attention (4 query heads on 2 key/value heads), tied embeddings
        return build_model(
            "llama", "tiny", num_layers=3, hidden=32, heads=4, kv_heads=2, ffn_hidden=48, seq_len=8, vocab_size=40
        )
    if name == "gpt-untied":
        return build_model(
            "gpt", "tiny", num_layers=3, hidden=32, heads=2, seq_len=8, vocab_size=40, tie_embeddings=False
        )
    return build_model(name, "tiny", num_layers=3, hidden=32, heads=2, seq_len=8, vocab_size=40)


def make_plan(model, replicas, schedule, num_micro_batches, global_batch, devices=None, warmup_depth=1, **limits):
    """`limits`: more Limits fields (recompute=..., recompute_counts=...)."""
    topo = Topology("test", 1, sum(replicas), 8e9, 0.05, 1e9, 1e9, device_kind="cpu")
    profile = analytic_profile(model, 2, topo.device_tflops, "cpu")
    return fixed_plan(
        profile,
        topo,
        global_batch,
        len(replicas),
        list(replicas),
        num_micro_batches,
        Limits(schedule=schedule, **limits),
        devices=devices,
        warmup_depth=warmup_depth,
    )


def reference(model, batch, precision="32"):
    """Every layer in one process, the whole batch at once (a tied weight is one Parameter):
    (the module, its loss, each named parameter's gradient)."""
    ref = PipelineModule(model, precision=precision).materialize()
    loss = ref.reference_loss(batch)
    loss.backward()
    return ref, loss, {n: p.grad for n, p in ref.named_parameters(remove_duplicate=False)}


def worst_grad_rel(local, ref_grads) -> float:
    """The largest gradient difference of any of `local`'s parameters from the reference's, relative
    to the reference gradient's largest entry."""
    worst = 0.0
    for n, p in local.named_parameters(remove_duplicate=False):
        r = ref_grads[n].float()
        worst = max(worst, (p.grad.float() - r).abs().max().item() / (r.abs().max().item() + 1e-12))
    return worst


def pipelined(model, plan, rank, batch, precision="32", hand_made=None):
    """This rank's stage run through the runtime's parts (executor, p2p, gradient and tied-weight sync)
    on the schedule's micro-batches and this replica's slices: (its module, the executor, the loss
    summed over every rank)."""
    grid = ProcessGrid.from_plan(plan)
    stage, replica = grid.position(rank)
    a, b = plan.stages[stage].layers
    local = PipelineModule(model, precision=precision).materialize(list(range(a, b)))
    params = list(local.parameters())
    groups = [dist.new_group(grid.stage_ranks(s)) for s in range(grid.num_stages)]
    ties = tied_groups(model, [s.layers for s in plan.stages])
    for g in ties:  # every rank creates every group, in order, as DappleStrategy does
        g.group = dist.new_group(sorted({r for s in g.stages for r in grid.stage_ranks(s)}))
    # one bucket per layer: each all-reduced while the last backward still runs the layers below it
    sync = GradientSync(
        params,
        groups[stage],
        grid.replicas[stage],
        [list(layer.parameters()) for layer in local.local_stack()],
        bucket_bytes=1,
    )
    tied = TiedSync(ties, local_tied_parameters(local.layers, model), stage, replica)
    ex = StageExecutor(
        local.local_stack(),
        model.loss,
        PointToPoint(grid, stage, replica),
        grid.num_stages,
        on_last_backward=sync.start,
        before_last_backward=sync.arm,
        precision=MixedPrecision(precision),
        recompute=[i - a for i in plan.stages[stage].recompute_layers],
        slice_loss_fn=getattr(model, "slice_loss", None),
    )
    schedule = hand_made or plan.build_schedule()
    result = ex.run(schedule, rank_batch(plan, rank, batch, schedule))
    sync.finish()
    tied.sync()
    loss = result.loss_sum.clone()
    dist.all_reduce(loss)
    return local, ex, loss


def _compare(
    rank, world, model_name, replicas, schedule, num_micro_batches, batch_n, plan_json, precision="32", hand_made=None
):
    """This rank's stage run through the runtime's parts (executor, p2p, gradient and tied-weight
    sync) against every layer in one process on the whole batch (the same precision)."""
    from dapple_launch.planner import Plan

    plan = Plan.from_json(plan_json)
    model = tiny_model(model_name)
    grid = ProcessGrid.from_plan(plan)
    stage, replica = grid.position(rank)
    batch = model.batch(batch_n, torch.Generator().manual_seed(1))
    ref, ref_loss, ref_grads = reference(model, batch, precision)
    local, ex, loss = pipelined(model, plan, rank, batch, precision, hand_made)
    return {
        "loss": loss.item(),
        "ref_loss": ref_loss.item(),
        "worst_grad_rel": worst_grad_rel(local, ref_grads),
        "names": sorted(n for n, _ in local.named_parameters(remove_duplicate=False)),
        "saved_peak": ex.saved_peak,
        "stage": stage,
        "wire": sorted({str(wire) for layout in ex.p2p.sent_layouts.values() for _, wire, _ in layout}),
    }


CASES = [
    # (replicas per stage, schedule, micro-batches, batch size)
    ((1,), "1f1b", 1, 4),
    ((1,), "gpipe", 3, 7),
    ((1, 1), "1f1b", 2, 4),
    ((1, 1), "gpipe", 1, 4),
    ((1, 1), "1f1b", 5, 11),
    ((2, 2), "1f1b", 2, 8),
    ((2, 2), "gpipe", 3, 13),
    ((2,), "1f1b", 4, 8),
    ((1, 1, 1, 1), "1f1b", 4, 8),
    ((1, 1, 1, 1), "1f1b", 8, 8),
    ((1, 1, 1, 1), "gpipe", 1, 4),
    ((1, 1, 1, 1), "gpipe", 6, 13),
    ((1, 1, 1, 1), "1f1b", 7, 15),
    # uneven replication: activations and gradients re-split many-to-many between stages
    ((3, 1), "1f1b", 2, 7),
    ((1, 2), "gpipe", 2, 5),
    ((2, 1, 1), "1f1b", 3, 9),
    # zero bubble (ZB-H1): the backward split into I and W, W's held back; M from S to 4S
    ((1,), "zb_h1", 2, 5),
    ((1, 1), "zb_h1", 2, 4),
    ((1, 1), "zb_h1", 8, 17),
    ((2, 2), "zb_h1", 3, 13),
    ((1, 1, 1, 1), "zb_h1", 4, 8),
    ((1, 1, 1, 1), "zb_h1", 9, 19),
    ((1, 1, 1, 1), "zb_h1", 16, 16),
    ((3, 1), "zb_h1", 2, 7),
    ((2, 1, 1), "zb_h1", 5, 11),
]


def _compare_many(rank, world, cases):
    """Several cases in one set of processes (each with its own groups): process start-up and the
    imports are most of a case's time."""
    return [_compare(rank, world, *case) for case in cases]


def run_cases(cases: list[tuple], tmp_path) -> list[list[dict]]:
    """Each case's per-rank results, running every case of one world size in one set of processes."""
    out: dict[int, list] = {}
    by_world: dict[int, list[int]] = {}
    for i, case in enumerate(cases):
        by_world.setdefault(sum(case[1]), []).append(i)
    for world, idx in by_world.items():
        per_rank = run_ranks(world, _compare_many, ([cases[i] for i in idx],), tmp_path)
        for j, i in enumerate(idx):
            out[i] = [r[j] for r in per_rank]
    return [out[i] for i in range(len(cases))]


# Activation recomputation (tests/test_recompute.py) and token slices (TeraPipe, tests/test_terapipe.py):
# 2 and 4 stages, full and selective (counts, positions), 1-4 micro-batches, equal and unequal slices
# (the tiny GPT has 8 tokens), data parallelism inside stages; with CASES to share their processes.
LIMITED = [
    # (replicas, schedule, micro-batches, batch size, more Limits fields)
    ((1, 1), "1f1b", 4, 9, {"recompute": "full"}),
    ((1, 1), "1f1b", 4, 9, {"recompute": "selective", "recompute_counts": (1,)}),
    ((1, 1), "1f1b", 4, 9, {"recompute": "selective", "recompute_layers": (1, 3)}),
    ((1, 1, 1, 1), "1f1b", 4, 9, {"recompute": "full"}),
    ((1, 1, 1, 1), "1f1b", 4, 9, {"recompute": "selective", "recompute_counts": (1, 0, 1, 1)}),
    ((2, 2), "1f1b", 4, 9, {"recompute": "full"}),
    ((2, 1, 1), "1f1b", 4, 9, {"recompute": "selective", "recompute_counts": (2, 1, 0)}),
    ((1, 1), "gpipe", 1, 2, {"token_slices": (4, 4)}),
    ((1, 1), "gpipe", 2, 4, {"token_slices": (3, 5)}),
    ((1, 1), "gpipe", 4, 8, {"token_slices": (2, 2, 2, 2)}),
    ((1, 1, 1, 1), "gpipe", 1, 3, {"token_slices": (1, 3, 4)}),
    ((1, 1, 1, 1), "gpipe", 3, 6, {"token_slices": (4, 2, 2)}),
    ((1, 1, 1, 1), "gpipe", 2, 4, {"token_slices": (8,)}),
    ((2, 2), "gpipe", 2, 8, {"token_slices": (5, 3)}),
    ((2, 1, 1), "gpipe", 2, 5, {"token_slices": (2, 6)}),
]


def test_pipelined_equals_reference(tmp_path):
    """Every case of CASES and LIMITED: loss and every gradient equal one process's, and the runtime
    keeps exactly as many micro-batches (token-slice units) alive per stage as the schedule says."""
    model = tiny_model()
    cases, plans = [], []
    grid = [(*c, {}) for c in CASES] + LIMITED
    for replicas, schedule, m, n, limits in grid:
        plan = make_plan(model, replicas, schedule, m, m * max(replicas), **limits)
        plans.append(plan)
        cases.append(("gpt", replicas, plan.schedule, m, n, plan.to_json()))
    everything = {n for n, _ in PipelineModule(model).materialize().named_parameters(remove_duplicate=False)}
    for case, plan, results in zip(grid, plans, run_cases(cases, tmp_path)):
        predicted = simulate(plan.build_schedule(), [StageCosts(1.0, 1.0)] * plan.num_stages)
        names = set()
        for r in results:
            assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5), case
            assert r["worst_grad_rel"] < 1e-4, case
            assert r["saved_peak"] == predicted.peak_in_flight[r["stage"]], case
            names |= set(r["names"])
        assert names == everything, case


@pytest.mark.parametrize(
    "replicas,warmup_depth,schedule", [((1, 1, 1, 1), 2, "1f1b"), ((2, 1, 1), 3, "1f1b"), ((1, 1, 1, 1), 2, "zb_h1")]
)
def test_a_deeper_warmup_equals_reference_and_keeps_what_it_planned(tmp_path, replicas, warmup_depth, schedule):
    """A plan with a deeper warm-up (k × DAPPLE's in-flight micro-batches per stage) runs as written:
    same loss and gradients, and each stage keeps exactly what the cost model charges it (1F1B:
    min(M, warm-up + 1); ZB-H1: min(M, warm-up + 1 + s), its held-back W's)."""
    from dapple_launch.planner.cost import in_flight

    model = tiny_model()
    plan = make_plan(model, replicas, schedule, 8, 8 * max(replicas), warmup_depth=warmup_depth)
    S = len(replicas)
    assert plan.warmup == tuple(min(8, warmup_depth * (S - s)) - 1 if s < S - 1 else 0 for s in range(S))
    results = run_ranks(sum(replicas), _compare, ("gpt", replicas, schedule, 8, 17, plan.to_json()), tmp_path)
    for r in results:
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
        assert r["worst_grad_rel"] < 1e-4
        assert r["saved_peak"] == in_flight(schedule, r["stage"], S, 8, plan.warmup)


@pytest.mark.parametrize("schedule", ["1f1b", "zb_h1"])
def test_each_stage_s_own_warmup_equals_reference_and_keeps_what_it_planned(tmp_path, schedule):
    """A plan whose stages keep their own warm-up depths (planner/stage_warmups.py: here the second
    stage at ×2, the others at ×1, its predecessor raised to match) runs as written: same loss and
    gradients, each stage keeping what the cost model charges it."""
    from dataclasses import replace

    from dapple_launch.planner.cost import in_flight
    from dapple_launch.schedule.one_f_one_b import deeper_warmup

    model = tiny_model()
    plan = replace(make_plan(model, (1, 1, 1, 1), schedule, 8, 8), warmup=deeper_warmup(4, 8, (1, 2, 1, 1)))
    assert plan.warmup == (5, 5, 1, 0)  # (no common depth gives it: ×1 is (3, 2, 1, 0), ×2 (7, 5, 3, 0))
    assert type(plan).from_json(plan.to_json()) == plan
    results = run_ranks(4, _compare, ("gpt", (1, 1, 1, 1), schedule, 8, 17, plan.to_json()), tmp_path)
    for r in results:
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
        assert r["worst_grad_rel"] < 1e-4
        assert r["saved_peak"] == in_flight(schedule, r["stage"], 4, 8, plan.warmup)


def test_ranks_follow_the_planned_devices(tmp_path):
    """Stage 0 placed on device 3 and stage 1 on devices 0..2: rank 3 runs stage 0, ranks 0..2 stage 1
    (ranks follow device ids), and the result still equals the single-process reference."""
    model = tiny_model()
    plan = make_plan(model, (1, 3), "1f1b", 2, 6, devices=[[3], [0, 1, 2]])
    assert ProcessGrid.from_plan(plan).stage_ranks(0) == [3]
    results = run_ranks(4, _compare, ("gpt", (1, 3), "1f1b", 2, 7, plan.to_json()), tmp_path)
    assert [r["stage"] for r in results] == [1, 1, 1, 0]
    for r in results:
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
        assert r["worst_grad_rel"] < 1e-4


def test_other_models_pipelined(tmp_path):
    """BERT, VGG-19 (convolutions, pooling) and an untied GPT under 1F1B and ZB-H1."""
    grid = [(name, schedule) for name in ("bert", "vgg19", "gpt-untied") for schedule in ("1f1b", "zb_h1")]
    cases = [
        (name, (1, 1), schedule, 2, 6, make_plan(tiny_model(name), (1, 1), schedule, 2, 4).to_json())
        for name, schedule in grid
    ]
    for case, results in zip(grid, run_cases(cases, tmp_path)):
        for r in results:
            assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5), case
            assert r["worst_grad_rel"] < 1e-4, case


def test_llama_pipelined_with_slices_and_recomputation(tmp_path):
    """model=llama (RMSNorm, rotary, SwiGLU, grouped-query attention, tied embeddings) as gpt is:
    1F1B, ZB-H1 on uneven replicas, token slices (rotary positions absolute under a slice) and full
    and selective recomputation, each against the single-process reference."""
    model = tiny_model("llama")
    grid = [
        ((1, 1), "1f1b", 2, 5, {}),
        ((2, 1), "zb_h1", 2, 7, {}),
        ((1, 1), "gpipe", 2, 4, {"token_slices": (3, 5)}),
        ((1, 1, 1, 1), "gpipe", 1, 3, {"token_slices": (2, 2, 4)}),
        ((1, 1, 1), "1f1b", 3, 7, {"recompute": "full"}),
        ((1, 1), "1f1b", 2, 5, {"recompute": "selective", "recompute_counts": (1,)}),
    ]
    cases = [
        (
            "llama",
            replicas,
            make_plan(model, replicas, schedule, m, m * max(replicas), **limits).schedule,
            m,
            n,
            make_plan(model, replicas, schedule, m, m * max(replicas), **limits).to_json(),
        )
        for replicas, schedule, m, n, limits in grid
    ]
    everything = {n for n, _ in PipelineModule(model).materialize().named_parameters(remove_duplicate=False)}
    for case, results in zip(grid, run_cases(cases, tmp_path)):
        for r in results:
            assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5), case
            assert r["worst_grad_rel"] < 1e-4, case
        assert set().union(*[r["names"] for r in results]) == everything, case


def test_a_hand_made_schedule_the_validator_accepts_runs_and_equals_reference(tmp_path):
    """Every stage runs its backwards last micro-batch first: valid (transfers stay in send order),
    and the runtime runs it to the reference's loss and gradients."""
    from .test_schedule import reversed_backwards

    model = tiny_model()
    plan = make_plan(model, (1, 1, 1), "gpipe", 4, 4)
    for r in run_ranks(
        3, _compare, ("gpt", (1, 1, 1), "gpipe", 4, 9, plan.to_json(), "32", reversed_backwards(3, 4)), tmp_path
    ):
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
        assert r["worst_grad_rel"] < 1e-4


def _run_out_of_order(rank, world, plan_json):
    from dapple_launch.planner import Plan

    plan = Plan.from_json(plan_json)
    model = tiny_model()
    grid = ProcessGrid.from_plan(plan)
    stage, replica = grid.position(rank)
    schedule = plan.build_schedule()
    if stage == 1:  # receive (and run) micro-batch 1 before 0: what the validator refuses
        acts = list(schedule.stage_actions[1])
        swap = {
            Action(Kind.RECV_ACTIVATION, 0): Action(Kind.RECV_ACTIVATION, 1),
            Action(Kind.RECV_ACTIVATION, 1): Action(Kind.RECV_ACTIVATION, 0),
            Action(Kind.FORWARD, 0): Action(Kind.FORWARD, 1),
            Action(Kind.FORWARD, 1): Action(Kind.FORWARD, 0),
        }
        schedule = Schedule(schedule.name, 2, 2, (schedule.stage_actions[0], tuple(swap.get(a, a) for a in acts)))
    a, b = plan.stages[stage].layers
    local = PipelineModule(model).materialize(list(range(a, b)))
    ex = StageExecutor(local.local_stack(), model.loss, PointToPoint(grid, stage, replica), grid.num_stages)
    try:
        ex.run(schedule, model.batch(4, torch.Generator().manual_seed(1)))
    except (RuntimeError, ValueError) as exc:  # refused (ScheduleError) on stage 1, its peer then times out
        return str(exc)
    return "ran"


def test_the_runtime_cannot_run_what_the_validator_refuses(tmp_path, monkeypatch):
    """The receive order the validator rejects is one the runtime would hang on (until the timeout)."""
    monkeypatch.setenv("DAPPLE_TEST_PG_TIMEOUT", "3")
    plan = make_plan(tiny_model(), (1, 1), "gpipe", 2, 4)
    out = run_ranks(2, _run_out_of_order, (plan.to_json(),), tmp_path)
    assert "ran" not in out
    assert "receive them in the order they are sent" in out[1], out[1]


CUSTOM_CASES = [
    # (replicas per stage, schedule, micro-batches, batch size): 1, 2 and 4 stages, uneven replication
    ((1,), "1f1b", 2, 5),
    ((2,), "gpipe", 2, 6),
    ((1, 1), "1f1b", 3, 7),
    ((1, 1), "gpipe", 2, 4),
    ((3, 1), "1f1b", 2, 7),
    ((1, 2), "gpipe", 3, 9),
    ((1, 1, 1, 1), "1f1b", 4, 9),
    ((1, 1, 1, 1), "gpipe", 5, 10),
    ((1, 2, 1), "1f1b", 3, 8),
    ((1, 1), "zb_h1", 3, 7),
    ((1, 2, 1), "zb_h1", 4, 9),
    ((1, 1, 1, 1), "zb_h1", 6, 13),
]


def test_custom_model_with_tuples_and_tied_weights_equals_reference(tmp_path):
    """A user's model (tests/custom_models/skipnet.py): each layer passes (hidden [n,t,d], a float
    skip [n,d], int ids [n,t]) on, and the output projection is the token embedding. Pipelined
    loss and every gradient, the tied copies included, equal one process's, for every case of
    CUSTOM_CASES (1, 2 and 4 stages, uneven replication, both schedules)."""
    model = tiny_model("skipnet")
    cases = [
        ("skipnet", replicas, schedule, m, n, make_plan(model, replicas, schedule, m, m * max(replicas)).to_json())
        for replicas, schedule, m, n in CUSTOM_CASES
    ]
    for case, results in zip(CUSTOM_CASES, run_cases(cases, tmp_path)):
        names = set()
        for r in results:
            assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5), case
            assert r["worst_grad_rel"] < 1e-4, case
            names |= set(r["names"])
        assert {"layers.0.token.weight", "layers.5.out.weight"} <= names, case


def test_bf16_mixed_pipelined_equals_a_bf16_reference(tmp_path):
    """bf16 autocast in every stage, activations and gradients on the wire in bf16: loss and every
    gradient equal one process under the same autocast, within bf16's precision."""
    grid = [("gpt", (1, 1), "1f1b"), ("gpt", (2, 1, 1), "1f1b"), ("skipnet", (1, 2), "1f1b"), ("gpt", (1, 1), "zb_h1")]
    cases = [
        (
            name,
            replicas,
            schedule,
            4,
            4 * max(replicas) + 1,
            make_plan(tiny_model(name), replicas, schedule, 4, 4 * max(replicas)).to_json(),
            "bf16-mixed",
        )
        for name, replicas, schedule in grid
    ]
    for case, results in zip(grid, run_cases(cases, tmp_path)):
        for r in results:
            assert r["loss"] == pytest.approx(r["ref_loss"], rel=2e-2), case
            assert r["worst_grad_rel"] < 5e-2, case
            assert set(r["wire"]) <= {"torch.bfloat16", "torch.int64"}, case  # floating members cross in bf16


def _stalled_peer(rank, world, plan_json):
    from dapple_launch.planner import Plan

    plan = Plan.from_json(plan_json)
    model = tiny_model()
    grid = ProcessGrid.from_plan(plan)
    stage, replica = grid.position(rank)
    a, b = plan.stages[stage].layers
    local = PipelineModule(model).materialize(list(range(a, b)))
    ex = StageExecutor(local.local_stack(), model.loss, PointToPoint(grid, stage, replica), grid.num_stages)
    batch = model.batch(4, torch.Generator().manual_seed(1))
    ex.run(build_schedule("1f1b", 2, 2), batch)  # one iteration together
    if rank == 1:
        import time

        time.sleep(6)  # then the last stage stalls: stage 0 must not wait forever
        return "stalled"
    try:
        ex.run(build_schedule("1f1b", 2, 2), batch)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_a_stalled_peer_ends_the_run_with_stage_rank_and_action(tmp_path, monkeypatch):
    monkeypatch.setenv("DAPPLE_TEST_PG_TIMEOUT", "3")  # the product's bound is trainer.timeout_s
    model = tiny_model()
    plan = make_plan(model, (1, 1), "1f1b", 2, 4)
    out = run_ranks(2, _stalled_peer, (plan.to_json(),), tmp_path)
    assert "stage 0 replica 0 (rank 0) stopped at action B0" in out[0], out[0]  # waiting for gradient 0


def rank_stage(rank, plan_json):
    """In a worker: (plan, tiny GPT, grid, stage, replica, the stage's layers materialised) for this rank."""
    from dapple_launch.planner import Plan

    plan = Plan.from_json(plan_json)
    model = tiny_model()
    grid = ProcessGrid.from_plan(plan)
    stage, replica = grid.position(rank)
    a, b = plan.stages[stage].layers
    return plan, model, grid, stage, replica, PipelineModule(model).materialize(list(range(a, b)))


def stage_input(model, start: int, x, earlier: PipelineModule | None = None) -> tuple:
    """What the stage beginning at layer `start` receives for model inputs x, as the executor holds it:
    the earlier layers' output, detached, its floating members needing a gradient (x itself at 0).
    `earlier`: those layers already built, when calls must share them (token slices share a cache)."""
    from dapple_launch.models.contract import as_tuple, run_layers

    if start == 0:
        return as_tuple(x)
    with torch.no_grad():
        earlier = earlier or PipelineModule(model).materialize(list(range(0, start)))
        y = run_layers(earlier.local_stack(), x)
    return tuple(t.detach().requires_grad_(t.is_floating_point()) for t in as_tuple(y))


def _saved_bytes(rank, world, schedule_name, num_micro_batches, plan_json):
    """This stage's peak saved bytes over one iteration, what one micro-batch's forward saves, and
    what of that a split backward's I frees."""
    from dapple_launch.models.contract import as_tuple, run_layers

    plan, model, grid, stage, replica, local = rank_stage(rank, plan_json)
    layers = local.local_stack()
    n = 2 * num_micro_batches
    batch = model.batch(n, torch.Generator().manual_seed(1))
    x = stage_input(model, plan.stages[stage].layers[0], tuple(t[:2] for t in as_tuple(batch[0])))
    last = stage == grid.num_stages - 1

    def forward():  # one micro-batch's forward as the executor runs it (a later stage's input needs a gradient)
        y = run_layers(layers, x)
        return model.loss(y, batch[1][:2]).sum() if last else y

    per_micro_batch, freed_at_input = saved_and_freed_at_input(forward, x, local.parameters(), last)
    counter = SavedBytes(local.parameters())
    ex = StageExecutor(layers, model.loss, PointToPoint(grid, stage, replica), grid.num_stages)
    with counter.hooks():
        ex.run(plan.build_schedule(), batch)
    return {"stage": stage, "peak": counter.peak, "per_micro_batch": per_micro_batch, "freed_at_input": freed_at_input}


def _saved_bytes_many(rank, world, cases):
    return [_saved_bytes(rank, world, *case) for case in cases]


def test_peak_saved_bytes_per_stage_equal_the_simulators(tmp_path):
    """Counted exactly (saved-tensor hooks), each stage's peak saved bytes over an iteration are the
    simulator's peak in-flight micro-batches times what one micro-batch's forward saves there: GPipe,
    1F1B, ZB-H1 (whose activations live until W, but for the loss's, freed at I) and ZB-H1 with twice
    the warm-up."""
    model, M = tiny_model(), 8
    grid = [("gpipe", 1), ("1f1b", 1), ("zb_h1", 1), ("zb_h1", 2)]
    plans = [make_plan(model, (1, 1, 1, 1), schedule, M, 2 * M, warmup_depth=depth) for schedule, depth in grid]
    per_rank = run_ranks(4, _saved_bytes_many, ([(s, M, p.to_json()) for (s, _), p in zip(grid, plans)],), tmp_path)
    for k, (case, plan) in enumerate(zip(grid, plans)):
        results = sorted((rank[k] for rank in per_rank), key=lambda r: r["stage"])
        split = case[0] == "zb_h1"
        costs = [
            StageCosts(
                1.0, 2.0, activation_bytes=r["per_micro_batch"], input_only_bytes=r["freed_at_input"] if split else 0.0
            )
            for r in results
        ]
        sim = simulate(plan.build_schedule(), costs)
        assert not split or results[-1]["freed_at_input"] > 0  # the loss's saved input goes at I
        for r in results:
            assert r["per_micro_batch"] > 0
            assert r["peak"] == sim.peak_activation_bytes[r["stage"]], (case, r)
            if not split or not r["freed_at_input"]:
                assert r["peak"] == sim.peak_in_flight[r["stage"]] * r["per_micro_batch"], (case, r)
