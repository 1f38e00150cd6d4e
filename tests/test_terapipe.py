"""TeraPipe: token slices inside each sequence. Schedules as data, the model's sliced attention, the
dynamic programme against enumeration, plans, and pipelined numerics against the reference."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from dapple_launch.cluster import Topology
from dapple_launch.models import build_model
from dapple_launch.models.contract import run_layers
from dapple_launch.models.token_slices import KVCache, TokenSlice, running, supports_slicing
from dapple_launch.planner import Limits, Plan, fixed_plan
from dapple_launch.planner.terapipe import dp_objective, dp_slicings, sliced_floor
from dapple_launch.profile import analytic_profile
from dapple_launch.runtime.module import PipelineModule
from dapple_launch.schedule import Action, Kind, ScheduleError, StageCosts, simulate, validate
from dapple_launch.schedule.actions import with_communication
from dapple_launch.schedule.terapipe import bounds, slice_scale, terapipe, unit_scales

from .test_pipeline_numerics import make_plan, tiny_model


@pytest.mark.parametrize(
    "S,M,lengths", [(1, 1, (4,)), (2, 1, (3, 5)), (4, 2, (2, 2, 2, 2)), (3, 3, (1, 3, 4)), (4, 4, (5, 1, 2))]
)
def test_generated_terapipe_schedules_are_valid(S, M, lengths):
    sched = terapipe(S, M, lengths)
    validate(sched)
    assert sched.num_slices == len(lengths) and sched.sequences == M
    assert sched.num_micro_batches == M * len(lengths)


def _broken(order):
    compute = [order, order]
    sched = with_communication("hand", compute, 4)
    from dataclasses import replace

    return replace(sched, num_slices=2, slice_lengths=(2, 2))


def test_the_validator_refuses_slices_out_of_token_order():
    F, B = Kind.FORWARD, Kind.BACKWARD
    good = [
        Action(F, 0),
        Action(F, 1),
        Action(F, 2),
        Action(F, 3),
        Action(B, 1),
        Action(B, 0),
        Action(B, 3),
        Action(B, 2),
    ]
    validate(_broken(good))
    with pytest.raises(ScheduleError, match="forward of micro-batch 0 slice 1 runs before its slice 0"):
        validate(_broken([Action(F, 1), Action(F, 0), *good[2:]]))
    with pytest.raises(ScheduleError, match="backward of micro-batch 0 slice 0 runs before its slice 1"):
        validate(_broken([*good[:4], Action(B, 0), Action(B, 1), *good[6:]]))


def test_slice_costs_partition_the_whole_sequence():
    """Compute and transfers of the slices sum to the whole sequence's (slicing adds no work);
    later equal slices cost more (their attention sees more context)."""
    s = slice_scale((4, 4, 4, 4), compute=0.4, memory_kv=0.1, memory_att=0.3)
    assert sum(s.compute) == pytest.approx(1.0) and sum(s.transfer) == pytest.approx(1.0)
    assert list(s.compute) == sorted(s.compute) and s.compute[0] < s.compute[-1]
    assert sum(s.memory) > 1.0  # later slices keep the context's keys and values


def test_a_sliced_forward_and_backward_equal_the_whole_sequence():
    """One process: slices in token order with the per-micro-batch cache, backwards in reverse adding
    the cache's gradients: the loss and every gradient of the whole sequence."""
    model = build_model("gpt", "tiny", num_layers=3, hidden=32, heads=2, seq_len=12, vocab_size=40)
    module = PipelineModule(model).materialize()
    x, y = model.batch(3, torch.Generator().manual_seed(0))
    whole = model.loss(run_layers(module.local_stack(), x), y).sum()
    whole.backward()
    ref = {n: p.grad.clone() for n, p in module.named_parameters()}
    for lengths in [(12,), (5, 4, 3), (1, 1, 10), (6, 6)]:
        module.zero_grad(set_to_none=True)
        cache, losses = KVCache(), []
        for i, (a, b) in enumerate(bounds(lengths)):
            with running(TokenSlice(i, a, b, cache)):
                losses.append(model.slice_loss(run_layers(module.local_stack(), x[:, a:b]), y, a, b).sum())
        for i in reversed(range(len(lengths))):
            roots, grads = cache.cache_gradients(i)
            torch.autograd.backward([losses[i], *roots], [None, *grads])
        assert sum(loss.item() for loss in losses) == pytest.approx(whole.item(), rel=1e-6)
        for n, p in module.named_parameters():
            assert torch.allclose(p.grad, ref[n], atol=1e-6, rtol=1e-5), (lengths, n)


def test_only_models_that_declare_slicing_support_it():
    assert supports_slicing(tiny_model("gpt"))
    assert not supports_slicing(tiny_model("bert")) and not supports_slicing(tiny_model("vgg19"))


@pytest.mark.parametrize("L,grid,S,M", [(8, 1, 2, 1), (10, 2, 4, 1), (12, 2, 3, 2), (9, 1, 4, 3)])
def test_the_dynamic_programme_equals_exhaustive_enumeration(L, grid, S, M):
    """Under the same slice cost function, the programme's best slicing is the best of every
    composition of the sequence on the grid."""

    def t(length, context):  # attention-heavy: later tokens cost more
        return 1e-3 * length + 2e-4 * length * (2 * context + length)

    got = dp_slicings(t, L, S, M, grid)[0]
    cuts = [p for p in range(grid, L, grid)]
    best = None
    for k in range(len(cuts) + 1):
        for chosen in itertools.combinations(cuts, k):
            edges = [0, *chosen, L]
            lengths = tuple(b - a for a, b in zip(edges, edges[1:]))
            value = dp_objective(t, lengths, S, M)
            if best is None or value < best[0] - 1e-15:
                best = (value, lengths)
    assert got[0] == pytest.approx(best[0], rel=1e-12)
    assert dp_objective(t, got[1], S, M) == pytest.approx(got[0], rel=1e-12)


def test_the_sliced_floor_stays_below_the_simulation_and_its_peaks_are_the_simulators():
    """The planner simulates a sliced candidate only where sliced_floor is under its cutoff, and keeps
    none whose peak bytes (from the order alone) do not fit: over random stages, costs, shares and
    slicings the floor is at most the simulation, and the peaks are the simulator's. The floor is
    not vacuous: in most draws it is at least the busiest stage's work."""
    import random

    rng = random.Random(7)
    tight = 0
    for _ in range(300):
        S, M = rng.randint(1, 5), rng.randint(1, 6)
        L = rng.randint(1, 24)
        cuts = sorted(rng.sample(range(1, L), rng.randint(0, min(4, L - 1)))) if L > 1 else []
        lengths = tuple(b - a for a, b in zip([0, *cuts], [*cuts, L]))
        costs = []
        for _s in range(S):
            ar = rng.choice([0.0, rng.uniform(0, 3)])
            costs.append(
                StageCosts(
                    rng.uniform(0.1, 2),
                    rng.uniform(0.1, 4),
                    send_activation_s=rng.choice([0.0, rng.uniform(0, 2)]),
                    send_gradient_s=rng.choice([0.0, rng.uniform(0, 2)]),
                    allreduce_s=ar,
                    allreduce_after_b_s=rng.choice([None, ar * rng.random()]),
                    activation_bytes=rng.uniform(1, 100),
                    recompute_bytes=rng.choice([0.0, rng.uniform(0, 50)]),
                    workspace_bytes=rng.uniform(0, 20),
                    action_s=rng.choice([0.0, rng.uniform(0, 0.2)]),
                )
            )
        scales = [
            unit_scales(
                slice_scale(
                    lengths,
                    rng.random(),
                    rng.random() / 2,
                    rng.random() / 2,
                    fixed=rng.choice([0.0, rng.random() / 3]),
                    latency_up=rng.random() / 3,
                    latency_down=rng.random() / 3,
                ),
                M,
            )
            for _s in range(S)
        ]
        sched = terapipe(S, M, lengths)
        sim = simulate(sched, costs, record=False, scale=scales)
        floor, peaks = sliced_floor(costs, scales, len(lengths))
        assert floor <= sim.iteration_s * (1 + 1e-12)
        assert peaks == pytest.approx(sim.peak_activation_bytes, rel=1e-9)
        work = max((c.forward_s + c.backward_s) * sum(sc.compute) for c, sc in zip(costs, scales))
        tight += floor > work * (1 + 1e-9)
    assert tight > 150


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_a_sliced_plans_proof_is_over_the_families_searched_and_says_slices_are_unbounded():
    """Where token slices beat every plan of the families searched, plan.json's proof gap is the
    sliced plan's distance above their bound (0 where it is faster than any of them can be, never
    more than the best unsliced plan's), and the headline says the slices themselves are not
    bounded rather than calling the plan optimal."""
    from dapple_launch.planner.explain import headline
    from dapple_launch.planner.search import plan, search

    model = build_model("gpt", "tiny", num_layers=8, hidden=32, heads=2, seq_len=64, vocab_size=40)
    topo = Topology("t", 1, 4, 8e9, 0.05, 1e9, 1e9, device_kind="cpu")
    profile = analytic_profile(model, 2, topo.device_tflops, "cpu")
    limits = Limits(auto_token_slices=True, seq_len=64, search_nodes=20)  # (a budget that leaves a gap at G 8)
    gaps = []
    for G in (4, 8):
        chosen = plan(profile, topo, G, limits)
        best, _, _, stats = search(profile, topo, G, limits)
        assert chosen.token_slices and chosen.estimate.iteration_s < best.iteration_s
        assert chosen.proof is not None
        bound = best.iteration_s * (1 - stats.proven_gap)
        assert chosen.proof["gap"] == pytest.approx(max(0.0, 1 - bound / chosen.estimate.iteration_s), abs=1e-12)
        assert chosen.proof["gap"] <= stats.proven_gap
        text = headline(chosen)
        assert "token slices are not bounded" in text and "optimal" not in text
        gaps.append((stats.proven_gap, chosen.proof["gap"]))
    # (the budget left the search a gap at G 8, which the sliced plan narrows: 14.9 -> 9.7 %)
    assert any(0 < sliced < searched for searched, sliced in gaps), gaps


def test_a_fixed_plan_with_slices_and_the_planners_choice():
    """token_slices=[..] runs schedule terapipe with them (plan.json: token_slices, orders with the
    slice index); auto picks the programme's slices where the simulator finds them faster."""
    model = build_model("gpt", "tiny", num_layers=4, hidden=32, heads=2, seq_len=64, vocab_size=40)
    topo = Topology("t", 1, 4, 8e9, 0.05, 1e9, 1e9, device_kind="cpu")
    profile = analytic_profile(model, 2, topo.device_tflops, "cpu")
    plain = fixed_plan(profile, topo, 2, 4, [1], 1, Limits(schedule="gpipe"))
    sliced = fixed_plan(profile, topo, 2, 4, [1], 1, Limits(token_slices=(32, 16, 16)))
    assert sliced.schedule == "terapipe" and sliced.token_slices == (32, 16, 16)
    d = json.loads(sliced.to_json())
    assert d["token_slices"] == [32, 16, 16] and d["orders"][0]["actions"][:3] == [
        ["F", 0, 0, 0],
        ["F", 0, 0, 1],
        ["F", 0, 0, 2],
    ]
    assert Plan.from_json(sliced.to_json()) == sliced
    assert sliced.estimate.iteration_s < plain.estimate.iteration_s  # 4 stages, one sequence: slices fill them
    chosen = fixed_plan(profile, topo, 2, 4, [1], 1, Limits(schedule="gpipe", auto_token_slices=True, seq_len=64))
    assert chosen.token_slices and chosen.estimate.iteration_s <= sliced.estimate.iteration_s
    assert chosen.estimate.simulated_iteration_s == pytest.approx(chosen.estimate.iteration_s)
    with pytest.raises(ValueError, match="recomputed forward would not"):
        Limits(token_slices=(32, 32), recompute="full")


# ---- several processes ---------------------------------------------------------------------------
# Loss and every gradient against the reference and the unsliced runs: tests/test_pipeline_numerics.py
# LIMITED (2 and 4 stages, 1-4 micro-batches, equal and unequal slices, 2:2 and 2:1:1 replicas).


def _unit_bytes(rank, world, plan_json):
    """This stage's peak saved bytes over an iteration, and each unit's kept bytes measured alone."""
    from dapple_launch.runtime.executor import StageExecutor
    from dapple_launch.runtime.p2p import PointToPoint

    from .saved_bytes import SavedBytes
    from .test_pipeline_numerics import rank_stage, stage_input

    plan, model, grid, stage, replica, local = rank_stage(rank, plan_json)
    a = plan.stages[stage].layers[0]
    M, lengths = plan.num_micro_batches, plan.token_slices
    batch = model.batch(2 * M, torch.Generator().manual_seed(1))
    earlier = PipelineModule(model).materialize(list(range(0, a))) if a else None  # (its attention keeps a cache)
    per_unit, kept = [], []  # (the outputs stay referenced, as the executor keeps them until their backward)
    for m in range(M):  # each micro-batch's slices in order, as the executor runs them
        cache = KVCache()
        one = SavedBytes(local.parameters())
        with one.hooks():
            for i, (lo, hi) in enumerate(bounds(lengths)):
                x = batch[0][2 * m : 2 * m + 2, lo:hi]
                with running(TokenSlice(i, lo, hi, cache)):
                    (x,) = stage_input(model, a, x, earlier)
                    before = one.live
                    y = run_layers(local.local_stack(), x)
                    if stage == grid.num_stages - 1:
                        y = model.slice_loss(y, batch[1][2 * m : 2 * m + 2], lo, hi).sum()
                    per_unit.append(one.live - before)
                    kept.append(y)
        del y, cache, kept[:]
    counter = SavedBytes(local.parameters())
    ex = StageExecutor(
        local.local_stack(),
        model.loss,
        PointToPoint(grid, stage, replica),
        grid.num_stages,
        slice_loss_fn=model.slice_loss,
    )
    with counter.hooks():
        ex.run(plan.build_schedule(), batch)
    return {"stage": stage, "peak": counter.peak, "units": per_unit}


@pytest.mark.multiprocess
def test_peak_saved_bytes_with_slices_equal_the_simulators(tmp_path):
    """Counted exactly (saved-tensor hooks, the keys and values later slices attend to included),
    each stage's peak over an iteration equals the simulator's, fed each unit's bytes."""
    from .multiproc import run_ranks

    model = tiny_model()
    plan = make_plan(model, (1, 1), "gpipe", 2, 4, token_slices=(3, 5))
    results = sorted(run_ranks(2, _unit_bytes, (plan.to_json(),), tmp_path), key=lambda r: r["stage"])
    sched = plan.build_schedule()
    sim = simulate(sched, [StageCosts(1.0, 2.0)] * 2, unit_bytes=[r["units"] for r in results])
    assert [r["peak"] for r in results] == sim.peak_activation_bytes
    assert results[0]["units"][1] > results[0]["units"][0] * 5 / 3 * 0.99  # the later slice keeps its context too


def test_the_predicted_timeline_of_a_sliced_plan_is_its_estimate():
    """plan.json carries each stage's slice shares: the timeline's simulation (and any outside tool's)
    reproduces the plan's sliced estimate; events are labelled micro-batch.slice."""
    from dapple_launch.runtime.timeline import predicted

    model = build_model("gpt", "tiny", num_layers=2, hidden=32, heads=2, seq_len=32, vocab_size=40)
    topo = Topology("t", 1, 4, 8e9, 0.05, 1e9, 1e9, device_kind="cpu")
    profile = analytic_profile(model, 2, topo.device_tflops, "cpu")
    plan = Plan.from_json(fixed_plan(profile, topo, 2, 4, [1], 2, Limits(token_slices=(16, 8, 8))).to_json())
    assert len(plan.estimate.slice_shares) == 4
    pred = predicted(plan)
    assert pred["iteration_s"] == pytest.approx(plan.estimate.iteration_s, rel=1e-9)
    labels = {ev["label"] for r in pred["ranks"] for ev in r["events"]}
    assert {"F0.0", "F1.2", "B1.2"} <= labels


def test_the_measuring_profiler_measures_how_slices_grow_with_context():
    """A measured profile of a sliceable model times and counts each layer on a slice after a cached
    context: attention blocks keep more for a later slice (the context's keys and values), the
    embedding and the head do not; a model without slicing gets no shares."""
    from dapple_launch.profile.measure import measure_profile

    model = build_model("gpt", "tiny", num_layers=2, hidden=32, heads=2, seq_len=32, vocab_size=40)
    profile = measure_profile(model, 2, repeats=1, use_cache=False)
    blocks = [x for x in profile.layers if x.name.startswith("block")]
    assert all(x.slice_memory_kv > 0 for x in blocks)
    assert all(0 <= x.slice_compute <= 1 for x in profile.layers)
    ends = [profile.layers[0], profile.layers[-1]]
    assert all(x.slice_memory_kv == 0 and x.slice_memory_att == 0 for x in ends)  # (times are noisy; bytes exact)
    bert = measure_profile(tiny_model("bert"), 2, repeats=1, use_cache=False)
    assert not bert.slices_tokens
