"""Lowering: a schedule's rank orders -> what every rank sends and receives, and when it issues each.

The runtime interprets the result and the NCCL model (schedule/nccl.py) checks it, so the order
that runs is the order that was proven. NCCL matches the i-th send from A to B with the i-th
receive on B from A whatever the tags, runs a pair's transfers on one stream in issue order (both
directions), and a send may wait until its receive is reached. The discipline here:

- **one sequence per rank pair.** Every transfer between two ranks gets one place in a sequence
  both ranks follow: the order in which a valid execution of the orders produces them
  (`execution_order`). Both ends issue the pair's transfers in that order, so the i-th operation on
  each end's stream is the same transfer, one end sending, the other receiving.
- **one group per slot and peer.** What a rank issues to one peer before one compute step (its
  slot, below) goes out as one group (`batch_isend_irecv`): sends and receives of the pair's
  sequence, consecutive in it, so the pair's stream still sees the sequence's order on both ends.
  The two ends' groups need not mirror each other: NCCL matches a pair's operations one by one in
  order, and the model (schedule/nccl.py) runs each group as one kernel that ends when all of its
  operations have.
- **slots that never cross.** Each end issues a transfer before one of its compute steps (its slot):
  the sender right after the compute that produced it; the receiver one compute before the one
  that needs it (so it overlaps that compute), or earlier where the pair's order asks: slots along
  the pair's sequence never decrease on either end, and a receive never holds back a later send.

Why it cannot hang, for orders that run (any execution order exists): take the transfers in the
execution's time order. A compute waits only for transfers made before it; each was issued by its
sender right after it was made, and by its receiver no later than the compute that waits; every
transfer ahead of it on either end's stream was made earlier still and, by induction, completes.
The NCCL model (schedule/nccl.py) checks the same thing on the programs themselves.

What crosses between stages splits a micro-batch's samples among replicas: replica j of a stage of
r replicas owns the j-th contiguous share, and each sender sends each receiver their overlap.
Stages of one device group hand over locally: no transfer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache

from .actions import Kind
from .ranks import RankSchedule


def split_sizes(n: int, parts: int) -> list[int]:
    """Contiguous split of n samples into `parts` (torch.tensor_split's sizes: the first get one more)."""
    q, r = divmod(n, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


@lru_cache(maxsize=4096)
def split_bounds(n: int, parts: int) -> tuple[tuple[int, int], ...]:
    out, lo = [], 0
    for size in split_sizes(n, parts):
        out.append((lo, lo + size))
        lo += size
    return tuple(out)


@lru_cache(maxsize=4096)
def overlaps(n: int, src_replicas: int, dst_replicas: int) -> tuple[tuple[int, int, int, int], ...]:
    """(src replica, dst replica, lo, hi) for each overlapping piece of an n-sample micro-batch."""
    out = []
    for j, (a0, a1) in enumerate(split_bounds(n, src_replicas)):
        for k, (b0, b1) in enumerate(split_bounds(n, dst_replicas)):
            lo, hi = max(a0, b0), min(a1, b1)
            if lo < hi:
                out.append((j, k, lo, hi))
    return tuple(out)


@dataclass(frozen=True, order=True)
class Transfer:
    """One piece of a carry moving between two ranks: samples [lo, hi) of unit `unit` (a micro-batch,
    or with token slices a (micro-batch, slice)), activation ("A", down) or gradient ("G", back)."""

    space: str
    src_stage: int
    dst_stage: int
    unit: int
    src: int  # sending rank
    dst: int  # receiving rank
    lo: int
    hi: int
    at: int  # where [lo, hi) starts in the sender's share of the micro-batch

    @property
    def boundary(self) -> int:
        """The stage boundary it crosses: s for stages s -> s + 1 (activations) and s + 1 -> s (gradients)."""
        return min(self.src_stage, self.dst_stage)

    def __str__(self) -> str:
        what = "activation" if self.space == "A" else "gradient"
        return (
            f"{what} {self.unit} of stage {self.src_stage}->{self.dst_stage} "
            f"(samples {self.lo}:{self.hi}, rank {self.src}->{self.dst})"
        )


@dataclass(frozen=True)
class RankProgram:
    """One rank's transfers for one iteration. slots[c]: what it issues before its compute step c
    (slots[-1]: after its last), each (transfer, is_send), in order; needs[c]: the receives compute
    step c waits for before it runs."""

    rank: int
    slots: tuple[tuple[tuple[Transfer, bool], ...], ...]
    needs: tuple[tuple[Transfer, ...], ...]

    @property
    def sends(self) -> tuple[Transfer, ...]:
        return tuple(t for slot in self.slots for t, send in slot if send)


class LoweringError(ValueError):
    pass


def execution_order(x: RankSchedule) -> dict[tuple[int, int], int]:
    """(group, step index) -> its position in one valid execution of the orders: every group runs its
    next step as soon as the step's input is produced (a forward after the previous stage's forward
    of its micro-batch, a backward after the next stage's), groups taking turns one step at a time,
    so the positions follow time as a lock-step run would."""
    S = x.num_stages
    done: set[tuple[int, int, int]] = set()  # (is backward, stage, micro-batch) produced
    pos = [0] * x.num_ranks
    out: dict[tuple[int, int], int] = {}
    progressed = True
    while progressed:
        progressed = False
        for g, order in enumerate(x.orders):
            if pos[g] >= len(order):
                continue
            a = order[pos[g]]
            if a.kind is Kind.FORWARD:
                ready = a.stage == 0 or (0, a.stage - 1, a.micro_batch) in done
            elif a.kind is Kind.WEIGHT_GRAD:
                ready = True
            else:
                ready = a.stage == S - 1 or (1, a.stage + 1, a.micro_batch) in done
            if not ready:
                continue
            if a.kind is not Kind.WEIGHT_GRAD:
                done.add((0 if a.kind is Kind.FORWARD else 1, a.stage, a.micro_batch))
            out[(g, pos[g])] = len(out)
            pos[g] += 1
            progressed = True
    if any(p < len(o) for p, o in zip(pos, x.orders)):
        blocked = {g: p for g, (p, o) in enumerate(zip(pos, x.orders)) if p < len(o)}
        raise LoweringError(
            f"schedule {x.name!r} deadlocks: groups {sorted(blocked)} wait for inputs no group "
            f"produces (blocked step marked)\n{x.grid(blocked)}"
        )
    return out


def lower(
    x: RankSchedule,
    group_ranks: tuple[tuple[int, ...], ...],
    rows: tuple[int, ...],
    lookahead: int = 1,
    align: bool = True,
) -> dict[int, RankProgram]:
    """Every rank's program. `group_ranks[g]`: the ranks running orders[g] (one per replica of its
    stages' share); `rows[u]`: samples of unit u (its micro-batch's); `lookahead`: compute steps a
    receive is posted ahead of the one that needs it. `align=False` leaves every transfer at its
    natural slot (sent right after it is made, received `lookahead` steps before its use) without
    the pair's common order: the discipline the runtime had before this one, kept to show what the
    NCCL model refuses."""
    when = execution_order(x)
    S = x.num_stages
    fwd, bwd = {}, {}  # (stage, micro-batch) -> (group, step index)
    for g, order in enumerate(x.orders):
        for i, a in enumerate(order):
            if a.kind is Kind.FORWARD:
                fwd[(a.stage, a.micro_batch)] = (g, i)
            elif a.kind is not Kind.WEIGHT_GRAD:
                bwd[(a.stage, a.micro_batch)] = (g, i)
    # per rank pair: (production time, transfer, producer step, consumer step)
    pairs: dict[tuple[int, int], list] = defaultdict(list)
    for s in range(S - 1):
        for m in range(x.num_micro_batches):
            (a, fa), (b, fb) = fwd[(s, m)], fwd[(s + 1, m)]
            if a == b:
                continue  # one device group holds both stages: a local hand-off
            ga, gb = group_ranks[a], group_ranks[b]
            starts = split_bounds(rows[m], len(ga))
            for j, k, lo, hi in overlaps(rows[m], len(ga), len(gb)):
                t = Transfer("A", s, s + 1, m, ga[j], gb[k], lo, hi, lo - starts[j][0])
                pairs[_pair(t)].append((when[(a, fa)], t, fa, fb))
                if not x.forward_only:
                    (_, ba), (_, bb) = bwd[(s, m)], bwd[(s + 1, m)]
                    back_starts = split_bounds(rows[m], len(gb))
                    g_t = Transfer("G", s + 1, s, m, gb[k], ga[j], lo, hi, lo - back_starts[k][0])
                    pairs[_pair(g_t)].append((when[(b, bb)], g_t, bb, ba))
    steps = {r: len(x.orders[g]) for g, ranks in enumerate(group_ranks) for r in ranks}
    slots = {r: [[] for _ in range(n + 1)] for r, n in steps.items()}
    needs = {r: [[] for _ in range(n)] for r, n in steps.items()}
    for pair in sorted(pairs):
        seq = sorted(pairs[pair], key=lambda e: (e[0], e[1]))
        for side in pair:
            # each transfer's latest slot on this side: no later than a receive after it is used, nor
            # than a send after it is made (so every send goes out right after its compute)
            limit, latest = len(slots[side]) - 1, []
            for _, t, made, use in reversed(seq):
                limit = min(limit, made + 1 if t.src == side else use)
                latest.append(limit)
            latest.reverse()
            slot = 0
            for (_, t, made, use), cap in zip(seq, latest):
                target = made + 1 if t.src == side else max(0, use - lookahead)
                slot = min(max(slot, target), cap) if align else target
                if t.src == side and slot < made + 1 or t.dst == side and slot > use:
                    raise LoweringError(
                        f"schedule {x.name!r}: {t} has no slot on rank {side} "
                        f"(produced at step {made}, used at step {use})"
                    )
                slots[side][slot].append((t, t.src == side))
                if t.dst == side:
                    needs[side][use].append(t)
    return {r: RankProgram(r, tuple(map(tuple, slots[r])), tuple(map(tuple, needs[r]))) for r in sorted(steps)}


def peer_groups(slot: tuple[tuple[Transfer, bool], ...]) -> dict[int, list[tuple[Transfer, bool]]]:
    """A slot's transfers by the peer on the other end, each peer's in the slot's order: what the
    runtime issues as one group per peer (runtime/p2p.py) and the NCCL model runs as one kernel
    (schedule/nccl.py lowered_programs)."""
    out: dict[int, list[tuple[Transfer, bool]]] = {}
    for t, is_send in slot:
        out.setdefault(t.dst if is_send else t.src, []).append((t, is_send))
    return out


def _pair(t: Transfer) -> tuple[int, int]:
    return (t.src, t.dst) if t.src < t.dst else (t.dst, t.src)


def rank_pairs(programs: dict[int, RankProgram]) -> list[tuple[int, int]]:
    """The rank pairs that exchange anything, sorted (the order every rank creates their groups in)."""
    return sorted({_pair(t) for p in programs.values() for t in p.sends})
