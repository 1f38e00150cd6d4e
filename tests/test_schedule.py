"""Pure tier: schedules as data, their validator and their simulator."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dapple_launch.schedule import (
    Action,
    Kind,
    Schedule,
    ScheduleError,
    StageCosts,
    forward_only,
    gpipe,
    one_f_one_b,
    simulate,
    validate,
    zb_h1,
)


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("micro_batches", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("make", [gpipe, one_f_one_b, forward_only, zb_h1])
def test_generated_schedules_are_valid(make, stages, micro_batches):
    validate(make(stages, micro_batches))


def _break(schedule: Schedule, stage: int, actions) -> Schedule:
    lists = list(schedule.stage_actions)
    lists[stage] = tuple(actions)
    return Schedule(schedule.name, schedule.num_stages, schedule.num_micro_batches, tuple(lists))


def test_backward_before_forward_is_rejected_with_grid():
    s = one_f_one_b(2, 2)
    acts = list(s.stage_actions[1])
    f0 = acts.index(Action(Kind.FORWARD, 0))
    b0 = acts.index(Action(Kind.BACKWARD, 0))
    acts[f0], acts[b0] = acts[b0], acts[f0]
    with pytest.raises(ScheduleError) as e:
        validate(_break(s, 1, acts))
    assert "backward 0 runs before forward 0" in str(e.value)
    assert ">B0<" in str(e.value) and "stage 1:" in str(e.value)


def test_missing_receive_is_rejected():
    s = gpipe(2, 2)
    acts = [a for a in s.stage_actions[1] if a != Action(Kind.RECV_ACTIVATION, 1)]
    with pytest.raises(ScheduleError, match="before its activation is received"):
        validate(_break(s, 1, acts))


def test_unmatched_send_is_rejected():
    s = gpipe(2, 1)
    acts = list(s.stage_actions[0]) + [Action(Kind.SEND_ACTIVATION, 0)]
    with pytest.raises(ScheduleError, match="appears twice"):
        validate(_break(s, 0, acts))


def test_deadlock_is_detected_and_marked():
    # Stage 0 waits for gradient 1 before sending activation 1: both stages wait forever.
    s = one_f_one_b(2, 2)
    acts = [
        Action(Kind.FORWARD, 0),
        Action(Kind.SEND_ACTIVATION, 0),
        Action(Kind.RECV_GRADIENT, 1),
        Action(Kind.FORWARD, 1),
        Action(Kind.RECV_GRADIENT, 0),
        Action(Kind.BACKWARD, 0),
        Action(Kind.SEND_ACTIVATION, 1),
        Action(Kind.BACKWARD, 1),
    ]
    with pytest.raises(ScheduleError) as e:
        validate(_break(s, 0, acts))
    assert "deadlocks" in str(e.value) and ">RG1<" in str(e.value)


def test_missing_forward_is_rejected():
    s = gpipe(1, 2)
    with pytest.raises(ScheduleError, match="forward 1 never runs"):
        validate(_break(s, 0, [Action(Kind.FORWARD, 0), Action(Kind.BACKWARD, 0)]))


@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (4, 4), (4, 8), (4, 16), (3, 7)])
def test_uniform_pipeline_time_and_memory(stages, micro_batches):
    costs = [StageCosts(1.0, 2.0, activation_bytes=10.0)] * stages
    for make in (gpipe, one_f_one_b):
        sim = simulate(make(stages, micro_batches), costs)
        assert sim.iteration_s == pytest.approx((micro_batches + stages - 1) * 3.0)
    one = simulate(one_f_one_b(stages, micro_batches), costs)
    pipe = simulate(gpipe(stages, micro_batches), costs)
    assert one.peak_in_flight == [min(stages - s, micro_batches) for s in range(stages)]
    assert pipe.peak_in_flight == [micro_batches] * stages
    # DAPPLE's claim: the first stage holds stages/micro-batches of what GPipe holds.
    assert one.peak_activation_bytes[0] <= pipe.peak_activation_bytes[0] * stages / micro_batches


def test_allreduce_overlaps_later_stages_backward():
    costs = [StageCosts(1, 1, allreduce_s=1.5), StageCosts(1, 1, allreduce_s=0.0)]
    sim = simulate(one_f_one_b(2, 1), costs)
    # stage 1 ends its backward at 3, stage 0 at 4; stage 0's all-reduce then runs 4 -> 5.5
    assert sim.iteration_s == pytest.approx(5.5)
    assert [e.kind for e in sim.timeline if e.stage == 0][-1] == "allreduce"


def test_communication_delays_the_receiver():
    costs = [StageCosts(1, 1, send_activation_s=0.5), StageCosts(1, 1, send_gradient_s=0.5)]
    assert simulate(gpipe(2, 1), costs).iteration_s == pytest.approx(5.0)


def test_deeper_warmup_keeps_a_multiple_of_dapples_in_flight_count():
    from dapple_launch.schedule.one_f_one_b import deeper_warmup

    assert deeper_warmup(4, 16, 1) == (3, 2, 1, 0)  # DAPPLE's minimum: S - s - 1
    assert deeper_warmup(4, 16, 2) == (7, 5, 3, 0)  # twice the in-flight micro-batches, the last stage as before
    assert deeper_warmup(4, 6, 3) == (5, 5, 5, 0)  # capped: at most every micro-batch in flight
    for depth in (1, 2, 3):
        s = one_f_one_b(4, 16, deeper_warmup(4, 16, depth))
        validate(s)
        peak = simulate(s, [StageCosts(1.0, 2.0, 0.3, 0.3)] * 4).peak_in_flight
        assert peak == [min(16, w + 1) for w in deeper_warmup(4, 16, depth)]


def test_a_deeper_warmup_hides_a_slow_link_on_the_steady_cycle():
    """With transfers as long as a forward, DAPPLE's minimal warm-up leaves each stage waiting for
    the gradient's round trip; twice the in-flight micro-batches keep it busy (less idle time)."""
    from dapple_launch.schedule.one_f_one_b import deeper_warmup

    costs = [StageCosts(1.0, 2.0, 1.0, 1.0 if s else 0.0) for s in range(4)]
    costs[-1] = StageCosts(1.0, 2.0, 0.0, 1.0)
    minimal = simulate(one_f_one_b(4, 16), costs).iteration_s
    deeper = simulate(one_f_one_b(4, 16, deeper_warmup(4, 16, 2)), costs).iteration_s
    assert deeper < 0.9 * minimal


@pytest.mark.parametrize(
    "warmup,rule",
    [
        ((1, 2, 0), "never fewer than the next stage"),
        ((1, 1, 0), "between min(S - s - 1, M) and M"),
        ((9, 1, 0), "between min(S - s - 1, M) and M"),
    ],
)
def test_an_invalid_warmup_is_refused_with_the_rule(warmup, rule):
    with pytest.raises(ValueError, match=r"1F1B warm-up .* is not valid for 3 stages and 8 micro-batches") as e:
        one_f_one_b(3, 8, warmup)
    assert rule in str(e.value) and "[2, 1, 0]" in str(e.value)


@pytest.mark.parametrize("seed", range(4))
def test_the_planners_iteration_time_equals_the_simulator(seed):
    """simulate.iteration_time (the planner's inner loop: compute orders only, communication implied)
    gives exactly the simulator's time on the full schedule: GPipe, ZB-H1 and 1F1B at every warm-up depth,
    slow links, all-reduces, fewer micro-batches than stages."""
    import random

    from dapple_launch.schedule.one_f_one_b import deeper_warmup
    from dapple_launch.schedule.simulate import iteration_time

    rng = random.Random(seed)
    for _ in range(60):
        S, M = rng.randint(1, 7), rng.randint(1, 14)
        sends = [rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(S - 1)] + [0.0]
        costs = [
            StageCosts(
                rng.uniform(0.1, 2),
                rng.uniform(0.1, 3),
                sends[s],
                sends[s - 1] if s else 0.0,
                rng.choice([0.0, rng.uniform(0, 5)]),
            )
            for s in range(S)
        ]
        costs = [replace(c, weight_grad_s=rng.choice([None, c.backward_s * rng.uniform(0, 1)])) for c in costs]
        costs = [
            replace(
                c, allreduce_after_b_s=rng.uniform(0, c.allreduce_s), allreduce_after_w_s=rng.uniform(0, c.allreduce_s)
            )
            if rng.random() < 0.5
            else c
            for c in costs
        ]  # buckets overlapping the last B or W
        schedules = [gpipe(S, M), zb_h1(S, M)] + [one_f_one_b(S, M, deeper_warmup(S, M, d)) for d in (1, 2, 3)]
        for schedule in schedules:
            compute = [[a for a in actions if a.kind.is_compute] for actions in schedule.stage_actions]
            assert iteration_time(compute, costs, M) == pytest.approx(simulate(schedule, costs).iteration_s, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_a_cutoff_stops_only_a_candidate_slower_than_it(seed):
    """orders_time(cutoff): the planner's callers keep a candidate only if it beats the cutoff. Below
    the cutoff the time is exact; above it the walk may stop early (inf), never on a faster candidate;
    and a cutoff well below the time does stop it (the bound, compute plus waiting, is not vacuous)."""
    import math
    import random

    from dapple_launch.schedule.simulate import encode_orders, orders_time

    rng = random.Random(seed)
    stopped = 0
    for _ in range(80):
        S, M = rng.randint(1, 6), rng.randint(1, 12)
        sends = [rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(S - 1)] + [0.0]
        costs = [
            StageCosts(
                rng.uniform(0.1, 2),
                rng.uniform(0.1, 3),
                sends[s],
                sends[s - 1] if s else 0.0,
                rng.choice([0.0, rng.uniform(0, 5)]),
            )
            for s in range(S)
        ]
        for schedule in (gpipe(S, M), zb_h1(S, M), one_f_one_b(S, M)):
            orders = encode_orders([[a for a in actions if a.kind.is_compute] for actions in schedule.stage_actions])
            exact = orders_time(orders, costs, M)
            busiest = max(M * (c.forward_s + c.backward_s) for c in costs)
            for cutoff in (exact * 1.0001, exact * rng.uniform(1, 2), exact * rng.uniform(0.3, 1), exact * 0.9999):
                got = orders_time(orders, costs, M, cutoff)
                assert got == exact or (got == math.inf and exact > cutoff), (exact, cutoff, got)
                stopped += got == math.inf and cutoff > busiest  # stopped by a stage's waiting, mid-walk
            assert orders_time(orders, costs, M, busiest * 0.999) == math.inf  # below one stage's compute
    assert stopped > 10


def test_deeper_warmup_with_fewer_micro_batches_than_stages_is_a_valid_schedule():
    from dapple_launch.schedule.one_f_one_b import deeper_warmup

    for depth in (1, 2, 4):
        validate(one_f_one_b(5, 2, deeper_warmup(5, 2, depth)))  # every stage but the last: all forwards first


def test_receives_out_of_send_order_are_rejected_by_validator_and_simulator():
    """Stage 1 receives (and runs) micro-batch 1 before 0 while stage 0 sends 0 first: two ranks
    match their transfers in order, so the runtime could not run it; neither is there a time."""
    s = gpipe(2, 2)
    acts = list(s.stage_actions[1])
    ra0, ra1 = acts.index(Action(Kind.RECV_ACTIVATION, 0)), acts.index(Action(Kind.RECV_ACTIVATION, 1))
    f0, f1 = acts.index(Action(Kind.FORWARD, 0)), acts.index(Action(Kind.FORWARD, 1))
    acts[ra0], acts[ra1], acts[f0], acts[f1] = acts[ra1], acts[ra0], acts[f1], acts[f0]
    bad = _break(s, 1, acts)
    with pytest.raises(ScheduleError) as e:
        validate(bad)
    assert "receives activation 1 from stage 0, which sends activation 0 before it" in str(e.value)
    assert ">RA1<" in str(e.value)
    with pytest.raises(ScheduleError):
        simulate(bad, [StageCosts(1.0, 1.0)] * 2)


def reversed_backwards(stages: int, micro_batches: int) -> Schedule:
    """GPipe whose every stage runs its backwards last micro-batch first: a hand-made order whose
    transfers are still received in the order they are sent (the runtime test runs it)."""
    from dapple_launch.schedule.actions import with_communication

    compute = [
        [Action(Kind.FORWARD, m) for m in range(micro_batches)]
        + [Action(Kind.BACKWARD, m) for m in reversed(range(micro_batches))]
        for _ in range(stages)
    ]
    return with_communication("reversed-gpipe", compute, micro_batches)


def test_a_hand_made_order_that_keeps_transfers_in_order_is_valid():
    validate(reversed_backwards(3, 4))
    assert simulate(reversed_backwards(3, 4), [StageCosts(1.0, 2.0)] * 3).iteration_s == pytest.approx(
        simulate(gpipe(3, 4), [StageCosts(1.0, 2.0)] * 3).iteration_s
    )


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb_h1", "interleaved_1f1b", "zbv", "chimera"])
def test_the_runtimes_cost_per_action_is_paid_once_by_every_compute_action(name):
    """StageCosts.action_s (the runtime's own time per F, B, I or W; Topology.action_overhead_s): every
    simulator (the planner's orders_time, the full simulator, the rank-order simulator) times it as
    that much more on each compute action: F and a whole B once each, a split backward's I and W once
    each (so twice per micro-batch)."""
    import random

    from dapple_launch.schedule import SPLIT_BACKWARD, build_rank_schedule, build_schedule
    from dapple_launch.schedule.rank_simulate import simulate_ranks
    from dapple_launch.schedule.simulate import encode_orders, orders_time

    rng = random.Random(name)
    split = name in SPLIT_BACKWARD
    for _ in range(10):
        P, a = rng.choice([2, 4]), rng.uniform(0.01, 0.5)
        chunks = 2 if name in ("interleaved_1f1b", "zbv") else 1
        S = P * chunks
        M = P * rng.randint(1, 3)
        costs = [
            StageCosts(
                rng.uniform(0.1, 2),
                rng.uniform(0.1, 3),
                rng.uniform(0, 0.3),
                rng.uniform(0, 0.3),
                rng.choice([0.0, rng.uniform(0, 2)]),
                weight_grad_s=rng.choice([None, 0.4]),
            )
            for _ in range(S)
        ]
        paid = [replace(c, action_s=a) for c in costs]
        folded = [
            replace(
                c,
                forward_s=c.forward_s + a,
                backward_s=c.backward_s + (2 * a if split else a),
                weight_grad_s=(c.weight_s + a) if split else c.weight_grad_s,
            )
            for c in costs
        ]
        ranks = build_rank_schedule(name, P, M, chunks)
        assert simulate_ranks(ranks, paid, record=False).iteration_s == pytest.approx(
            simulate_ranks(ranks, folded, record=False).iteration_s, rel=1e-12
        )
        if name in ("gpipe", "1f1b", "zb_h1"):
            schedule = build_schedule(name, S, M)
            orders = encode_orders([[x for x in acts if x.kind.is_compute] for acts in schedule.stage_actions])
            want = simulate(schedule, folded).iteration_s
            assert simulate(schedule, paid).iteration_s == pytest.approx(want, rel=1e-12)
            assert orders_time(orders, paid, M) == pytest.approx(want, rel=1e-12)
            assert want > simulate(schedule, costs).iteration_s
