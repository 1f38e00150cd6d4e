"""Round-robin stage copies (PipeDream's 1F1B-RR): a stage's devices form c copies, each running
whole micro-batches, micro-batch m on copy m mod c.

Splitting every micro-batch of b samples across a stage's r replicas wastes replicas whenever r does
not divide b: each runs ceil(b / r) samples, so 11 replicas do no more per micro-batch of 8 than 8
would. Copies fix the granularity at the level of micro-batches instead: over M micro-batches copy
k runs ceil((M - k) / c) of them, so 11 single-device copies of a stage share 128 micro-batches
12:12:…:11 rather than 16 each. A copy of r / c devices still splits its micro-batches among them
(copies of 1 device are PipeDream's replicas; one copy of r devices is DAPPLE's stage).

Orders: each stage runs the stage-level order of its family (1F1B, or ZB-H1 with W split off) at a
warm-up deep enough for its copies (`warmup`), and copy k of stage s runs that order's steps of
its own micro-batches, in the same order. Every copy's order is a subsequence of a valid stage
order, so the ranks run to the end (the stage-level run orders every step after its inputs); a
channel between two copies carries its micro-batches in increasing order both ways, the order both
ends use. Ranks are numbered stage by stage, copy by copy: stage s's copy k is rank
sum(c[:s]) + k, and a stage's gradients are all-reduced over all its copies' devices.
"""

from __future__ import annotations

from functools import lru_cache

from .actions import CODE_OF
from .ranks import RankSchedule, Step, shared_step

RR_FAMILIES = {"1f1b_rr": "1f1b", "zb_h1_rr": "zb_h1"}  # family -> the stage-level order its copies filter


def round_robin_constraint(copies: tuple[int, ...], num_micro_batches: int) -> str:
    """'' when every copy gets a micro-batch; else the rule, the numbers and the fix."""
    if not copies or any(c < 1 for c in copies):
        return f"stage copies must be positive integers, one per stage; got {list(copies)}"
    widest = max(copies)
    if num_micro_batches < widest:
        return (
            f"a stage of {widest} copies needs at least {widest} micro-batches (one per copy), got "
            f"{num_micro_batches}; use {widest} or more micro-batches, or fewer copies"
        )
    return ""


def copy_warmup(copies: tuple[int, ...], num_micro_batches: int, depth: int | tuple[int, ...] = 1) -> tuple[int, ...]:
    """Stage-level warm-up forwards that keep `depth` × (S - s) micro-batches in flight on each copy
    of stage s (DAPPLE's minimum per copy at depth 1): c_s times that on the stage, capped at M, and
    never fewer than the next stage's (the stage-level order's rule: a stage feeds the next one's
    warm-up before it waits for a gradient). `depth`: one for every stage, or one per stage (a stage
    whose copies wait on a slow link wants more in flight than its neighbours)."""
    S, M = len(copies), num_micro_batches
    depths = (depth,) * S if isinstance(depth, int) else tuple(depth)
    if len(depths) != S or min(depths) < 1:
        raise ValueError(
            f"warm-up depth must be >= 1 (1 = DAPPLE's minimum per copy), one or one per stage ({S}), got {depth}"
        )
    out = [0] * S
    for s in range(S - 2, -1, -1):
        out[s] = max(min(M, copies[s] * depths[s] * (S - s)) - 1, out[s + 1], min(S - s - 1, M))
    return tuple(out)


def deepest_copy_depth(copies: tuple[int, ...], num_micro_batches: int, stage: int) -> int:
    """The least depth at which copy_warmup runs every forward of `stage` before its first backward
    (deeper changes nothing)."""
    return max(1, -(-num_micro_batches // (copies[stage] * (len(copies) - stage))))


def round_robin(
    family: str, copies: tuple[int, ...], num_micro_batches: int, warmup: tuple[int, ...] | None = None
) -> RankSchedule:
    """The rank orders of `family` (1f1b_rr or zb_h1_rr) with `copies[s]` copies of stage s; `warmup`:
    the stage-level warm-up forwards (as 1F1B's; default copy_warmup at depth 1)."""
    from .zero_bubble import check_warmup

    if family not in RR_FAMILIES:
        raise ValueError(f"unknown round-robin family {family!r}; valid: {sorted(RR_FAMILIES)}")
    copies, M = tuple(copies), num_micro_batches
    why = round_robin_constraint(copies, M)
    if why:
        raise ValueError(why)
    S = len(copies)
    warmup = copy_warmup(copies, M) if not warmup else tuple(warmup)
    check_warmup(family, warmup, S, M, list(copy_warmup(copies, M)))
    orders, encoded, work, route, placement, first = [], [], [], [], [], 0
    for s, c in enumerate(copies):
        steps, codes, tallies = _copies_of(family, s, M, warmup[s], c)
        orders += steps
        encoded += codes
        work += tallies
        route.append([first + m % c for m in range(M)])
        placement.append(tuple(range(first, first + c)))
        first += c
    schedule = RankSchedule(family, S, M, tuple(orders), tuple(placement))
    return schedule.with_tables(tuple(encoded), tuple(work), route)


@lru_cache(maxsize=1024)  # (a few hundred a search)
def _copies_of(family: str, stage: int, num_micro_batches: int, warm: int, copies: int):
    """Stage `stage`'s order (its family's stage order after `warm` warm-up forwards) among its
    copies, copy k running micro-batches k, k + c, ... in that order: per copy its steps, their
    encoding and its work (RankSchedule's tables). A search's candidates differ in a stage or two,
    so most stages' (copies, warm-up) come again: building and encoding every step anew cost as
    much as simulating them."""
    made, encoded = _stage_steps(family, stage, num_micro_batches, warm)
    steps: list[list[Step]] = [[] for _ in range(copies)]
    codes: list[list[tuple[int, int, int]]] = [[] for _ in range(copies)]
    for step, code in zip(made, encoded):
        k = code[2] % copies
        steps[k].append(step)
        codes[k].append(code)
    # (every micro-batch runs each of the order's kinds once, on its copy)
    kinds = sorted({code for code, _, _ in encoded})
    runs = [len(range(k, num_micro_batches, copies)) for k in range(copies)]
    work = tuple(tuple((code, stage, n) for code in kinds) for n in runs)
    return tuple(map(tuple, steps)), tuple(map(tuple, codes)), work


@lru_cache(maxsize=512)
def _stage_steps(family: str, stage: int, num_micro_batches: int, warm: int):
    """The stage's order as steps and as their encoding (kind code, stage, micro-batch), made once
    for every split of it among copies."""
    from .one_f_one_b import stage_order as one_f_one_b_order
    from .zero_bubble import stage_order as zero_bubble_order

    M = num_micro_batches
    order = one_f_one_b_order(M, warm) if RR_FAMILIES[family] == "1f1b" else zero_bubble_order(stage, M, warm)
    made = tuple(shared_step(a.kind, stage, a.micro_batch) for a in order)
    return made, tuple((CODE_OF[a.kind], stage, a.micro_batch) for a in order)


def rank_of(copies: tuple[int, ...], stage: int, micro_batch: int) -> int:
    """The rank (copy) of `stage` that runs `micro_batch`."""
    return sum(copies[:stage]) + micro_batch % copies[stage]


__all__ = ["RR_FAMILIES", "copy_warmup", "deepest_copy_depth", "rank_of", "round_robin", "round_robin_constraint"]
