"""Transfers under NCCL's point-to-point rules (schedule/nccl.py's model, schedule/transfers.py's lowering).

Pure: the model refuses what hangs or mismatches on NCCL (and the runtime's old discipline), and
every family's lowered programs pass it over a sweep of layouts. Several gloo processes: the
runtime's real issue order — every torch.distributed point-to-point call, recorded with its groups
and waits — passes the model for every family, while loss and every gradient equal the
single-process reference with each pair's traffic on one group and one tag (gloo then matches in
order, as NCCL does).
"""

from __future__ import annotations

import itertools

import pytest

from dapple_launch.schedule import build_rank_schedule, build_schedule, from_stages
from dapple_launch.schedule.nccl import Issue, NcclOrderError, Op, Wait, check, check_lowered, lowered_programs
from dapple_launch.schedule.one_f_one_b import deeper_warmup
from dapple_launch.schedule.ranks import forward_only_orders
from dapple_launch.schedule.round_robin import copy_warmup, round_robin
from dapple_launch.schedule.transfers import lower


def _groups(x, replicas) -> tuple:
    out, r = [], 0
    for g in range(x.num_ranks):
        out.append(tuple(range(r, r + replicas[g])))
        r += replicas[g]
    return tuple(out)


def _programs(x, replicas, rows=8, align=True):
    return lower(x, _groups(x, replicas), (rows,) * x.num_micro_batches, align=align)


# ---- the model itself ------------------------------------------------------------------------------


def test_two_ranks_that_both_send_first_hang_and_are_named():
    a = [Issue("ab", (Op(1, True, "x"),)), Issue("ab", (Op(1, False, "y"),)), Wait(1)]
    b = [Issue("ab", (Op(0, True, "y"),)), Issue("ab", (Op(0, False, "x"),)), Wait(1)]
    with pytest.raises(NcclOrderError, match=r"rank 0 .* rank 1"):
        check({0: a, 1: b})


def test_the_same_transfers_in_one_group_each_progress_together():
    a = [Issue("ab", (Op(1, True, "x"), Op(1, False, "y"))), Wait(0)]
    b = [Issue("ab", (Op(0, True, "y"), Op(0, False, "x"))), Wait(0)]
    assert check({0: a, 1: b}) == 2


def test_two_transfers_swapped_between_the_ends_are_refused_whatever_their_tags():
    a = [Issue("ab", (Op(1, True, "activation 2"),)), Issue("ab", (Op(1, True, "gradient 0"),))]
    b = [Issue("ab", (Op(0, False, "gradient 0"),)), Issue("ab", (Op(0, False, "activation 2"),))]
    with pytest.raises(NcclOrderError, match=r"send #1 to rank 1 is activation 2 but rank 1's receive #1"):
        check({0: a, 1: b})


def test_an_op_issued_after_a_wait_is_ordered_after_it():
    # rank 0 waits for y before it sends x; rank 1 sends y only after it has x: a cycle through the waits
    a = [Issue("ab", (Op(1, False, "y"),)), Wait(0), Issue("ab2", (Op(1, True, "x"),))]
    b = [Issue("ab2", (Op(0, False, "x"),)), Wait(0), Issue("ab", (Op(0, True, "y"),))]
    with pytest.raises(NcclOrderError, match="hang"):
        check({0: a, 1: b})


def test_separate_streams_per_pair_do_not_block_each_other():
    # rank 0 sends to 2 first, then to 1; rank 1 and 2 receive in their own time
    a = [Issue("02", (Op(2, True, "x"),)), Issue("01", (Op(1, True, "y"),))]
    b = [Issue("01", (Op(0, False, "y"),)), Wait(0), Issue("12", (Op(2, True, "z"),))]
    c = [Issue("12", (Op(1, False, "z"),)), Wait(0), Issue("02", (Op(0, False, "x"),)), Wait(1)]
    assert check({0: a, 1: b, 2: c}) == 3


# ---- the lowering, every family ----------------------------------------------------------------------


def _sweep():
    """(name, rank schedule, replicas per device group) over P 2-8, M 1-16: stage families even and
    uneven, chunked, copies, token slices, evaluation."""
    for P, M in itertools.product((2, 3, 4, 8), (1, 2, 3, 5, 8, 16)):
        uneven = [1 + (i * 2 + 1) % 3 for i in range(P)]
        for name in ("1f1b", "gpipe", "zb_h1"):
            x = from_stages(build_schedule(name, P, M))
            yield f"{name} P{P} M{M}", x, [1] * P
            yield f"{name} P{P} M{M} uneven", x, uneven
        for name in ("1f1b", "zb_h1"):  # each stage's own warm-up depth (planner/stage_warmups.py)
            own = deeper_warmup(P, M, tuple(1 + 3 * (s % 2) for s in range(P)))
            yield f"{name} P{P} M{M} own warm-ups", from_stages(build_schedule(name, P, M, own)), uneven
        for name in ("interleaved_1f1b", "interleaved_zb"):
            for v in (2, 3):
                try:
                    x = build_rank_schedule(name, P, M, v)
                except ValueError:
                    continue  # (a micro-batch count the family refuses)
                yield f"{name} P{P} M{M} v{v}", x, uneven
        yield f"zbv P{P} M{M}", build_rank_schedule("zbv", P, M), uneven
        if P % 2 == 0 and M % P == 0:
            yield f"chimera D{P} M{M}", build_rank_schedule("chimera", P, M), [1] * P
        copies = tuple(1 + (s % 2) for s in range(P))
        if max(copies) <= M:
            yield f"1f1b_rr P{P} M{M}", round_robin("1f1b_rr", copies, M), [1] * sum(copies)
            yield f"zb_h1_rr P{P} M{M}", round_robin("zb_h1_rr", copies, M), [1] * sum(copies)
            own = copy_warmup(copies, M, tuple(1 + 3 * (s % 2) for s in range(P)))
            yield f"1f1b_rr P{P} M{M} own warm-ups", round_robin("1f1b_rr", copies, M, own), [1] * sum(copies)
        if M <= 4:
            yield (
                f"terapipe P{P} M{M}",
                from_stages(build_schedule("terapipe", P, M, token_slices=(3, 2, 2, 1))),
                uneven,
            )
        x = build_rank_schedule("zbv", P, M)
        yield f"eval zbv P{P} M{M}", forward_only_orders(x.placement, x.num_ranks, M), [1] * P


SWEEP = list(_sweep())


@pytest.mark.parametrize("name,x,replicas", SWEEP, ids=[c[0] for c in SWEEP])
def test_every_familys_lowered_transfers_pass_the_nccl_model(name, x, replicas):
    programs = _programs(x, replicas, rows=12)
    assert check(lowered_programs(programs)) == sum(len(p.sends) for p in programs.values())  # each matched
    for r, p in programs.items():  # by construction: a send leaves right after the compute that made it
        for c, slot in enumerate(p.slots):
            for t, send in slot:
                if not send:
                    assert any(t in p.needs[u] for u in range(c, len(p.needs))), (name, r, t)


def test_the_old_discipline_is_refused_and_the_new_one_accepted():
    """The runtime's order before this lowering — each transfer at its natural place, receives one
    compute ahead, sends right after — deadlocks under NCCL (the issue's 1F1B on 2 stages), or
    swaps an activation with a gradient (ZB-V): the model sees both."""
    x = from_stages(build_schedule("1f1b", 2, 4))
    with pytest.raises(NcclOrderError, match="hang"):
        check(lowered_programs(_programs(x, [1, 1], align=False)))
    zbv = build_rank_schedule("zbv", 2, 4)
    with pytest.raises(NcclOrderError, match="activation 2 of stage 0->1 .* gradient 0 of stage 3->2"):
        check(lowered_programs(_programs(zbv, [1, 1], align=False)))
    assert check(lowered_programs(_programs(zbv, [1, 1])))


def test_alike_components_are_checked_once_and_still_refused_when_broken():
    x = from_stages(build_schedule("1f1b", 4, 8))
    programs = _programs(x, [64] * 4)  # 64 independent pipelines of 4 ranks
    assert check_lowered(programs) == check(lowered_programs({r: programs[r] for r in (0, 64, 128, 192)}))
    with pytest.raises(NcclOrderError):
        check_lowered(_programs(x, [64] * 4, align=False))


def test_every_plan_is_checked_before_it_runs():
    """A plan's transfers are proven where it is made (plan_config) and again where it runs."""
    from dapple_launch.cluster import Topology
    from dapple_launch.models import build_model
    from dapple_launch.planner import Limits, fixed_plan
    from dapple_launch.profile import analytic_profile

    model = build_model("gpt", "tiny", num_layers=4, hidden=32, heads=2, seq_len=8, vocab_size=40)
    topo = Topology("test", 1, 4, 8e9, 0.05, 1e9, 1e9, device_kind="cpu")
    plan = fixed_plan(analytic_profile(model, 2, topo.device_tflops, "cpu"), topo, 12, 2, [3, 1], 4, Limits())
    plan.check_transfers()
    assert plan.transfer_programs()[3].needs  # the last stage's rank waits for activations
