"""Validator of rank orders: a schedule is accepted only if every rank can run its order to the end.

Rules: every step's stage is one its rank holds; on every stage each micro-batch is run forward
exactly once, on one rank, and backward exactly once on that same rank after its forward: whole (B)
or split into its input gradient (I) and then its weight gradient (W), never both; a micro-batch
crosses stages in order (a stage's forward needs the previous stage's, its backward the next
stage's: checked by running the orders, a step waiting for an input no rank will produce is a
deadlock); and between two stages on different ranks, the receiver uses the transfers in the
order the sender produces them (the runtime matches a channel's messages in order).
"""

from __future__ import annotations

from collections import Counter

from .actions import Kind
from .rank_simulate import simulate_ranks
from .ranks import RankSchedule
from .simulate import StageCosts
from .validate import ScheduleError

_BACKWARD = (Kind.BACKWARD, Kind.INPUT_GRAD, Kind.WEIGHT_GRAD)


def _fail(x: RankSchedule, rank: int, index: int, rule: str) -> ScheduleError:
    return ScheduleError(
        f"schedule {x.name!r} ({x.num_ranks} ranks, {x.num_stages} stages, {x.num_micro_batches} "
        f"micro-batches) breaks a rule at rank {rank}, step {index}: {rule}\n{x.grid({rank: index})}"
    )


def validate_ranks(x: RankSchedule) -> None:
    """Raise ScheduleError naming the rule, with the rank × step grid (failing step marked)."""
    S, M, R = x.num_stages, x.num_micro_batches, x.num_ranks
    if len(x.placement) != S:
        raise ScheduleError(f"schedule {x.name!r} places {len(x.placement)} stages but has {S}")
    for s, ranks in enumerate(x.placement):
        if not ranks or any(not 0 <= r < R for r in ranks):
            raise ScheduleError(
                f"schedule {x.name!r}: stage {s} is placed on ranks {list(ranks)}, not among 0..{R - 1}"
            )
    where: dict[tuple[int, int], int] = {}  # (stage, micro-batch) -> rank of its forward
    for r, order in enumerate(x.orders):
        seen: Counter = Counter()
        for i, a in enumerate(order):
            s, m = a.stage, a.micro_batch
            if not 0 <= s < S or r not in x.placement[s]:
                raise _fail(x, r, i, f"stage {s} is not held by rank {r} (it holds {list(x.stages_of(r))})")
            if not 0 <= m < M:
                raise _fail(x, r, i, f"micro-batch {m} is outside 0..{M - 1}")
            if a.kind is Kind.FORWARD and (s, m) in where:
                raise _fail(x, r, i, f"forward {m} of stage {s} runs twice (also on rank {where[(s, m)]})")
            if a.kind in _BACKWARD and not seen[(Kind.FORWARD, s, m)]:
                raise _fail(
                    x,
                    r,
                    i,
                    f"{a.kind.name.lower().replace('_', ' ')} {m} of stage {s} runs before its forward on this rank",
                )
            if a.kind is Kind.WEIGHT_GRAD and not seen[(Kind.INPUT_GRAD, s, m)]:
                raise _fail(
                    x,
                    r,
                    i,
                    f"weight gradient {m} of stage {s} (W) runs before its input gradient (I): W uses what I computed",
                )
            if (
                a.kind is Kind.BACKWARD
                and (seen[(Kind.INPUT_GRAD, s, m)] or seen[(Kind.WEIGHT_GRAD, s, m)])
                or a.kind in (Kind.INPUT_GRAD, Kind.WEIGHT_GRAD)
                and seen[(Kind.BACKWARD, s, m)]
            ):
                raise _fail(x, r, i, f"micro-batch {m} of stage {s} has both a whole backward (B) and a split one")
            seen[(a.kind, s, m)] += 1
            if seen[(a.kind, s, m)] > 1:
                raise _fail(x, r, i, f"{a} appears twice")
            if a.kind is Kind.FORWARD:
                where[(s, m)] = r
        if x.forward_only and any(a.kind in _BACKWARD for a in order):
            i = next(i for i, a in enumerate(order) if a.kind in _BACKWARD)
            raise _fail(x, r, i, "a forward-only schedule has a backward")
        for _, s, m in [k for k in seen if k[0] is Kind.FORWARD and not x.forward_only]:
            if not seen[(Kind.BACKWARD, s, m)] and not seen[(Kind.INPUT_GRAD, s, m)]:
                raise _fail(
                    x, r, len(order), f"backward {m} of stage {s} never runs on rank {r}, where its forward ran"
                )
            if seen[(Kind.INPUT_GRAD, s, m)] and not seen[(Kind.WEIGHT_GRAD, s, m)]:
                raise _fail(
                    x,
                    r,
                    len(order),
                    f"weight gradient {m} of stage {s} (W) never runs: its weights would miss this micro-batch",
                )
    missing = [(s, m) for s in range(S) for m in range(M) if (s, m) not in where]
    if missing:
        s, m = missing[0]
        raise ScheduleError(
            f"schedule {x.name!r}: forward {m} of stage {s} never runs"
            + (f" ({len(missing)} (stage, micro-batch) pairs in all)" if len(missing) > 1 else "")
        )
    _check_channels(x, where)
    simulate_ranks(x, [StageCosts(1.0, 2.0, 1.0, 1.0)] * S, record=False)  # deadlock: raises with the grid


def _check_channels(x: RankSchedule, where: dict[tuple[int, int], int]) -> None:
    """Per (producing stage, consuming stage) pair on two ranks: used in the order produced."""
    position = {(a.kind, a.stage, a.micro_batch): i for order in x.orders for i, a in enumerate(order)}

    def backward(s: int, m: int) -> tuple[Kind, int, int]:
        return (Kind.BACKWARD, s, m) if (Kind.BACKWARD, s, m) in position else (Kind.INPUT_GRAD, s, m)

    channels: dict[tuple[int, int, int, int], list[int]] = {}
    for s in range(x.num_stages - 1):
        for m in range(x.num_micro_batches):
            a, b = where[(s, m)], where[(s + 1, m)]
            if a != b:
                channels.setdefault((s, s + 1, a, b), []).append(m)  # activations down
                if not x.forward_only:
                    channels.setdefault((s + 1, s, b, a), []).append(m)  # gradients back
    for (src, dst, a, b), ms in channels.items():
        produce = (lambda m: position[(Kind.FORWARD, src, m)]) if dst > src else (lambda m: position[backward(src, m)])
        use = (lambda m: position[(Kind.FORWARD, dst, m)]) if dst > src else (lambda m: position[backward(dst, m)])
        sent, used = sorted(ms, key=produce), sorted(ms, key=use)
        if sent != used:
            k = next(i for i, (p, q) in enumerate(zip(sent, used)) if p != q)
            what = "activation" if dst > src else "gradient"
            raise _fail(
                x,
                b,
                use(used[k]),
                f"stage {dst} uses {what} {used[k]} from stage {src} (rank {a}) before "
                f"{what} {sent[k]}, which rank {a} sends first: a channel's transfers "
                f"are matched in order, so use them in the order they are sent",
            )
