"""Several gloo processes: the runtime's real point-to-point issue order, recorded, passes the NCCL
model (schedule/nccl.py) for every family — and the pipelined loss and every gradient still equal
the single-process reference.

Each case runs the numerics tests' own worker under tests/p2p_recorder.py: every
`torch.distributed` point-to-point call and every wait on its work is written down as it happened
and replayed under NCCL's rules (tags ignored, one ordered stream per communicator, a send that may
wait for its receive, a group that progresses together, an op after a wait ordered after it); and
it is the very program schedule/nccl.py's `lowered_programs` proves for the iteration (the same
groups of the same transfers, in order, with the same waits), so the proof is of what runs. The
run itself is the strict mode: every transfer of a rank pair goes on that pair's own group with tag
0, so gloo matches them strictly in order, as NCCL does (asserted below): equal numerics then prove
nothing was delivered into the wrong buffer.
"""

from __future__ import annotations

import importlib

import pytest

from dapple_launch.schedule.nccl import check

from .multiproc import run_ranks
from .p2p_recorder import Recorder, as_lowered, to_model
from .test_chunked_numerics import chunked_plan, model_of
from .test_pipeline_numerics import make_plan, tiny_model
from .test_round_robin_numerics import rr_plan

pytestmark = pytest.mark.multiprocess


def _recorded(rank, world, cases):
    out = []
    for module, fn, args in cases:
        rec = Recorder()
        with rec.patched():
            result = getattr(importlib.import_module(module), fn)(rank, world, *args)
        out.append({"result": result, "items": rec.items})
    return out


def _eval(rank, world, plan_json, batch_n, chunked):
    """A forward-only (validation) pass through the runtime: its loss equals the reference's."""
    import torch
    import torch.distributed as dist

    from dapple_launch.planner import Plan
    from dapple_launch.runtime.executor import StageExecutor
    from dapple_launch.runtime.grid import ProcessGrid
    from dapple_launch.runtime.module import PipelineModule
    from dapple_launch.runtime.p2p import PointToPoint
    from dapple_launch.runtime.precision import MixedPrecision
    from dapple_launch.runtime.rank_executor import build_rank_executor
    from dapple_launch.schedule import forward_only
    from dapple_launch.schedule.ranks import forward_only_orders

    from .rank_batches import rank_batch

    plan = Plan.from_json(plan_json)
    model = model_of("gpt")
    grid = ProcessGrid.from_plan(plan)
    batch = model.batch(batch_n, torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref_loss = PipelineModule(model).materialize().reference_loss(batch).item()
    local_stages = grid.stages_at(rank)
    indices = [i for s in local_stages for i in range(*plan.stages[s].layers)]
    local = PipelineModule(model).materialize(indices)
    groups = {s: dist.new_group(grid.stage_ranks(s)) for s in range(grid.num_stages)}
    with torch.no_grad():
        if chunked:
            ex, _ = build_rank_executor(
                plan,
                grid,
                rank,
                {i: local.layers[str(i)] for i in indices},
                model.loss,
                groups,
                precision=MixedPrecision("32"),
            )
            x = plan.build_schedule()
            schedule = forward_only_orders(x.placement, x.num_ranks, plan.num_micro_batches)
            result = ex.run(schedule, rank_batch(plan, rank, batch, schedule))
        else:
            stage, replica = grid.position(rank)
            ex = StageExecutor(local.local_stack(), model.loss, PointToPoint(grid, stage, replica), grid.num_stages)
            schedule = forward_only(grid.num_stages, plan.num_micro_batches)
            result = ex.run(schedule, rank_batch(plan, rank, batch, schedule))
    loss = result.loss_sum.clone()
    dist.all_reduce(loss)
    return {"loss": loss.item(), "ref_loss": ref_loss}


PIPE = "tests.test_pipeline_numerics"
CHUNKED = "tests.test_chunked_numerics"


def _pipeline(replicas, schedule, m, n, **limits):
    plan = make_plan(tiny_model(), replicas, schedule, m, m * max(replicas), **limits)
    return (PIPE, "_compare", ("gpt", replicas, plan.schedule, m, n, plan.to_json())), sum(replicas)


def _chunked(groups, schedule, stages, m, n, name="gpt"):
    plan = chunked_plan(model_of(name), groups, schedule, stages, m, m * max(groups))
    return (CHUNKED, "_compare", (name, plan.to_json(), n)), sum(groups)


def _copies(replicas, copies, schedule, m, n):
    plan = rr_plan(model_of("gpt"), replicas, copies, schedule, m, m * max(r // c for r, c in zip(replicas, copies)))
    return (CHUNKED, "_compare", ("gpt", plan.to_json(), n)), sum(replicas)


def _evaluation(groups, schedule, stages, m, n):
    chunked = stages > len(groups)
    plan = (
        chunked_plan(model_of("gpt"), groups, schedule, stages, m, m * max(groups))
        if chunked
        else make_plan(model_of("gpt"), groups, schedule, m, m * max(groups))
    )
    return ("tests.test_recorded_order", "_eval", (plan.to_json(), n, chunked)), sum(groups)


# the issue's thirteen family/layout cases that all deadlocked under the old discipline, and more
# (built when the test runs, not at collection: each plans a model)
def _cases() -> dict:
    return {
        "1f1b 2x1": _pipeline((1, 1), "1f1b", 4, 9),
        "1f1b 2x2": _pipeline((2, 2), "1f1b", 2, 8),
        "1f1b 3:1": _pipeline((3, 1), "1f1b", 2, 7),
        "gpipe 4 stages": _pipeline((1, 1, 1, 1), "gpipe", 6, 13),
        "zb_h1 4 stages": _pipeline((1, 1, 1, 1), "zb_h1", 9, 19),
        "zb_h1 2:1:1": _pipeline((2, 1, 1), "zb_h1", 5, 11),
        "token slices 2:1:1": _pipeline((2, 1, 1), "gpipe", 2, 5, token_slices=(2, 6)),
        "token slices 4 stages": _pipeline((1, 1, 1, 1), "gpipe", 3, 6, token_slices=(4, 2, 2)),
        "interleaved_1f1b 4 groups": _chunked((1, 1, 1, 1), "interleaved_1f1b", 8, 4, 8),
        "interleaved_1f1b 3:1": _chunked((3, 1), "interleaved_1f1b", 4, 4, 13),
        "interleaved_zb 2 groups": _chunked((1, 1), "interleaved_zb", 4, 4, 8, "skipnet"),
        "interleaved_zb 2:1:1": _chunked((2, 1, 1), "interleaved_zb", 6, 3, 7),
        "zbv 2 groups": _chunked((1, 1), "zbv", 4, 4, 8),
        "zbv 4 groups": _chunked((1, 1, 1, 1), "zbv", 8, 4, 9),
        "zbv 1:2:1": _chunked((1, 2, 1), "zbv", 6, 4, 9),
        "chimera D4": _chunked((1, 1, 1, 1), "chimera", 4, 4, 9),
        "chimera 2x2": _chunked((2, 2), "chimera", 2, 4, 9),
        "copies 2x2 zb_h1_rr": _copies((2, 2), (1, 2), "zb_h1_rr", 4, 8),
        "copies 2:1 1f1b_rr": _copies((2, 1), (2, 1), "1f1b_rr", 4, 4),
        "eval 1f1b 2:1:1": _evaluation((2, 1, 1), "1f1b", 3, 3, 7),
        "eval zbv 2 groups": _evaluation((1, 1), "zbv", 4, 4, 8),
    }


def test_every_familys_recorded_issue_order_passes_the_nccl_model_and_equals_the_reference(tmp_path):
    cases = _cases()
    by_world: dict[int, list[str]] = {}
    for name, (_, world) in cases.items():
        by_world.setdefault(world, []).append(name)
    for world, names in by_world.items():
        per_rank = run_ranks(world, _recorded, ([cases[n][0] for n in names],), tmp_path)
        for j, name in enumerate(names):
            runs = [per_rank[r][j] for r in range(world)]
            for run in runs:
                r = run["result"]
                assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5), name
                assert r.get("worst_grad_rel", 0.0) < 1e-4, name
            issues = [item for run in runs for item in run["items"] if item[0] == "issue"]
            assert issues, name  # something crossed between ranks
            for _, channel, ops in issues:  # the strict mode: a pair's own group, tag 0, one op per member
                assert channel[0] == "group" and len(channel[1]) == 2, (name, channel)
                assert all(tag == 0 for *_, tag in ops), (name, ops)
            programs = {r: to_model(runs[r]["items"], r) for r in range(world)}
            sends = sum(1 for _, _, ops in issues for op in ops if op[1])
            assert check(programs) == sends, name  # every send matched, nothing hangs, nothing swapped
            for r in range(world):  # and what ran is what schedule/nccl.py proved: the same groups, waits
                _is_the_lowered_program(name, r, runs[r]["items"])


def _is_the_lowered_program(name: str, rank: int, items: list) -> None:
    """The rank's recorded groups are those `lowered_programs` makes of the programs it began (one
    per slot and peer, the same transfers in the same order), and before each group it waited for
    what the lowered program waits for: every receive's group exactly; a send's only if it was not
    already seen complete."""
    recorded, lowered = as_lowered(items, rank)
    assert [seg[:2] for seg in recorded] == [seg[:2] for seg in lowered], (name, rank)
    for i, ((_, _, got), (_, _, want)) in enumerate(zip(recorded, lowered)):
        receiving = {k for k in want if any(not send for _, send, _ in lowered[k + 1][1])}
        assert receiving <= got <= want, (name, rank, i, got, want)


def test_the_recorder_sees_a_swap_the_model_refuses(tmp_path):
    """The recorder and the model together catch what gloo forgives: two ranks that issue a pair's
    two transfers in opposite orders (each a valid send and receive on its own)."""
    out = run_ranks(2, _recorded, ([("tests.test_recorded_order", "_swapped", ())],), tmp_path)
    programs = {r: to_model(out[r][0]["items"], r) for r in range(2)}
    from dapple_launch.schedule.nccl import NcclOrderError

    with pytest.raises(NcclOrderError, match="hang"):
        check(programs)


def _swapped(rank, world):
    """Rank 0 sends x then receives y; rank 1 sends y then receives x, each as separate groups: gloo
    completes it (its sends are buffered), NCCL may not (each send waits for its receive)."""
    import torch
    import torch.distributed as dist

    group = dist.new_group([0, 1])
    x = torch.ones(4)
    peer = 1 - rank
    first = dist.batch_isend_irecv([dist.P2POp(dist.isend, x.clone(), peer, group)])
    second = dist.batch_isend_irecv([dist.P2POp(dist.irecv, torch.empty(4), peer, group)])
    for w in first + second:
        w.wait()
    return {"loss": 1.0, "ref_loss": 1.0}
