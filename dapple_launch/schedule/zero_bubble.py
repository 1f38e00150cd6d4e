"""Zero bubble, handcrafted H1 (Qi et al., ICLR'24): the backward split into I and W.

A stage's input gradient (I) is what the previous stage waits for; its weight gradients (W) are
waited for by nobody until the all-reduce. ZB-H1 keeps 1F1B's order of forwards and input
gradients and moves the W's into the bubbles 1F1B leaves: stage s runs S - s - 1 warm-up forwards
(as 1F1B), then pairs F, I and keeps up to s W's pending (each W runs s steady steps after its I),
then in the cool-down runs one pending W after each I (where 1F1B idles waiting for the next
gradient), then the rest. A micro-batch's activations live until its W, so stage s holds at most
(S - s - 1) + 1 + s = S micro-batches: 1F1B's peak on stage 0, on every stage. With unit costs
T_F = T_I = T_W the bubble falls from 1F1B's (S - 1)(T_F + T_B) to (S - 1)(T_F + T_I - T_W).
"""

from __future__ import annotations

from collections import deque

from .actions import Action, Kind, Schedule, actions_of, with_communication


def zb_h1(num_stages: int, num_micro_batches: int, warmup: tuple[int, ...] | None = None) -> Schedule:
    """`warmup[s]`: forwards stage s runs before its first I (default S - s - 1, as 1F1B; deeper, as
    one_f_one_b.deeper_warmup, lets a stage run ahead of slow links for warmup[s] + 1 + s micro-batches
    of memory: with twice the minimum this is the paper's ZB-H2 warm-up)."""
    if num_micro_batches < 1:
        raise ValueError(f"ZB-H1 needs at least 1 micro-batch, got {num_micro_batches}")
    S, M = num_stages, num_micro_batches
    if warmup is not None:
        warmup = tuple(warmup)
        check_warmup("ZB-H1", warmup, S, M, [min(S - s - 1, M) for s in range(S)])
    return with_communication("zb_h1", compute_orders(S, M, warmup), M)


def check_warmup(name: str, warmup: tuple[int, ...], num_stages: int, num_micro_batches: int, example: list) -> None:
    """A stage-level warm-up (ZB-H1's, or the orders copies filter) or a ValueError naming the rule:
    between min(S - s - 1, M) and M forwards on stage s, never fewer than on the next stage."""
    S, M = num_stages, num_micro_batches
    least = [min(S - s - 1, M) for s in range(S)]
    if (
        len(warmup) != S
        or any(not least[s] <= w <= M for s, w in enumerate(warmup))
        or any(warmup[s] < warmup[s + 1] for s in range(S - 1))
    ):
        raise ValueError(
            f"{name} warm-up {list(warmup)} is not valid for {S} stages and {M} micro-batches: stage s "
            f"needs between min(S - s - 1, M) and M warm-up forwards, never fewer than the next stage; "
            f"e.g. {list(example)}"
        )


def compute_orders(
    num_stages: int, num_micro_batches: int, warmup: tuple[int, ...] | None = None
) -> list[list[Action]]:
    S, M = num_stages, num_micro_batches
    return [stage_order(s, M, min(S - s - 1, M) if warmup is None else warmup[s]) for s in range(S)]


def stage_order(stage: int, num_micro_batches: int, warm: int) -> list[Action]:
    """Stage `stage`'s ZB-H1 order after `warm` warm-up forwards (it holds back `stage` W's): all a
    stage's order depends on."""
    M = num_micro_batches
    forward, input_grad = actions_of(Kind.FORWARD, M), actions_of(Kind.INPUT_GRAD, M)
    weight_grad = actions_of(Kind.WEIGHT_GRAD, M)
    order = list(forward[:warm])
    pending: deque[int] = deque()
    next_f, next_i = warm, 0
    while next_f < M:  # steady: F, I, and the W that has waited s steps
        order += (forward[next_f], input_grad[next_i])
        pending.append(next_i)
        next_f, next_i = next_f + 1, next_i + 1
        if len(pending) > stage:
            order.append(weight_grad[pending.popleft()])
    while next_i < M:  # cool-down: a W fills the wait for each next gradient
        order.append(input_grad[next_i])
        pending.append(next_i)
        next_i += 1
        order.append(weight_grad[pending.popleft()])
    order += [weight_grad[m] for m in pending]
    return order


def in_flight(stage: int, num_stages: int, num_micro_batches: int, warmup: tuple[int, ...] | None = None) -> int:
    """Most micro-batches whose activations stage `stage` holds at once (F to W): its warm-up, the
    one of the steady pair, and the s W's it holds back."""
    warm = min(num_stages - stage - 1, num_micro_batches) if not warmup else warmup[stage]
    return min(warm + 1 + stage, num_micro_batches)
