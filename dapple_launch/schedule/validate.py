"""Validator: a schedule is accepted only if it can run to the end.

Rules: on every stage each micro-batch is run forward exactly once and, unless the schedule is
forward-only, backward exactly once after its forward: whole (B), or split into its input gradient
(I) and then its weight gradient (W), never both; every compute that needs a neighbour's
data is preceded by the receive of it; every send has its matching receive on the neighbour; the
transfers between two stages in one direction are received in the order they are sent (two ranks
match their messages in order: NCCL ignores tags, and the runtime's first transfer of each kind
carries the shapes of the rest); and executing all stages with buffered sends (the runtime's
isend semantics) reaches the end.
"""

from __future__ import annotations

from collections import Counter

from .actions import Action, Kind, Schedule


class ScheduleError(ValueError):
    pass


_PEER = {
    Kind.SEND_ACTIVATION: (+1, Kind.RECV_ACTIVATION),
    Kind.SEND_GRADIENT: (-1, Kind.RECV_GRADIENT),
}


def _fail(schedule: Schedule, stage: int, index: int, rule: str) -> ScheduleError:
    return ScheduleError(
        f"schedule {schedule.name!r} ({schedule.num_stages} stages, {schedule.num_micro_batches} "
        f"micro-batches) breaks a rule at stage {stage}, step {index}: {rule}\n"
        f"{schedule.grid({stage: index})}"
    )


def _check_stage(schedule: Schedule, s: int) -> None:
    S, M = schedule.num_stages, schedule.num_micro_batches
    seen: Counter = Counter()
    for i, a in enumerate(schedule.stage_actions[s]):
        m = a.micro_batch
        if not 0 <= m < M:
            raise _fail(schedule, s, i, f"micro-batch {m} is outside 0..{M - 1}")
        backward = a.kind in (Kind.BACKWARD, Kind.INPUT_GRAD, Kind.WEIGHT_GRAD)
        if backward and schedule.forward_only:
            raise _fail(schedule, s, i, "a forward-only schedule has a backward")
        if backward and not seen[(Kind.FORWARD, m)]:
            raise _fail(schedule, s, i, f"{a.kind.name.lower().replace('_', ' ')} {m} runs before forward {m}")
        if a.kind is Kind.WEIGHT_GRAD and not seen[(Kind.INPUT_GRAD, m)]:
            raise _fail(
                schedule, s, i, f"weight gradient {m} (W) runs before its input gradient (I): W uses what I computed"
            )
        if (
            a.kind is Kind.BACKWARD
            and (seen[(Kind.INPUT_GRAD, m)] or seen[(Kind.WEIGHT_GRAD, m)])
            or a.kind in (Kind.INPUT_GRAD, Kind.WEIGHT_GRAD)
            and seen[(Kind.BACKWARD, m)]
        ):
            raise _fail(schedule, s, i, f"micro-batch {m} has both a whole backward (B) and a split one (I, W)")
        if a.kind is Kind.FORWARD and s > 0 and not seen[(Kind.RECV_ACTIVATION, m)]:
            raise _fail(schedule, s, i, f"forward {m} runs before its activation is received")
        if a.kind.sends_gradient and s < S - 1 and not seen[(Kind.RECV_GRADIENT, m)]:
            raise _fail(schedule, s, i, f"backward {m} runs before its gradient is received")
        if a.kind is Kind.SEND_ACTIVATION and (s == S - 1 or not seen[(Kind.FORWARD, m)]):
            raise _fail(schedule, s, i, f"activation {m} is sent before it is computed or past the last stage")
        if a.kind is Kind.SEND_GRADIENT and (s == 0 or not (seen[(Kind.BACKWARD, m)] or seen[(Kind.INPUT_GRAD, m)])):
            raise _fail(schedule, s, i, f"gradient {m} is sent before it is computed or before the first stage")
        if a.kind is Kind.RECV_ACTIVATION and s == 0 or a.kind is Kind.RECV_GRADIENT and s == S - 1:
            raise _fail(schedule, s, i, f"{a} has no neighbour to receive from")
        seen[(a.kind, m)] += 1
        if seen[(a.kind, m)] > 1:
            raise _fail(schedule, s, i, f"{a} appears twice")
    for m in range(M):
        if seen[(Kind.FORWARD, m)] != 1:
            raise _fail(schedule, s, len(schedule.stage_actions[s]), f"forward {m} never runs")
        if not schedule.forward_only and seen[(Kind.BACKWARD, m)] != 1:
            if not seen[(Kind.INPUT_GRAD, m)]:
                raise _fail(schedule, s, len(schedule.stage_actions[s]), f"backward {m} never runs")
            if not seen[(Kind.WEIGHT_GRAD, m)]:
                raise _fail(
                    schedule,
                    s,
                    len(schedule.stage_actions[s]),
                    f"weight gradient {m} (W) never runs: its weights would miss this micro-batch",
                )


def validate(schedule: Schedule) -> None:
    """Raise ScheduleError with the stage × step grid (failing step marked) if the schedule is broken.
    (A RankSchedule, ranks holding several stages, is rank_validate's; `schedule.validate` takes either.)"""
    if schedule.num_stages != len(schedule.stage_actions):
        raise ScheduleError(f"schedule says {schedule.num_stages} stages but lists {len(schedule.stage_actions)}")
    for s in range(schedule.num_stages):
        _check_stage(schedule, s)
    # Every send has its receive, and every receive its send.
    for s, actions in enumerate(schedule.stage_actions):
        for i, a in enumerate(actions):
            if a.kind in _PEER:
                step, recv_kind = _PEER[a.kind]
                if Action(recv_kind, a.micro_batch) not in schedule.stage_actions[s + step]:
                    raise _fail(schedule, s, i, f"{a} is never received by stage {s + step}")
            if a.kind in (Kind.RECV_ACTIVATION, Kind.RECV_GRADIENT):
                peer = s - 1 if a.kind is Kind.RECV_ACTIVATION else s + 1
                send = Kind.SEND_ACTIVATION if a.kind is Kind.RECV_ACTIVATION else Kind.SEND_GRADIENT
                if Action(send, a.micro_batch) not in schedule.stage_actions[peer]:
                    raise _fail(schedule, s, i, f"{a} waits for a send that stage {peer} never makes")
    if schedule.num_slices > 1:
        from .terapipe import check_slice_order

        broken = check_slice_order(schedule)
        if broken:
            raise ScheduleError(f"schedule {schedule.name!r} breaks the token-slice order at {broken}")
    execute_order(schedule)
    _check_in_order(schedule)


def _check_in_order(schedule: Schedule) -> None:
    """Each stage receives a neighbour's transfers in the order the neighbour sends them."""
    for s in range(schedule.num_stages):
        for recv, send, peer in (
            (Kind.RECV_ACTIVATION, Kind.SEND_ACTIVATION, s - 1),
            (Kind.RECV_GRADIENT, Kind.SEND_GRADIENT, s + 1),
        ):
            if not 0 <= peer < schedule.num_stages:
                continue
            got = [(i, a.micro_batch) for i, a in enumerate(schedule.stage_actions[s]) if a.kind is recv]
            sent = [a.micro_batch for a in schedule.stage_actions[peer] if a.kind is send]
            for (i, m), expected in zip(got, sent):
                if m != expected:
                    what = "activation" if recv is Kind.RECV_ACTIVATION else "gradient"
                    raise _fail(
                        schedule,
                        s,
                        i,
                        f"it receives {what} {m} from stage {peer}, which sends {what} "
                        f"{expected} before it: two ranks match their transfers in order "
                        f"(NCCL ignores tags), so receive them in the order they are sent",
                    )


def execute_order(schedule: Schedule) -> list[tuple[int, int]]:
    """Run the lists abstractly (sends buffered, receives blocking) and return the global order of
    (stage, index) steps; raise with the blocked positions marked if it deadlocks."""
    pos = [0] * schedule.num_stages
    sent: set[tuple[int, Kind, int]] = set()  # (receiving stage, receive kind, micro-batch) that can complete
    order = []
    receives = (Kind.RECV_ACTIVATION, Kind.RECV_GRADIENT)
    progressed = True
    while progressed:
        progressed = False
        for s, actions in enumerate(schedule.stage_actions):
            p, n = pos[s], len(actions)
            while p < n:
                a = actions[p]
                kind = a.kind
                if kind in receives and (s, kind, a.micro_batch) not in sent:
                    break
                if kind in _PEER:
                    step, recv_kind = _PEER[kind]
                    sent.add((s + step, recv_kind, a.micro_batch))
                order.append((s, p))
                p += 1
            if p != pos[s]:
                pos[s], progressed = p, True
    if any(p < len(actions) for p, actions in zip(pos, schedule.stage_actions)):
        blocked = {s: p for s, p in enumerate(pos) if p < len(schedule.stage_actions[s])}
        raise ScheduleError(
            f"schedule {schedule.name!r} deadlocks: stages {sorted(blocked)} wait on receives whose "
            f"sends are never reached (blocked step marked)\n{schedule.grid(blocked)}"
        )
    return order
