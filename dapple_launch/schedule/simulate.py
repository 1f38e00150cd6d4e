"""Discrete-event simulator: action lists + costs -> iteration time, timeline, peak memory.

It is the planner's cost of every candidate (orders_time: its inner loop) and the source of the
predicted timeline. Semantics match the runtime: compute on a stage is sequential; a send
does not block its stage but occupies the directed link to the neighbour (links are serial
resources, one per direction); a receive waits for the data's arrival; each stage's gradient
all-reduce starts when its last backward ends and overlaps whatever other stages still do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .actions import CODE_OF, Action, Kind, Schedule
from .validate import execute_order, validate


@dataclass(frozen=True)
class StageCosts:
    forward_s: float  # one micro-batch, this stage's slice
    backward_s: float
    send_activation_s: float = 0.0  # to the next stage, one micro-batch
    send_gradient_s: float = 0.0  # to the previous stage, one micro-batch
    allreduce_s: float = 0.0
    activation_bytes: float = 0.0  # saved per in-flight micro-batch on one device of this stage
    # split backward (I then W): W's share of backward_s; None = half, the rule for profiles that time
    # the backward whole (a matmul's weight gradient costs what its input gradient costs). A micro-batch's
    # activations stay saved until its W (the weight gradients need them) but for input_only_bytes.
    weight_grad_s: float | None = None
    # of activation_bytes, what only the input gradient reads (above every weight: a last stage's loss):
    # freed at I. Profiles time layers, not the loss, so the planner's costs leave it 0 (freed at W).
    input_only_bytes: float = 0.0
    # activation recomputation (runtime/recompute.py): backward_s includes the forward run again;
    # this is what a micro-batch holds above activation_bytes while its backward runs (the
    # recomputed activations of one segment), once per stage at a time
    recompute_bytes: float = 0.0
    # the most one of the stage's layers holds at once beyond its saves during a call (gradients in
    # flight, the loss's log-softmax and its gradient: ModelProfile.workspace), on top of what is
    # live at each of its compute actions
    workspace_bytes: float = 0.0
    # the runtime's own time per compute action (F, B, I or W) on top of its layers': the executor's
    # Python, the autograd engine's call, posting its transfers. A split backward is two actions and
    # pays it twice; a token slice pays it whole (it is a call, not a share of the sequence).
    action_s: float = 0.0
    # the all-reduce in buckets overlapping the stage's last gradient action (planner/allreduce.py):
    # of allreduce_s, what is left once that action ends, when it is a B and when it is a W (shorter,
    # it hides less). None: all of allreduce_s is left (one all-reduce after the action).
    allreduce_after_b_s: float | None = None
    allreduce_after_w_s: float | None = None

    def exposed_allreduce_s(self, split: bool) -> float:
        """What of the all-reduce runs after the stage's last B (`split` False) or last W (True) ends."""
        left = self.allreduce_after_w_s if split else self.allreduce_after_b_s
        return self.allreduce_s if left is None else left

    def allreduce_end_s(self, last_end: float, link_free: float, split: bool) -> float:
        """When the all-reduce ends: after the exposed part once the last gradient action ends at
        `last_end`, and no sooner than the whole of it on a link free from `link_free` (the buckets
        go over it one after another)."""
        return max(link_free + self.allreduce_s, last_end + self.exposed_allreduce_s(split))

    @property
    def weight_s(self) -> float:
        return self.backward_s / 2 if self.weight_grad_s is None else self.weight_grad_s

    @property
    def input_s(self) -> float:
        return self.backward_s - self.weight_s


@dataclass(frozen=True)
class Event:
    stage: int
    label: str
    kind: str  # "forward" | "backward" | "input" | "weight" | "send" | "allreduce"
    start: float
    end: float


@dataclass
class Simulation:
    iteration_s: float
    stage_end_s: list[float]
    peak_in_flight: list[int]
    peak_activation_bytes: list[float]
    timeline: list[Event] = field(default_factory=list)


def program(schedule: Schedule, validated: bool = False) -> list[tuple[int, Action]]:
    """(stage, action) in an order where every receive comes after its send (execute_order): what
    the simulator walks, once the schedule is valid (a schedule the runtime cannot run has no
    time). It depends on the lists only, so a caller costing many layouts of one shape builds it once.
    `validated`: the caller vouches for the lists (a shipped generator's, whose rules the tests
    validate over grids): the planner skips a second per-action check of thousands of actions."""
    if not validated:
        validate(schedule)
    return [(s, schedule.stage_actions[s][i]) for s, i in execute_order(schedule)]


def encode_orders(compute: list[list[Action]]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Compute orders as (kind code, micro-batch) pairs (F 0, B 1, I 2, W 3): what orders_time
    walks. A planner costing many layouts of one shape encodes its orders once."""
    return tuple(tuple((CODE_OF[a.kind], a.micro_batch) for a in order) for order in compute)


def iteration_time(compute: list[list[Action]], costs: list[StageCosts], num_micro_batches: int) -> float:
    """simulate(with_communication(compute)).iteration_s without building or ordering the
    communication actions (orders_time of the encoded orders)."""
    return orders_time(encode_orders(compute), costs, num_micro_batches)


_COUNTS: dict[int, tuple] = {}  # id(orders) -> (orders, per stage its F, B, I and W counts)


def action_counts(orders: tuple[tuple[tuple[int, int], ...], ...]) -> list[tuple[int, int, int, int]]:
    """Per stage, how many F, B, I and W its order holds (cached per orders object: the planner costs
    many layouts of one shape with the same, lru-cached orders)."""
    hit = _COUNTS.get(id(orders))
    if hit is not None and hit[0] is orders:
        return hit[1]
    out = []
    for order in orders:
        codes = [code for code, _ in order]
        out.append((codes.count(0), codes.count(1), codes.count(2), codes.count(3)))
    if len(_COUNTS) >= 1024:
        _COUNTS.clear()
    _COUNTS[id(orders)] = (orders, out)  # the object is kept alive with its entry, so its id stays its own
    return out


def orders_time(
    orders: tuple[tuple[tuple[int, int], ...], ...],
    costs: list[StageCosts],
    num_micro_batches: int,
    cutoff: float = math.inf,
) -> float:
    """The planner's inner loop: every candidate's time. Same semantics as simulate
    (actions.with_communication: a forward's input arrives over the link from the previous stage, a
    backward's from the next, each send starting when its compute ends and its link is free). Each
    stage advances through its order until it needs an input that has not been sent yet; the stage
    that sends it is then resumed: every action is visited once.

    `cutoff`: the caller keeps the candidate only if it is at most this fast. The walk stops, and
    returns inf, as soon as one stage's compute plus the time it has waited so far passes it (that
    stage cannot finish sooner): a losing candidate is told apart without walking it to the end."""
    S, M = len(costs), num_micro_batches
    forward, backward = [c.forward_s + c.action_s for c in costs], [c.backward_s + c.action_s for c in costs]
    input_, weight = [c.input_s + c.action_s for c in costs], [c.weight_s + c.action_s for c in costs]
    slack = None  # per stage: cutoff - its compute; the walk stops once a stage has waited longer
    if cutoff < math.inf:
        slack = [
            cutoff - (nf * f + nb * b + ni * i + nw * w)
            for (nf, nb, ni, nw), f, b, i, w in zip(action_counts(orders), forward, backward, input_, weight)
        ]
        if min(slack) < 0:
            return math.inf
    send_up, send_down = [c.send_activation_s for c in costs], [c.send_gradient_s for c in costs]
    missing = -1.0
    activation = [[missing] * M for _ in range(S)]  # [stage][micro-batch] -> arrival of its input
    gradient = [[missing] * M for _ in range(S)]
    activation[0] = [0.0] * M  # the first stage reads the batch
    last = S - 1
    # What a run of stage s reads, in one tuple: a 1F1B stage runs one or two steps before it waits
    # for a neighbour, so setting a run up costs as much as its steps (fetched one by one, it did).
    # Its costs, its inputs, and where it writes the inputs of its neighbours.
    reads = [
        (
            orders[s],
            len(orders[s]),
            forward[s],
            backward[s],
            input_[s],
            weight[s],
            send_up[s],
            send_down[s],
            activation[s],
            gradient[s],
            activation[s + 1] if s < last else None,
            gradient[s - 1] if s > 0 else None,
        )
        for s in range(S)
    ]
    # and what it leaves for its next run: steps done, clock, time waited, when its links to the
    # next and the previous stage are free, when its last backward ended
    runs = [[0, 0.0, 0.0, 0.0, 0.0, 0.0] for _ in range(S)]
    pending = list(range(S - 1, -1, -1))
    while pending:
        s = pending.pop()
        run = runs[s]
        k, t, idle, up_free, down_free, end_b = run
        order, n, f_s, b_s, i_s, w_s, up_s, down_s, arrivals, gradients, to_next, to_prev = reads[s]
        if k == n:
            continue
        sent_up = sent_down = False
        while k < n:
            code, m = order[k]
            if code == 0:  # forward
                arrival = arrivals[m]
                if arrival < 0:
                    break
                if arrival > t:
                    idle += arrival - t
                    t = arrival
                t += f_s
                if to_next is not None:
                    up_free = to_next[m] = (t if t > up_free else up_free) + up_s
                    sent_up = True
            elif code == 3:  # weight gradient: local
                t += w_s
                end_b = t
            else:  # backward or input gradient: waits for the gradient from the next stage
                if to_next is not None:
                    arrival = gradients[m]
                    if arrival < 0:
                        break
                    if arrival > t:
                        idle += arrival - t
                        t = arrival
                if code == 1:
                    t += b_s
                    end_b = t
                else:
                    t += i_s
                if to_prev is not None:
                    down_free = to_prev[m] = (t if t > down_free else down_free) + down_s
                    sent_down = True
            k += 1
        if slack is not None and idle > slack[s]:
            return math.inf
        run[:] = k, t, idle, up_free, down_free, end_b
        # resume the neighbours this run sent to (the walk's result does not depend on the order)
        if sent_up:
            pending.append(s + 1)
        if sent_down:
            pending.append(s - 1)
    if any(run[0] < len(order) for run, order in zip(runs, orders)):
        raise ValueError("iteration_time: the compute orders deadlock (validate the schedule first)")
    counts = action_counts(orders)
    return max(
        run[1] if cost.allreduce_s <= 0 else max(run[1], run[5] + cost.exposed_allreduce_s(count[3] > 0))
        for run, cost, count in zip(runs, costs, counts)
    )


def simulate(
    schedule: Schedule,
    costs: list[StageCosts],
    record: bool = True,
    steps: list[tuple[int, Action]] | None = None,
    scale=None,
    unit_bytes: list[list[float]] | None = None,
) -> Simulation:
    """`record=False` skips the per-action timeline (the planner needs only the times and memory);
    `steps`: the schedule's program() when the caller already has it (validated by it); without
    it the schedule is validated first. Token slices (schedule/terapipe.py): `scale`, a SliceScale
    per unit (one for all stages or one per stage), multiplies each unit's compute, transfers and saved bytes; `unit_bytes[s][u]`, when
    given, are the bytes unit u keeps on stage s instead (what a runtime counted)."""
    S = schedule.num_stages
    if len(costs) != S:
        raise ValueError(f"simulate: {S} stages but {len(costs)} stage costs")
    clock = [0.0] * S
    link_up, link_down = [0.0] * S, [0.0] * S  # when the link to stage s + 1 / s - 1 is next free
    arrived_activation: dict[tuple[int, int], float] = {}  # (receiving stage, micro-batch) -> time
    arrived_gradient: dict[tuple[int, int], float] = {}
    in_flight = [0] * S
    peak = [0] * S
    peak_bytes = [0.0] * S  # in-flight micro-batches' activations, and a backward's recomputed ones
    last_backward_end = [0.0] * S
    timeline: list[Event] = []
    duration = {
        Kind.FORWARD: [c.forward_s for c in costs],
        Kind.BACKWARD: [c.backward_s for c in costs],
        Kind.INPUT_GRAD: [c.input_s for c in costs],
        Kind.WEIGHT_GRAD: [c.weight_s for c in costs],
    }
    send_up, send_down = [c.send_activation_s for c in costs], [c.send_gradient_s for c in costs]
    F, SA, SG, RA = Kind.FORWARD, Kind.SEND_ACTIVATION, Kind.SEND_GRADIENT, Kind.RECV_ACTIVATION
    I_, W_ = Kind.INPUT_GRAD, Kind.WEIGHT_GRAD
    label = {Kind.FORWARD: "forward", Kind.BACKWARD: "backward", Kind.INPUT_GRAD: "input", Kind.WEIGHT_GRAD: "weight"}
    if scale is not None and not isinstance(scale, (list, tuple)):
        scale = [scale] * S  # one SliceScale for every stage, or one per stage
    live = [0.0] * S  # bytes the in-flight micro-batches keep
    for s, a in steps if steps is not None else program(schedule):
        kind = a.kind
        if kind.is_compute:
            start = clock[s]
            took = duration[kind][s]
            if scale is not None:
                took *= scale[s].compute[a.micro_batch]
            end = clock[s] = start + took + costs[s].action_s
            if record:
                timeline.append(Event(s, schedule.label(a), label[kind], start, end))
            kept = (
                unit_bytes[s][a.micro_batch]
                if unit_bytes is not None
                else costs[s].activation_bytes * (scale[s].memory[a.micro_batch] if scale is not None else 1.0)
            )
            # what I frees early: the input-only share, scaled as the micro-batch's bytes are
            early = kept * costs[s].input_only_bytes / costs[s].activation_bytes if costs[s].input_only_bytes else 0.0
            if kind is I_:
                peak_bytes[s] = max(peak_bytes[s], live[s] + costs[s].workspace_bytes)
                live[s] -= early
            elif kind is F:
                in_flight[s] += 1
                if in_flight[s] > peak[s]:
                    peak[s] = in_flight[s]
                live[s] += kept
                peak_bytes[s] = max(peak_bytes[s], live[s] + costs[s].workspace_bytes)
            elif kind.frees_activations:
                top = live[s] + costs[s].recompute_bytes + costs[s].workspace_bytes
                peak_bytes[s] = max(peak_bytes[s], top)
                in_flight[s] -= 1
                live[s] -= kept - early if kind is W_ else kept
                last_backward_end[s] = end
        elif kind is SA or kind is SG:
            links, dur = (link_up, send_up[s]) if kind is SA else (link_down, send_down[s])
            if scale is not None:
                dur *= (scale[s].transfer if kind is SA or not scale[s].transfer_down else scale[s].transfer_down)[
                    a.micro_batch
                ]
            start = clock[s] if clock[s] > links[s] else links[s]
            end = links[s] = start + dur
            if kind is SA:
                arrived_activation[(s + 1, a.micro_batch)] = end
            else:
                arrived_gradient[(s - 1, a.micro_batch)] = end
            if dur > 0 and record:
                timeline.append(Event(s, schedule.label(a), "send", start, end))
        else:
            arrival = (arrived_activation if kind is RA else arrived_gradient)[(s, a.micro_batch)]
            if arrival > clock[s]:
                clock[s] = arrival
    ends = []
    for s in range(S):
        done = clock[s]
        if costs[s].allreduce_s > 0 and not schedule.forward_only:
            split = any(a.kind is Kind.WEIGHT_GRAD for a in schedule.stage_actions[s])
            end = costs[s].allreduce_end_s(last_backward_end[s], 0.0, split)
            done = max(done, end)
            # the buckets' span, which begins during the last backward where it overlaps
            timeline.append(Event(s, "AR", "allreduce", end - costs[s].allreduce_s, end))
        ends.append(done)
    return Simulation(
        iteration_s=max(ends),
        stage_end_s=ends,
        peak_in_flight=peak,
        peak_activation_bytes=peak_bytes,
        timeline=timeline,
    )
