"""Zero bubble from any rank schedule: each B split into I and a W placed where the rank would wait.

The given orders fix the forwards and input gradients (what other ranks wait for). Walking them
with unit costs (T_F = T_I = T_W = 1, transfers free), a rank that would wait for an input runs a
pending W instead, and a rank that holds more than `cap` pending W's runs the oldest at once
(each pending W keeps its micro-batch's activations: the cap bounds the memory a rank adds over
the given schedule); the rest run after its last input gradient. Applied to interleaved 1F1B with
one warm-up forward per hop this is interleaved zero bubble, torch's ScheduleInterleavedZeroBubble
(ZB1P): the same warm-up, rank r holding back r W's, so v·P chunk micro-batches in flight on every rank.
"""

from __future__ import annotations

from collections import deque

from .actions import Kind
from .ranks import RankSchedule, Step, shared_step


def fill_with_weights(x: RankSchedule, name: str, cap: list[int] | None = None) -> RankSchedule:
    """`cap[r]`: the most W's rank r holds back (default r: rank 0 none, as ZB-H1's stage 0)."""
    R, S = x.num_ranks, x.num_stages
    cap = list(range(R)) if cap is None else cap
    base = [
        [shared_step(Kind.INPUT_GRAD, a.stage, a.micro_batch) if a.kind is Kind.BACKWARD else a for a in order]
        for order in x.orders
    ]
    out: list[list[Step]] = [[] for _ in range(R)]
    pending: list[deque] = [deque() for _ in range(R)]
    clock, pos = [0] * R, [0] * R
    done_at: dict[tuple[Kind, int, int], int] = {}  # (F or I, stage, micro-batch) -> when it ended

    def needs(a: Step):
        """The step whose end this one waits for (None: the batch or the loss is local)."""
        if a.kind is Kind.FORWARD:
            return (Kind.FORWARD, a.stage - 1, a.micro_batch) if a.stage > 0 else None
        return (Kind.INPUT_GRAD, a.stage + 1, a.micro_batch) if a.stage < S - 1 else None

    # each given step's input, found once (update asks for it at every claim)
    need_of = [[needs(a) for a in order] for order in base]

    def run_weight(r: int) -> None:
        out[r].append(pending[r].popleft())
        clock[r] += 1

    # Each rank's claim to run next, (when it could start, rank, when its input is there), kept per
    # rank and recomputed only for the rank that ran and the rank waiting on what it produced: the
    # same choices as recomputing every rank's claim at every step, without the R-fold walk.
    claim: list[tuple | None] = [None] * R
    waiting: dict[tuple[Kind, int, int], int] = {}  # an input not yet produced -> the rank whose next step needs it

    def update(r: int) -> None:
        claim[r] = None
        if pos[r] >= len(base[r]):
            return
        need = need_of[r][pos[r]]
        at = 0 if need is None else done_at.get(need)
        if at is None and need is not None:
            waiting[need] = r
        if at is not None or pending[r]:
            claim[r] = (clock[r] if at is None else max(clock[r], min(at, clock[r] + 1)), r, at)

    for r in range(R):
        update(r)
    left = sum(map(len, base))  # the given steps not yet placed
    while left:
        ready = [c for c in claim if c is not None]
        if not ready:
            raise ValueError(f"schedule {x.name!r}: its forwards and input gradients deadlock")
        _, r, at = min(ready)
        woken = None
        if at is not None and at <= clock[r]:  # its input is there: the given order goes on
            a = base[r][pos[r]]
            pos[r] += 1
            left -= 1
            out[r].append(a)
            clock[r] += 1
            key = (a.kind, a.stage, a.micro_batch)
            done_at[key] = clock[r]
            woken = waiting.pop(key, None)
            if a.kind is Kind.INPUT_GRAD:
                pending[r].append(shared_step(Kind.WEIGHT_GRAD, a.stage, a.micro_batch))
                if len(pending[r]) > cap[r]:
                    run_weight(r)
        elif pending[r]:  # it would wait: a held-back W fills the gap
            run_weight(r)
        else:
            assert at is not None  # (a claim without its input waits only with a W to run)
            clock[r] = at
        update(r)
        if woken is not None and woken != r:
            update(woken)
    for r in range(R):
        while pending[r]:
            run_weight(r)
    return RankSchedule(name, S, x.num_micro_batches, tuple(map(tuple, out)), x.placement)
