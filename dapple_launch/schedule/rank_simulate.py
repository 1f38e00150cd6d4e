"""The simulator of rank orders: steps + per-stage costs -> iteration time, per-rank memory, timeline.

Semantics are simulate.py's, with ranks holding several stages: a rank computes one step at a time
in its order; a step waits for its input (the previous stage's forward, the next stage's backward);
an input produced on the same rank is handed over locally at no cost, one from another rank comes
over the directed link between the two ranks, a serial resource that only the sender's steps use,
in its order. A rank's saved activations are those of its micro-batches in flight on any of its
stages (F saves the stage's activation bytes, B or W frees them: the weight gradients need them).
A stage's gradient all-reduce starts when its last backward has ended on every rank holding it
(Chimera: both pipelines' copies) and occupies each of those ranks' all-reduce queue, in the
order the stages become ready, overlapping whatever compute is left.
"""

from __future__ import annotations

import math

from .actions import CODE_OF, COMPUTE_CODES, Kind
from .ranks import RankSchedule
from .simulate import Event, Simulation, StageCosts
from .validate import ScheduleError

_LABEL = {Kind.FORWARD: "forward", Kind.BACKWARD: "backward", Kind.INPUT_GRAD: "input", Kind.WEIGHT_GRAD: "weight"}


def simulate_ranks(
    schedule: RankSchedule, costs: list[StageCosts], record: bool = True, cutoff: float = math.inf
) -> Simulation | None:
    """Per-rank figures: stage_end_s, peak_in_flight and peak_activation_bytes are indexed by rank.
    Timeline events carry the rank as their row (Event.stage) and label steps "F3" on the rank's
    only stage or "F3·s5" where a rank holds several. Raises ScheduleError where the orders
    deadlock (rank_validate.validate_ranks says which rule a schedule breaks).

    `cutoff`: a caller that keeps the simulation only if the iteration is at most this long (a
    planner's candidate against the best so far). The walk stops and returns None as soon as one
    rank's compute plus the time it has waited passes it: that rank cannot end sooner."""
    S, M, R = schedule.num_stages, schedule.num_micro_batches, schedule.num_ranks
    if len(costs) != S:
        raise ValueError(f"simulate_ranks: {S} stages but {len(costs)} stage costs")
    forward, backward, input_, weight = step_costs(costs)
    slack = None  # per rank: cutoff - its compute
    if cutoff < math.inf:
        slack = [cutoff - busy for busy in rank_compute_s(schedule, costs)]
        if min(slack) < 0:  # (a rank's compute alone passes it: not walked at all)
            return None
    send_up, send_down = [c.send_activation_s for c in costs], [c.send_gradient_s for c in costs]
    kept = [c.activation_bytes for c in costs]
    early = [c.input_only_bytes for c in costs]  # freed at I (StageCosts.input_only_bytes), the rest at W
    several = [len(schedule.stages_of(r)) > 1 for r in range(R)]
    where = schedule.route_table  # [stage][micro-batch] -> the rank that runs it
    missing = -1.0
    activation = [[missing] * M for _ in range(S)]  # [stage][micro-batch] -> its input available on its rank
    activation[0] = [0.0] * M
    gradient = [[missing] * M for _ in range(S)]
    link = [[0.0] * R for _ in range(R)]  # [from rank][to rank] -> when the link is next free
    # per rank, what a run leaves for its next one (one list: a rank of copies runs a step or two
    # before it waits, so fetching these one by one cost as much as the steps): steps done, clock,
    # time waited, activation bytes held and their peak, micro-batches in flight and their peak
    runs = [[0, 0.0, 0.0, 0.0, 0.0, 0, 0] for _ in range(R)]
    last_backward = [0.0] * S
    timeline: list[Event] = []
    last = S - 1
    again = [c.recompute_bytes + c.workspace_bytes for c in costs]  # held during a backward
    ws = [c.workspace_bytes for c in costs]  # held during any compute action
    codes = schedule.encoded_orders  # (kind code as actions.CODE_OF, stage, micro-batch) per step
    pending = list(range(R - 1, -1, -1))
    while pending:
        r = pending.pop()
        run = runs[r]
        k, t, idle, held, held_peak, count, count_peak = run
        order = codes[r]
        n = len(order)
        if k == n:
            continue
        links = link[r]
        woken = (
            set()
        )  # the ranks this run sent to: resumed once it stops (the walk's result does not depend on the order)
        while k < n:
            code, s, m = order[k]
            start = t
            if code == 0:  # forward
                arrival = activation[s][m]
                if arrival < 0:
                    break
                if arrival > t:
                    start = arrival
                    idle += arrival - t
                t = start + forward[s]
                if s < last:
                    to = where[s + 1][m]
                    if to == r:  # a local hand-off between two of the rank's stages
                        activation[s + 1][m] = t
                    else:
                        free = links[to]
                        activation[s + 1][m] = links[to] = (t if t > free else free) + send_up[s]
                        woken.add(to)
                held += kept[s]
                count += 1
                if count > count_peak:
                    count_peak = count
                if held + ws[s] > held_peak:
                    held_peak = held + ws[s]
            elif code == 3:  # weight gradient: local
                t += weight[s]
            else:  # backward or input gradient: waits for the gradient from the next stage
                if s < last:
                    arrival = gradient[s][m]
                    if arrival < 0:
                        break
                    if arrival > t:
                        start = arrival
                        idle += arrival - t
                t = start + (backward[s] if code == 1 else input_[s])
                if held + again[s] > held_peak:
                    held_peak = held + again[s]
                if code == 2:
                    held -= early[s]
                if s > 0:
                    to = where[s - 1][m]
                    if to == r:
                        gradient[s - 1][m] = t
                    else:
                        free = links[to]
                        gradient[s - 1][m] = links[to] = (t if t > free else free) + send_down[s]
                        woken.add(to)
            if code & 1:  # B or W: the micro-batch's last step on this stage frees what it saved
                if code == 3 and held + ws[s] > held_peak:
                    held_peak = held + ws[s]
                held -= kept[s] - early[s] if code == 3 else kept[s]
                count -= 1
                if t > last_backward[s]:
                    last_backward[s] = t
            if record:
                kind = COMPUTE_CODES[code]
                timeline.append(Event(r, f"{kind.value}{m}" + (f"·s{s}" if several[r] else ""), _LABEL[kind], start, t))
            k += 1
        if slack is not None and idle > slack[r]:
            return None
        run[:] = k, t, idle, held, held_peak, count, count_peak
        pending.extend(woken)
    blocked = {r: run[0] for r, run in enumerate(runs) if run[0] < len(codes[r])}
    if blocked:
        raise ScheduleError(
            f"schedule {schedule.name!r} deadlocks: ranks {sorted(blocked)} wait for inputs that "
            f"are never produced (blocked step marked)\n{schedule.grid(blocked)}"
        )
    # all-reduces: each stage once its last backward ended everywhere, queued per rank in ready order
    queue = [0.0] * R
    split = {s for tally in schedule.work for code, s, _ in tally if code == CODE_OF[Kind.WEIGHT_GRAD]}  # ends on a W
    for s in sorted(range(S), key=lambda s: (last_backward[s], s)):
        if costs[s].allreduce_s <= 0:
            continue
        ranks = schedule.placement[s]
        end = costs[s].allreduce_end_s(last_backward[s], max(queue[r] for r in ranks), s in split)
        for r in ranks:
            queue[r] = end
        if record:  # the buckets' span, which begins during the last backward where it overlaps
            timeline += [
                Event(r, f"AR·s{s}" if several[r] else "AR", "allreduce", end - costs[s].allreduce_s, end)
                for r in ranks
            ]
    ends = [max(run[1], q) for run, q in zip(runs, queue)]
    return Simulation(
        iteration_s=max(ends),
        stage_end_s=ends,
        peak_in_flight=[run[6] for run in runs],
        peak_activation_bytes=[run[4] for run in runs],
        timeline=timeline,
    )


def step_costs(costs: list[StageCosts]) -> tuple[list[float], ...]:
    """Per kind code (actions.CODE_OF: F, B, I, W), each stage's step as the simulator charges it."""
    return (
        [c.forward_s + c.action_s for c in costs],
        [c.backward_s + c.action_s for c in costs],
        [c.input_s + c.action_s for c in costs],
        [c.weight_s + c.action_s for c in costs],
    )


def rank_compute_s(schedule: RankSchedule, costs: list[StageCosts]) -> list[float]:
    """Each rank's compute, each step at the cost the simulator charges it. O(steps' distinct
    (kind, stage) per rank)."""
    per_code = step_costs(costs)
    return [sum(per_code[code][s] * n for code, s, n in work) for work in schedule.work]


def busiest_rank_s(schedule: RankSchedule, costs: list[StageCosts]) -> float:
    """A lower bound on simulate_ranks' iteration time: the busiest rank's compute (a rank runs one
    step at a time, so no order finishes sooner): what lets a search drop a candidate unsimulated."""
    return max(rank_compute_s(schedule, costs), default=0.0)
