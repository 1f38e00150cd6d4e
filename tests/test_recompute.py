"""Activation recomputation: gradients equal the whole backward; what a micro-batch keeps, counted
exactly, is what the cost model charges; plans carry `recompute_layers`; the planner recomputes
the fewest layers that fit; the pipelined runs equal the single-process reference."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from dapple_launch.cluster import Topology
from dapple_launch.models import build_model
from dapple_launch.models.contract import as_tuple, run_layers
from dapple_launch.planner import Limits, Plan, fixed_plan
from dapple_launch.planner.search import NoFeasiblePlan
from dapple_launch.planner.search import plan as auto_plan
from dapple_launch.profile import analytic_profile
from dapple_launch.runtime.module import PipelineModule
from dapple_launch.runtime.recompute import segments, with_recomputation
from dapple_launch.schedule import StageCosts, simulate

from .saved_bytes import SavedBytes
from .test_pipeline_numerics import make_plan, tiny_model


def _grads(module, stack, model, batch, seed=0):
    torch.manual_seed(seed)
    module.zero_grad(set_to_none=True)
    loss = model.loss(run_layers(stack, batch[0]), batch[1]).sum()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in module.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("name", ["gpt-dropout", "skipnet", "vgg19"])
def test_recomputed_segments_give_the_whole_backwards_gradients(name):
    """Any set of recomputed layers (one segment, several, the stage's first, its last): the same loss
    and every gradient bit for bit, dropout included (the recomputed forward draws the same masks),
    a tied weight and integer members of the carry included."""
    model = (
        build_model("gpt", "tiny", num_layers=3, hidden=32, heads=2, seq_len=8, vocab_size=40, dropout=0.2)
        if name == "gpt-dropout"
        else tiny_model(name)
    )
    module = PipelineModule(model).materialize().train()
    batch = model.batch(4, torch.Generator().manual_seed(1))
    layers = module.local_stack()
    L = len(layers)
    loss, ref = _grads(module, layers, model, batch)
    for marks in [range(L), [0], [0, 1], [1, 2], [L - 1], [0, 2, 3], range(1, L, 2)]:
        got_loss, got = _grads(module, with_recomputation(layers, list(marks)), model, batch)
        assert got_loss == loss, (name, list(marks))
        for n, g in ref.items():
            assert torch.equal(got[n], g), (name, list(marks), n)


def test_segments_group_consecutive_layers_and_refuse_strangers():
    assert segments([3, 0, 1, 5], 6) == [(0, 2), (3, 4), (5, 6)]
    assert segments([], 4) == []
    with pytest.raises(ValueError, match="not all among"):
        segments([4], 4)


@pytest.mark.slow  # (over a second: out of the fast tier)
@pytest.mark.parametrize("name", ["gpt", "skipnet", "vgg19"])
def test_kept_and_backward_bytes_counted_exactly_equal_the_cost_model(name):
    """On a measured profile (per-layer saves counted by the same hooks), what one micro-batch keeps
    after its forward and the most it holds above that in its backward equal
    ModelProfile.recompute_bytes exactly, for none, full and selective sets, on stages that neither
    start nor end the model (the last stage also keeps the loss's own saves, which a layer profile does
    not list; the first layer's measured saves differ from its run on a batch by its input's bytes)."""
    from dapple_launch.profile.measure import measure_profile

    model = tiny_model(name)
    profile = measure_profile(model, 2, repeats=1, use_cache=False)
    full = PipelineModule(model).materialize()
    batch = model.batch(2, torch.Generator().manual_seed(1))
    L = profile.num_layers
    checked = 0
    for a, z in [(1, L - 1), (1, L - 2), (2, L - 1)]:
        with torch.no_grad():
            x = as_tuple(run_layers(full.local_stack()[:a], batch[0])) if a else as_tuple(batch[0])
        x = tuple(t.detach().requires_grad_(t.is_floating_point() and a > 0) for t in x)
        for marks in [(), tuple(range(a, z)), (a,), (a + 1, a + 2), tuple(range(a, z, 2)), (z - 1,)]:
            marks = tuple(i for i in marks if i < z)
            blocks = with_recomputation(full.local_stack()[a:z], [i - a for i in marks])
            counter = SavedBytes(full.parameters())
            with counter.hooks():
                y = run_layers(blocks, x if len(x) > 1 else x[0])
                kept = counter.live
                out = sum(t.float().sum() for t in as_tuple(y) if t.is_floating_point())
                out.backward()
            model_kept, model_extra = profile.recompute_bytes(a, z, marks, 2)
            received = profile.cut_bytes[a - 1] if a else 0.0  # the wire tensors: held, never saved
            assert (kept, counter.peak - kept) == (model_kept - received, model_extra), (name, (a, z), marks)
            checked += 1
    assert checked == 18


def _plan(recompute="none", schedule="1f1b", replicas=(1, 1), **kw):
    return make_plan(tiny_model(), replicas, schedule, 4, 8, recompute=recompute, **kw)


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_fixed_plans_carry_recompute_layers_and_cost_them():
    """none / full / selective (counts per stage, one count for all, positions): plan.json lists the
    positions per stage; each recomputed stage keeps less per micro-batch and its backward costs
    its recomputed forward more."""
    none, full = _plan(), _plan("full")
    counts, one, positions = (
        _plan("selective", recompute_counts=(2, 1)),
        _plan("selective", recompute_counts=(1,)),
        _plan("selective", recompute_layers=(1, 4)),
    )
    assert [s.recompute_layers for s in none.stages] == [(), ()]
    assert [s.recompute_layers for s in full.stages] == [tuple(range(*s.layers)) for s in full.stages]
    a, b = counts.stages[0].layers[0], counts.stages[1].layers[0]
    assert [s.recompute_layers for s in counts.stages] == [(a, a + 1), (b,)]
    assert [s.recompute_layers for s in one.stages] == [(a,), (b,)]
    assert [s.recompute_layers for s in positions.stages] == [(1,), (4,)]
    base = none.estimate.stage_costs
    for p in (full, counts, positions):
        for s, c in enumerate(p.estimate.stage_costs):
            assert c["activation_bytes"] < base[s]["activation_bytes"]
            assert c["backward_s"] > base[s]["backward_s"]
        assert p.estimate.iteration_s > none.estimate.iteration_s
        d = json.loads(p.to_json())
        assert [s["recompute_layers"] for s in d["stages"]] == [list(s.recompute_layers) for s in p.stages]
        assert Plan.from_json(p.to_json()) == p
    assert "recomputed" in full.explain() and "all (full)" in full.explain()


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_a_plans_recomputation_reads_in_one_word():
    """The frontier's table and picture say none, full, or each stage's count."""
    from dapple_launch.planner.explain import recomputed_per_stage

    assert recomputed_per_stage(_plan()) == "none"
    assert recomputed_per_stage(_plan("full")) == "full"
    assert recomputed_per_stage(_plan("selective", recompute_counts=(2, 0))) == "2+0"


def test_recomputation_refusals_name_the_rule():
    with pytest.raises(ValueError, match="zb_h1"):
        Limits(schedule="zb_h1", recompute="full")
    with pytest.raises(ValueError, match="needs strategy.recompute_layers"):
        Limits(recompute="selective")
    with pytest.raises(ValueError, match="stage 1 has 2 layers"):
        _plan("selective", recompute_counts=(1, 3))
    d = json.loads(_plan("full").to_json())
    d["stages"][0]["recompute_layers"] = [d["stages"][1]["layers"][0]]
    with pytest.raises(ValueError, match="not among its layers"):
        Plan.from_dict(d)


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_auto_recomputes_the_fewest_layers_that_fit():
    """A card too small for any plan without recomputation: recompute=none says no plan fits;
    recompute=auto finds one whose recomputed stages recompute their first layers, the fewest that fit
    (one fewer on a recomputed stage does not fit), and its memory is within the card."""
    from dapple_launch.planner.search import smallest_memory_need

    model = build_model("gpt", "tiny", num_layers=6, hidden=64, heads=2, seq_len=256, vocab_size=64)
    probe = Topology("probe", 1, 2, 64e9, 1.0, 1e9, 1e9, device_kind="cpu")
    profile = analytic_profile(model, 2, probe.device_tflops, "cpu")
    limits = Limits(memory_headroom=0.0, max_warmup_depth=1, schedules=("1f1b",))
    tight = smallest_memory_need(profile, probe, limits)[0] * 0.7
    topo = Topology("small", 1, 2, tight, 1.0, 1e9, 1e9, device_kind="cpu")
    with pytest.raises(NoFeasiblePlan, match="recomputation"):
        auto_plan(profile, topo, 8, limits)
    fitted = auto_plan(
        profile, topo, 8, Limits(memory_headroom=0.0, max_warmup_depth=1, schedules=("1f1b",), recompute="auto")
    )
    assert fitted.recomputes and max(fitted.estimate.peak_memory_bytes) <= tight
    for s, st in enumerate(fitted.stages):
        k = len(st.recompute_layers)
        assert st.recompute_layers == tuple(range(st.layers[0], st.layers[0] + k))
        if k:
            fewer = fixed_plan(
                profile,
                Topology("big", 1, 2, 64e9, 1.0, 1e9, 1e9, device_kind="cpu"),
                8,
                fitted.num_stages,
                [x.replicas for x in fitted.stages],
                fitted.num_micro_batches,
                Limits(
                    recompute="selective",
                    recompute_layers=tuple(
                        i
                        for j, x in enumerate(fitted.stages)
                        for i in x.recompute_layers
                        if j != s or i < x.layers[0] + k - 1
                    ),
                ),
                boundaries=[x.layers[0] for x in fitted.stages[1:]],
            )
            assert fewer.estimate.peak_memory_bytes[s] > tight, (s, k)


def test_simulator_charges_a_backwards_recomputed_activations():
    """Peak bytes: in-flight micro-batches × what each keeps, plus one backward's recomputed segment."""
    from dapple_launch.schedule import build_schedule

    costs = [
        StageCosts(1.0, 3.0, activation_bytes=10.0, recompute_bytes=25.0),
        StageCosts(1.0, 3.0, activation_bytes=4.0),
    ]
    sim = simulate(build_schedule("1f1b", 2, 4), costs)
    assert sim.peak_in_flight == [2, 1]
    assert sim.peak_activation_bytes == [2 * 10.0 + 25.0, 4.0]


# ---- several processes ---------------------------------------------------------------------------
# Loss and every gradient against the reference: tests/test_pipeline_numerics.py LIMITED (2 and 4
# stages, full and selective, uneven replication), run with the other pipelined cases' processes.


def _peak_with_recompute(rank, world, plan_json):
    """This stage's peak saved bytes over an iteration of its plan, and one micro-batch's kept and
    backward-extra bytes measured alone."""
    from dapple_launch.runtime.executor import StageExecutor
    from dapple_launch.runtime.p2p import PointToPoint

    from .test_pipeline_numerics import rank_stage, stage_input

    plan, model, grid, stage, replica, local = rank_stage(rank, plan_json)
    a = plan.stages[stage].layers[0]
    marks = [i - a for i in plan.stages[stage].recompute_layers]
    batch = model.batch(2 * plan.num_micro_batches, torch.Generator().manual_seed(1))
    one = SavedBytes(local.parameters())
    x = stage_input(model, a, tuple(t[:2] for t in as_tuple(batch[0])))
    with one.hooks():  # one micro-batch as the executor runs it
        y = run_layers(with_recomputation(local.local_stack(), marks), x if len(x) > 1 else x[0])
        out = (
            model.loss(y, batch[1][:2]).sum()
            if stage == grid.num_stages - 1
            else sum(t.float().sum() for t in as_tuple(y) if t.is_floating_point())
        )
        kept = one.live
        out.backward()
    counter = SavedBytes(local.parameters())
    ex = StageExecutor(
        local.local_stack(), model.loss, PointToPoint(grid, stage, replica), grid.num_stages, recompute=marks
    )
    with counter.hooks():
        ex.run(plan.build_schedule(), batch)
    return {"stage": stage, "peak": counter.peak, "kept": kept, "extra": one.peak - kept}


def _peaks_many(rank, world, plans):
    return [_peak_with_recompute(rank, world, p) for p in plans]


@pytest.mark.multiprocess
def test_peak_saved_bytes_with_recomputation_equal_the_simulators(tmp_path):
    """Counted exactly over an iteration on 4 stages (1F1B and GPipe, none / selective / full): each
    stage's peak is the simulator's, fed what one micro-batch keeps and holds above that in its backward."""
    from .multiproc import run_ranks

    model = tiny_model()
    grid = [
        ("1f1b", "none", {}),
        ("1f1b", "full", {}),
        ("1f1b", "selective", {"recompute_counts": (1, 1, 0, 1)}),
        ("gpipe", "full", {}),
    ]
    plans = [make_plan(model, (1, 1, 1, 1), sch, 6, 12, recompute=rc, **kw) for sch, rc, kw in grid]
    per_rank = run_ranks(4, _peaks_many, ([p.to_json() for p in plans],), tmp_path)
    for k, (case, plan) in enumerate(zip(grid, plans)):
        results = sorted((rank[k] for rank in per_rank), key=lambda r: r["stage"])
        costs = [StageCosts(1.0, 2.0, activation_bytes=r["kept"], recompute_bytes=r["extra"]) for r in results]
        sim = simulate(plan.build_schedule(), costs)
        assert [r["peak"] for r in results] == sim.peak_activation_bytes, case
        if case[1] != "none":
            assert any(r["extra"] > 0 for r in results), case


def test_the_planners_prefix_shortcut_equals_the_general_count():
    """first_layers_recomputed (O(1), what recompute=auto scans) equals recompute_bytes and
    recompute_seconds of the same first layers, on every stage and count of a profile with fixed parts."""
    from dapple_launch.profile import LayerProfile, chain

    layers = [
        LayerProfile(
            f"l{i}",
            1e-3 * (i + 1),
            2e-3,
            1e5 * (i % 3 + 1),
            1e6,
            saved_bytes=3e5 * (i % 2 + 1),
            forward_fixed_s=1e-4,
            saved_fixed_bytes=1e4 * i,
        )
        for i in range(7)
    ]
    profile = chain("p", layers, batch_size=4)
    for a in range(7):
        for z in range(a + 1, 8):
            for k in range(1, z - a + 1):
                kept, extra, again = profile.first_layers_recomputed(a, z, k, 3)
                marks = range(a, a + k)
                assert (kept, extra) == pytest.approx(profile.recompute_bytes(a, z, marks, 3), rel=1e-12)
                assert again == pytest.approx(profile.recompute_seconds(a, z, marks, 3), rel=1e-12)


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_a_plan_started_from_a_recomputing_one_is_costed_with_its_own_recomputation():
    """ZB-H1 on the layouts found so far (zero_bubble_search.starts) and 1F1B at deeper warm-ups
    (warmup.deepen_best_layouts) start from plans that may recompute: each costs its layout afresh
    with its own recomputation (none for ZB-H1; what its warm-up needs under "auto"), never the start's
    recomputed costs under a recomputation it does not state. On a card that holds the two-stage
    layout under ZB-H1 only if its layers are recomputed, ZB-H1 from a 1F1B plan recomputing every
    layer does not fit, and the deeper 1F1B warm-ups state what they recompute. (A ZB-H1 plan once
    took a 1F1B plan's recomputed costs and ran without recomputing: 58 GB a device estimated for
    hundreds held.)"""
    from dapple_launch.planner.cost import StageSpec, evaluate, memory_per_device, recomputed_costs, stage_costs
    from dapple_launch.planner.warmup import deepen_best_layouts
    from dapple_launch.planner.zero_bubble_search import starts

    model = build_model("gpt", "tiny", num_layers=8, hidden=64, heads=2, seq_len=512, vocab_size=64)
    roomy = Topology("roomy", 1, 2, 64e9, 1.0, 1e9, 1e9, device_kind="cpu")
    profile = analytic_profile(model, 2, roomy.device_tflops, "cpu")
    layout = (StageSpec(0, 5, (0,)), StageSpec(5, 10, (1,)))
    G, b = 16, 2
    full = evaluate(profile, roomy, layout, b, G // b, Limits(memory_headroom=0.0, recompute="full"))
    bare = stage_costs(profile, roomy, layout, b)
    zb = Limits(memory_headroom=0.0, schedule="zb_h1")
    recomputed_need = max(memory_per_device(profile, layout, full.costs, G // b, zb))
    bare_need = max(memory_per_device(profile, layout, bare, G // b, zb))
    assert recomputed_need < bare_need
    card = Topology("card", 1, 2, (recomputed_need + bare_need) / 2, 1.0, 1e9, 1e9, device_kind="cpu")
    start = evaluate(profile, card, layout, b, G // b, Limits(memory_headroom=0.0, recompute="full"))
    assert start.recompute and start.fits
    auto = Limits(memory_headroom=0.0, schedules=("1f1b", "zb_h1"), recompute="auto")
    zero_bubble = starts(profile, card, G, auto, [start])
    assert all(not c.fits for c in zero_bubble if c.layout == layout), [c.summary() for c in zero_bubble]
    deeper = deepen_best_layouts([start], profile, card, replace(auto, schedule="1f1b"))
    for c in [*zero_bubble, *deeper]:
        fresh = stage_costs(profile, card, c.layout, c.micro_batch_size)
        if c.recompute:
            fresh = recomputed_costs(profile, card, c.layout, fresh, c.micro_batch_size, c.recompute)
        assert c.costs == fresh, (c.summary(), c.recompute)
        assert not (c.schedule == "zb_h1" and c.recompute)


@pytest.mark.slow  # (a few seconds: out of the fast tier)
def test_every_candidate_is_costed_with_the_recomputation_it_states():
    """A candidate's stage costs are its layout's with its own recomputed layers and no others, and
    its memory is what they keep, so the plan runs what was costed: on a card where many 1F1B plans
    fit only by recomputing, every candidate of 1F1B, GPipe and ZB-H1 the whole search found has
    the costs and memory of its layout, recomputation and warm-up costed afresh (a recomputed
    stage's memory once left out a layer's workspace), and ZB-H1 recomputes nothing."""
    from dapple_launch.planner.cost import memory_per_device, recomputed_costs, stage_costs
    from dapple_launch.planner.search import drive, initial_state, smallest_memory_need

    model = build_model("gpt", "tiny", num_layers=8, hidden=64, heads=2, seq_len=256, vocab_size=64)
    probe = Topology("probe", 1, 4, 64e9, 1.0, 1e9, 1e9, device_kind="cpu")
    profile = analytic_profile(model, 2, probe.device_tflops, "cpu")
    base = Limits(memory_headroom=0.0, schedules=("1f1b", "zb_h1"))
    tight = smallest_memory_need(profile, probe, base)[0] * 1.1  # (1F1B recomputes; some ZB-H1 fits)
    topo = Topology("small", 1, 4, tight, 1.0, 1e9, 1e9, device_kind="cpu")
    limits = Limits(memory_headroom=0.0, schedules=("1f1b", "zb_h1"), recompute="auto")
    state, _ = initial_state(profile, topo, 16, limits, 4, False)
    drive(state)
    checked, recomputed, zero_bubble = 0, 0, 0
    for c in state.found:
        if c.schedule not in ("1f1b", "gpipe", "zb_h1"):
            continue
        fresh = stage_costs(profile, topo, c.layout, c.micro_batch_size)
        if c.recompute:
            fresh = recomputed_costs(profile, topo, c.layout, fresh, c.micro_batch_size, c.recompute)
        assert c.costs == fresh, (c.summary(), c.recompute)
        family = Limits(memory_headroom=0.0, schedule=c.schedule)
        memory = memory_per_device(profile, c.layout, fresh, c.num_micro_batches, family, c.warmup)
        assert c.memory_bytes == pytest.approx(memory, rel=1e-12), c.summary()
        checked += 1
        recomputed += bool(c.recompute)
        zero_bubble += c.schedule == "zb_h1"
        assert not (c.schedule == "zb_h1" and c.recompute)
    assert checked > 5 and recomputed and zero_bubble, (checked, recomputed, zero_bubble)


@pytest.mark.slow  # (about ten seconds: out of the fast tier)
def test_llama_70b_on_1024_a100s_is_planned_with_the_recomputation_its_plan_runs():
    """The model users train at the scale they train it (model=llama model.preset=70b on 128 nodes
    of 8 A100s, G 1024, as the CLI plans it): the plan fits the card, and each stage's costs are its
    layers' with the recompute_layers plan.json lists and no others. (It was once ZB-H1 at 58 GB a
    device, costed with a 1F1B plan's recomputation and listing none.) It is now interleaved 1F1B,
    each stage recomputing its fewest first layers that fit (group_recompute.py)."""
    from benchmarks.fuzz_plan import FRESH, costed_afresh, groups_afresh
    from dapple_launch import plan_config
    from dapple_launch.cli import compose
    from dapple_launch.planner.search import plan as search_plan

    cfg = compose(["model=llama", "model.preset=70b", "cluster=a100x64", "cluster.nodes=128", "global_batch_size=1024"])
    topology = plan_config.topology_from_config(cfg.cluster, plan_config.run_precision(cfg))
    profile = plan_config.profile_from_config(cfg, topology)
    limits = plan_config.limits_from_config(cfg.strategy, plan_config.slicing_seq_len(cfg))
    p = search_plan(profile, topology, 1024, limits)
    assert max(p.estimate.peak_memory_bytes) <= topology.device_memory_bytes * (1 - limits.memory_headroom)
    # every stage cost (activation bytes and backward seconds among them) and the memory, costed
    # afresh from the layout and the listed recomputation, within 1e-9 (the fuzz's check)
    assert any(st.recompute_layers for st in p.stages)
    # (device groups fit it only recomputing: chunked.recomputes_to_fit)
    (costed_afresh if p.schedule in FRESH else groups_afresh)(profile, topology, p, limits)
    assert 0 <= p.proof["gap"] < 1


@pytest.mark.parametrize("chosen", [{"recompute_counts": (1,)}, {"recompute_layers": (2,)}])
def test_selective_recomputation_lets_the_search_place_stages_that_fit_only_with_it(chosen):
    """Under strategy.recompute=selective a micro-batch keeps less than its whole activations, so the
    search's memory test and its bounds' tables count parameters only (as under auto): a stage that
    fits only with its recomputed layers is searched, and the tables bound it from below. Before,
    they counted one whole micro-batch (31 MB on a 26 MB card) and proved a plan "optimal" that only
    a baseline had found."""
    from dapple_launch.planner.branch import BranchAndBound
    from dapple_launch.profile import LayerProfile, chain

    # layers 2-3 save 10 MB each: stage 1 of a 2:2 cut needs 10 + 1 + 20 MB whole, 21 MB recomputing one
    profile = chain(
        "four",
        [LayerProfile(f"l{i}", 1e-3, 2e-3, 1e6, 5e6, saved_bytes=1e6 if i < 2 else 10e6) for i in range(4)],
        batch_size=1,
    )
    topo = Topology("two", 1, 2, 26e6, 1.0, 1e9, 1e9, device_kind="cpu")
    limits = Limits(memory_headroom=0.0, schedules=("1f1b",), recompute="selective", optimizer_factor=1.0, **chosen)
    fixed = fixed_plan(profile, topo, 4, 2, [1, 1], 4, limits)
    assert fixed.estimate.peak_memory_bytes[1] == pytest.approx(21e6)
    found = auto_plan(profile, topo, 4, limits, with_baselines=False)
    assert found.estimate.iteration_s <= fixed.estimate.iteration_s * (1 + 1e-12)
    branch = BranchAndBound(profile, topo, 4, replace(limits, schedule="1f1b"), 1, math.inf)
    assert 0 < max(branch.root_bound(), branch.links_bound("1f1b")) <= fixed.estimate.iteration_s


def test_one_count_for_all_stages_recomputes_all_of_a_shorter_stage():
    """strategy=auto with strategy.recompute_counts=[2]: the planner makes the stages, some of one
    layer; such a stage recomputes its one layer (before, gpt medium on v100x16 stopped with "stage 1
    has 1 layers, so its count must be in 0..1"). A per-stage list stays exact, and a negative count
    is refused by name."""
    from dapple_launch.planner.cost import StageSpec, recompute_sets

    layout = (StageSpec(0, 3, (0,)), StageSpec(3, 4, (1,)))
    assert recompute_sets(layout, Limits(recompute="selective", recompute_counts=(2,))) == ((0, 1), (3,))
    with pytest.raises(ValueError, match="stage 1 has 1 layers"):
        recompute_sets(layout, Limits(recompute="selective", recompute_counts=(2, 2)))
    with pytest.raises(ValueError, match="each must be >= 0"):
        Limits(recompute="selective", recompute_counts=(-1,))
