"""Discrete-event simulator: action lists + costs -> iteration time, timeline, peak memory.

It is the ground truth the planner's closed-form estimate is checked against, and the source of
the predicted timeline. Semantics match the runtime: compute on a stage is sequential; a send
does not block its stage but occupies the directed link to the neighbour (links are serial
resources, one per direction); a receive waits for the data's arrival; each stage's gradient
all-reduce starts when its last backward ends and overlaps whatever other stages still do.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .actions import Action, Kind, Schedule
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


def program(schedule: Schedule) -> list[tuple[int, Action]]:
    """(stage, action) in an order where every receive comes after its send (execute_order): what
    the simulator walks. It depends on the lists only, so a caller costing many layouts of one
    shape builds it once."""
    return [(s, schedule.stage_actions[s][i]) for s, i in execute_order(schedule)]


def simulate(schedule: Schedule, costs: list[StageCosts], record: bool = True,
             steps: list[tuple[int, Action]] | None = None) -> Simulation:
    """`record=False` skips the per-action timeline (the planner needs only the times and memory);
    `steps`: the schedule's program() when the caller already has it."""
    S = schedule.num_stages
    if len(costs) != S:
        raise ValueError(f"simulate: {S} stages but {len(costs)} stage costs")
    clock = [0.0] * S
    link_up, link_down = [0.0] * S, [0.0] * S  # when the link to stage s + 1 / s - 1 is next free
    arrived_activation: dict[tuple[int, int], float] = {}  # (receiving stage, micro-batch) -> time
    arrived_gradient: dict[tuple[int, int], float] = {}
    in_flight = [0] * S
    peak = [0] * S
    last_backward_end = [0.0] * S
    timeline: list[Event] = []
    forward, backward = [c.forward_s for c in costs], [c.backward_s for c in costs]
    send_up, send_down = [c.send_activation_s for c in costs], [c.send_gradient_s for c in costs]
    F, B, SA, SG, RA = Kind.FORWARD, Kind.BACKWARD, Kind.SEND_ACTIVATION, Kind.SEND_GRADIENT, Kind.RECV_ACTIVATION
    for s, a in steps if steps is not None else program(schedule):
        kind = a.kind
        if kind is F or kind is B:
            start = clock[s]
            end = clock[s] = start + (forward[s] if kind is F else backward[s])
            if record:
                timeline.append(Event(s, str(a), "forward" if kind is F else "backward", start, end))
            if kind is F:
                in_flight[s] += 1
                if in_flight[s] > peak[s]:
                    peak[s] = in_flight[s]
            else:
                in_flight[s] -= 1
                last_backward_end[s] = end
        elif kind is SA or kind is SG:
            links, dur = (link_up, send_up[s]) if kind is SA else (link_down, send_down[s])
            start = clock[s] if clock[s] > links[s] else links[s]
            end = links[s] = start + dur
            if kind is SA:
                arrived_activation[(s + 1, a.micro_batch)] = end
            else:
                arrived_gradient[(s - 1, a.micro_batch)] = end
            if dur > 0 and record:
                timeline.append(Event(s, str(a), "send", start, end))
        else:
            arrival = (arrived_activation if kind is RA else arrived_gradient)[(s, a.micro_batch)]
            if arrival > clock[s]:
                clock[s] = arrival
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
