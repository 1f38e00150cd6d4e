"""Discrete-event simulator: action lists + costs -> iteration time, timeline, peak memory.

It is the ground truth the planner's closed-form estimate is checked against, and the source of
the predicted timeline. Semantics match the runtime: compute on a stage is sequential; a send
does not block its stage but occupies the directed link to the neighbour (links are serial
resources, one per direction); a receive waits for the data's arrival; each stage's gradient
all-reduce starts when its last backward ends and overlaps whatever other stages still do.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .actions import Kind, Schedule
from .validate import execute_order


@dataclass(frozen=True)
class StageCosts:
    forward_s: float  # one micro-batch, this stage's slice
    backward_s: float
    send_activation_s: float = 0.0  # to the next stage, one micro-batch
    send_gradient_s: float = 0.0  # to the previous stage, one micro-batch
    allreduce_s: float = 0.0
    activation_bytes: float = 0.0  # saved per in-flight micro-batch on one device of this stage


@dataclass(frozen=True)
class Event:
    stage: int
    label: str
    kind: str  # "forward" | "backward" | "send" | "allreduce"
    start: float
    end: float


@dataclass
class Simulation:
    iteration_s: float
    stage_end_s: list[float]
    peak_in_flight: list[int]
    peak_activation_bytes: list[float]
    timeline: list[Event] = field(default_factory=list)


def simulate(schedule: Schedule, costs: list[StageCosts], record: bool = True,
             order: list[tuple[int, int]] | None = None) -> Simulation:
    """`record=False` skips the per-action timeline (the planner needs only the times and memory);
    `order`: the schedule's execute_order when the caller already has it (it depends on the lists only)."""
    S = schedule.num_stages
    if len(costs) != S:
        raise ValueError(f"simulate: {S} stages but {len(costs)} stage costs")
    clock = [0.0] * S
    link_free: dict[tuple[int, int], float] = {}
    arrival: dict[tuple[int, Kind, int], float] = {}
    in_flight = [0] * S
    peak = [0] * S
    last_backward_end = [0.0] * S
    timeline: list[Event] = []
    # execute_order gives an order in which every receive comes after its send.
    for s, i in order if order is not None else execute_order(schedule):
        a = schedule.stage_actions[s][i]
        c = costs[s]
        if a.kind is Kind.FORWARD or a.kind is Kind.BACKWARD:
            dur = c.forward_s if a.kind is Kind.FORWARD else c.backward_s
            start, clock[s] = clock[s], clock[s] + dur
            if record:
                timeline.append(Event(s, str(a), "forward" if a.kind is Kind.FORWARD else "backward", start, clock[s]))
            in_flight[s] += 1 if a.kind is Kind.FORWARD else -1
            peak[s] = max(peak[s], in_flight[s])
            if a.kind is Kind.BACKWARD:
                last_backward_end[s] = clock[s]
        elif a.kind in (Kind.SEND_ACTIVATION, Kind.SEND_GRADIENT):
            peer = s + 1 if a.kind is Kind.SEND_ACTIVATION else s - 1
            dur = c.send_activation_s if a.kind is Kind.SEND_ACTIVATION else c.send_gradient_s
            start = max(clock[s], link_free.get((s, peer), 0.0))
            link_free[(s, peer)] = start + dur
            recv = Kind.RECV_ACTIVATION if a.kind is Kind.SEND_ACTIVATION else Kind.RECV_GRADIENT
            arrival[(peer, recv, a.micro_batch)] = start + dur
            if dur > 0 and record:
                timeline.append(Event(s, str(a), "send", start, start + dur))
        else:
            clock[s] = max(clock[s], arrival[(s, a.kind, a.micro_batch)])
    ends = []
    for s in range(S):
        done = clock[s]
        if costs[s].allreduce_s > 0 and not schedule.forward_only:
            start = last_backward_end[s]
            done = max(done, start + costs[s].allreduce_s)
            timeline.append(Event(s, "AR", "allreduce", start, start + costs[s].allreduce_s))
        ends.append(done)
    return Simulation(
        iteration_s=max(ends),
        stage_end_s=ends,
        peak_in_flight=peak,
        peak_activation_bytes=[p * c.activation_bytes for p, c in zip(peak, costs)],
        timeline=timeline,
    )
