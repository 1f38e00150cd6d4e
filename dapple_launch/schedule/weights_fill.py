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

import heapq
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

    # each given step's input, its own key and (an I) the W it leaves, found once: the walk visits
    # every step and claims each rank's next one again and again
    need_of = [[needs(a) for a in order] for order in base]
    key_of = [[(a.kind, a.stage, a.micro_batch) for a in order] for order in base]
    weight_of = [
        [shared_step(Kind.WEIGHT_GRAD, a.stage, a.micro_batch) if a.kind is Kind.INPUT_GRAD else None for a in order]
        for order in base
    ]
    length = [len(order) for order in base]

    # Each rank's claim to run next, (when it could start, rank, when its input is there), kept per
    # rank and recomputed only for the rank that ran and the rank waiting on what it produced: the
    # same choices as recomputing every rank's claim at every step, without the R-fold walk. The
    # claims sit in a heap, each rank's newest valid (its version): a claim is (start, rank, version,
    # input's end), unique up to the version, so a stale one never compares its input's end (None or
    # an int).
    claims: list[tuple] = []
    version = [0] * R
    waiting: dict[tuple[Kind, int, int], int] = {}  # an input not yet produced -> the rank whose next step needs it
    push, pop = heapq.heappush, heapq.heappop

    def update(r: int) -> None:
        version[r] += 1
        k = pos[r]
        if k >= length[r]:
            return
        need = need_of[r][k]
        at = 0 if need is None else done_at.get(need)
        if at is None:
            assert need is not None  # (an input of no step is there at 0)
            waiting[need] = r
            if pending[r]:
                push(claims, (clock[r], r, version[r], None))
        else:
            now = clock[r]
            push(claims, (now if at <= now else min(at, now + 1), r, version[r], at))

    for r in range(R):
        update(r)
    left = sum(length)  # the given steps not yet placed
    while left:
        while claims and claims[0][2] != version[claims[0][1]]:
            pop(claims)  # (stale: its rank ran or was woken since)
        if not claims:
            raise ValueError(f"schedule {x.name!r}: its forwards and input gradients deadlock")
        _, r, _, at = pop(claims)
        woken = None
        if at is not None and at <= clock[r]:  # its input is there: the given order goes on
            k = pos[r]
            pos[r] = k + 1
            left -= 1
            out[r].append(base[r][k])
            clock[r] += 1
            key = key_of[r][k]
            done_at[key] = clock[r]
            woken = waiting.pop(key, None)
            w = weight_of[r][k]
            if w is not None:
                pending[r].append(w)
                if len(pending[r]) > cap[r]:
                    out[r].append(pending[r].popleft())
                    clock[r] += 1
        elif pending[r]:  # it would wait: a held-back W fills the gap
            out[r].append(pending[r].popleft())
            clock[r] += 1
        else:
            assert at is not None  # (a claim without its input waits only with a W to run)
            clock[r] = at
        update(r)
        if woken is not None and woken != r:
            update(woken)
    for r in range(R):
        out[r].extend(pending[r])
    return RankSchedule(name, S, x.num_micro_batches, tuple(map(tuple, out)), x.placement)
