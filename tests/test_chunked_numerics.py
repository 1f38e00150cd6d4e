"""Several gloo processes: schedules whose device groups hold several stages (interleaved 1F1B and
zero bubble, ZB-V, Chimera) — loss and every gradient equal a single-process reference, and each rank keeps exactly the
activations the simulator of its rank order counts."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dapple_launch.cluster import Topology
from dapple_launch.models import build_model
from dapple_launch.models.contract import as_tuple
from dapple_launch.planner import Limits, fixed_plan
from dapple_launch.profile import analytic_profile
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.module import PipelineModule
from dapple_launch.runtime.precision import MixedPrecision
from dapple_launch.runtime.rank_executor import build_rank_executor
from dapple_launch.runtime.tied import TiedSync, local_tied_parameters, tied_groups
from dapple_launch.schedule import StageCosts, simulate_ranks

from .custom_models.skipnet import build as build_skipnet
from .multiproc import run_ranks
from .rank_batches import rank_batch
from .saved_bytes import SavedBytes, saved_and_freed_at_input
from .test_pipeline_numerics import reference, worst_grad_rel

pytestmark = pytest.mark.multiprocess


def model_of(name: str):
    if name == "skipnet":  # tuple carries and a tied weight, from outside the package
        return build_skipnet(vocab=24, hidden=16, layers=6, seq_len=6)
    return build_model(
        "gpt", "tiny", num_layers=6, hidden=32, heads=2, seq_len=8, vocab_size=40, tie_embeddings=name == "gpt"
    )


def chunked_plan(model, groups, schedule, stages, num_micro_batches, global_batch, recompute=("none", ())):
    topo = Topology("test", 1, sum(groups), 8e9, 0.05, 1e9, 1e9, device_kind="cpu")
    profile = analytic_profile(model, 2, topo.device_tflops, "cpu")
    policy, counts = recompute
    return fixed_plan(
        profile,
        topo,
        global_batch,
        stages,
        list(groups),
        num_micro_batches,
        Limits(schedule=schedule, chunks=max(1, stages // len(groups)), recompute=policy, recompute_counts=counts),
    )


def _compare(rank, world, model_name, plan_json, batch_n):
    from dapple_launch.planner import Plan

    plan = Plan.from_json(plan_json)
    model = model_of(model_name)
    grid = ProcessGrid.from_plan(plan)
    batch = model.batch(batch_n, torch.Generator().manual_seed(1))
    ref, ref_loss, ref_grads = reference(model, batch)
    local_stages = grid.stages_at(rank)
    indices = [i for s in local_stages for i in range(*plan.stages[s].layers)]
    local = PipelineModule(model).materialize(indices)
    groups = {s: dist.new_group(grid.stage_ranks(s)) for s in range(grid.num_stages)}
    ties = tied_groups(model, [s.layers for s in plan.stages])
    for g in ties:
        g.group = dist.new_group(sorted({r for s in g.stages for r in grid.stage_ranks(s)}))
    replica = grid.stage_ranks(local_stages[0]).index(rank)
    ex, syncs = build_rank_executor(
        plan,
        grid,
        rank,
        {i: local.layers[str(i)] for i in indices},
        model.loss,
        groups,
        precision=MixedPrecision("32"),
        bucket_bytes=1,
    )
    # (one bucket per layer: each all-reduced while the stage's last B or W still runs the layers below)
    tied = TiedSync(ties, local_tied_parameters(local.layers, model), local_stages, replica)
    counter = SavedBytes(weights=list(local.parameters()))
    with counter.hooks():
        result = ex.run(plan.build_schedule(), rank_batch(plan, rank, batch))
    for sync in syncs:
        sync.finish()
    tied.sync()
    loss = result.loss_sum.clone()
    dist.all_reduce(loss)
    return {
        "loss": loss.item(),
        "ref_loss": ref_loss.item(),
        "worst_grad_rel": worst_grad_rel(local, ref_grads),
        "group": ex.group,
        "names": sorted(n for n, _ in local.named_parameters(remove_duplicate=False)),
        "saved_peak": ex.saved_peak,
        "saved_bytes": counter.peak,
        "one_forward_bytes": {
            s: _one_forward_bytes(
                plan, ref, local, model, s, batch, batch_n // plan.num_micro_batches // ex.chunks[s].replicas
            )
            for s in local_stages
        },
    }


def _one_forward_bytes(plan, ref, local, model, stage, batch, rows) -> tuple[int, int, int]:
    """What one forward of `stage` on `rows` samples keeps for backward (saved-tensor hooks), its
    input taken as the previous stages compute it: the bytes the simulator charges per micro-batch;
    of those, what a split backward's I frees; and what its backward holds above them while it
    recomputes (the stage's recompute_layers, as the executor runs them)."""
    from dapple_launch.models.contract import carry_map, run_layers
    from dapple_launch.runtime.recompute import with_recomputation

    a, b = plan.stages[stage].layers
    x = carry_map(lambda t: t[:rows], batch[0])
    if a:
        with torch.no_grad():
            x = carry_map(
                lambda t: t.detach().requires_grad_(t.is_floating_point()),
                run_layers([ref.layers[str(i)] for i in range(a)], x),
            )
    layers = [local.layers[str(i)] for i in range(a, b)]
    last = b == plan.num_layers
    marks = [i - a for i in plan.stages[stage].recompute_layers]

    def forward():
        y = run_layers(with_recomputation(layers, marks) if marks else layers, x)
        return model.loss(y, batch[1][:rows]).sum() if last else y

    if not marks:  # (a tied weight may sit in another layer)
        return (*saved_and_freed_at_input(forward, x, local.parameters(), last), 0)
    counter = SavedBytes(list(local.parameters()))
    with counter.hooks():
        out = forward()
        kept = counter.live
        outputs = [out] if last else [t for t in as_tuple(out) if t.requires_grad]
        torch.autograd.backward(outputs, None if last else [torch.ones_like(t) for t in outputs])
    return kept, 0, counter.peak - kept


def _many(rank, world, cases):
    return [_compare(rank, world, *c) for c in cases]


# (model, replicas per device group, schedule, stages, micro-batches, batch size): ranks {2, 4},
# micro-batches P … 4P, 2 and 3 chunks, uneven replication (a group's stages share its count)
CASES = [
    ("gpt", (1, 1), "interleaved_1f1b", 4, 2, 5),
    ("gpt", (1, 1), "interleaved_1f1b", 4, 8, 16),
    ("gpt-untied", (1, 1), "interleaved_1f1b", 6, 4, 9),
    ("skipnet", (1, 1), "interleaved_1f1b", 4, 6, 12),
    ("gpt", (1, 1), "zbv", 4, 1, 3),
    ("gpt", (1, 1), "zbv", 4, 5, 10),
    ("gpt-untied", (1, 1), "zbv", 4, 8, 8),
    ("skipnet", (1, 1), "zbv", 4, 3, 6),
    ("gpt", (1, 1, 1, 1), "interleaved_1f1b", 8, 4, 8),
    ("gpt", (1, 1, 1, 1), "interleaved_1f1b", 8, 16, 16),
    ("gpt", (1, 1, 1, 1), "zbv", 8, 4, 9),
    ("gpt-untied", (1, 1, 1, 1), "zbv", 8, 13, 13),
    ("gpt", (2, 1, 1), "interleaved_1f1b", 6, 3, 7),
    ("gpt", (1, 2, 1), "zbv", 6, 4, 9),
    ("gpt", (3, 1), "interleaved_1f1b", 4, 4, 13),
    ("gpt", (1, 3), "zbv", 4, 2, 7),
    ("gpt", (1, 2, 1), "zbv", 6, 4, 8),
    ("gpt", (2, 2), "zbv", 4, 2, 8),  # (even splits: bytes compared too)
    # interleaved zero bubble: interleaved's order with the backward split, W's filling the waits
    ("gpt", (1, 1), "interleaved_zb", 4, 4, 8),
    ("skipnet", (1, 1), "interleaved_zb", 4, 6, 12),
    ("gpt", (1, 1, 1, 1), "interleaved_zb", 8, 8, 16),
    ("gpt", (2, 1, 1), "interleaved_zb", 6, 3, 7),
    # Chimera: two pipelines in opposite directions, each stage on two groups (its gradients summed
    # over both copies), micro-batches in units of D
    ("gpt", (1, 1), "chimera", 2, 2, 4),
    ("gpt-untied", (1, 1), "chimera", 2, 6, 12),
    ("gpt", (1, 1, 1, 1), "chimera", 4, 4, 9),
    ("gpt", (1, 1, 1, 1), "chimera", 4, 16, 16),
    ("skipnet", (1, 1, 1, 1), "chimera", 4, 8, 8),
    ("gpt", (2, 2), "chimera", 2, 4, 9),
    # recomputation, with a whole backward (interleaved 1F1B, Chimera): full, and each stage's first layer
    ("gpt", (1, 1), "interleaved_1f1b", 4, 4, 8, ("full", ())),
    ("skipnet", (1, 1), "interleaved_1f1b", 4, 6, 12, ("selective", (1,))),
    ("gpt", (2, 1, 1), "interleaved_1f1b", 6, 3, 7, ("full", ())),
    ("gpt", (1, 1, 1, 1), "chimera", 4, 4, 8, ("selective", (1,))),
    ("gpt-untied", (1, 1), "chimera", 2, 6, 12, ("full", ())),
]


def test_chunked_schedules_equal_the_reference(tmp_path):
    plans = []
    for name, groups, schedule, stages, m, _n, *rest in CASES:
        plans.append(chunked_plan(model_of(name), groups, schedule, stages, m, m * max(groups), *rest))
    by_world: dict[int, list[int]] = {}
    for i, (_, groups, *_) in enumerate(CASES):
        by_world.setdefault(sum(groups), []).append(i)
    for world, idx in by_world.items():
        per_rank = run_ranks(world, _many, ([(CASES[i][0], plans[i].to_json(), CASES[i][5]) for i in idx],), tmp_path)
        for j, i in enumerate(idx):
            case, plan = CASES[i], plans[i]
            schedule = plan.build_schedule()
            sim = simulate_ranks(schedule, [StageCosts(1.0, 2.0) for _ in range(plan.num_stages)], record=False)
            everything = {
                n for n, _ in PipelineModule(model_of(case[0])).materialize().named_parameters(remove_duplicate=False)
            }
            names = set()
            results = [res[j] for res in per_rank]
            for r in results:
                assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5), case
                assert r["worst_grad_rel"] < 1e-4, case
                assert r["saved_peak"] == sim.peak_in_flight[r["group"]], case
                names |= set(r["names"])
            assert names == everything, case
            rows, m = case[5], case[4]
            if rows % m == 0 and all((rows // m) % g == 0 for g in case[1]):  # every micro-batch alike
                # the bytes each rank kept at once, exactly as the simulator charges them: each
                # stage's one-forward bytes per micro-batch in flight, from F to its B or W (less what
                # I frees, where the backward is split)
                split = case[2] in ("interleaved_zb", "zbv")
                per_stage = {}
                for r in results:
                    per_stage.update({int(k): v for k, v in r["one_forward_bytes"].items()})
                assert not split or per_stage[plan.num_stages - 1][1] > 0, case  # the loss's input goes at I
                costs = [
                    StageCosts(
                        1.0,
                        2.0,
                        activation_bytes=float(per_stage[s][0]),
                        input_only_bytes=float(per_stage[s][1]) if split else 0.0,
                        recompute_bytes=float(per_stage[s][2]),
                    )
                    for s in range(plan.num_stages)
                ]
                assert not plan.recomputes or any(per_stage[s][2] > 0 for s in per_stage), case
                peaks = simulate_ranks(schedule, costs, record=False).peak_activation_bytes
                for r in results:
                    assert r["saved_bytes"] == peaks[r["group"]], (case, r["group"])
