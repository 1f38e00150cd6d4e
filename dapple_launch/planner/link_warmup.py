"""A warm-up fitted to each stage's link (of plain stages or of copies): how many micro-batches each
stage keeps ahead of the next, as LINKED, a warm-up depth that is no multiple of DAPPLE's."""

from __future__ import annotations

import math

from ..schedule.round_robin import copy_warmup

LINKED = 0  # a warm-up depth that is no multiple: each stage's own warm-up fitted to its link (link_warmup)


def link_warmup(costs: list, copies: tuple[int, ...], num_micro_batches: int) -> tuple[int, ...]:
    """Stage-level warm-up forwards (copy_warmup's unit) that keep each stage ahead of the next by as
    many micro-batches as their round trip over the link between them takes. In the steady phase a
    stage runs F(m + w_s) and then B(m): between its F(m) and its B(m), m crosses cut s + 1, runs
    the next stage's forward and backward and comes back, F_s + A_s + (F + B)_(s+1) + G_(s+1) + B_s,
    while the pipeline takes a micro-batch every tau (its busiest copy's compute, or its busiest
    link's sends, per micro-batch); so w_s - w_(s+1) >= that / tau, else the two stages wait on each
    other at every micro-batch. copy_warmup's depths are multiples of c_s (S - s), and its rule that a
    stage keeps at least the next one's in flight then ties neighbours wherever a stage of more copies
    comes later (GNMT-32 on 16 × 1 V100 at 10 Gbps, G 256, b 1, copies 1:1:1:1:2:1:2:1:2:1:2:1:
    316.5 ms at the fitted depths, 266.5 ms at these, 270.8 ms at the best of six per stage). Plain
    stages are copies of one each (1F1B and ZB-H1: cost.evaluate; GNMT-32 there on 8 stages, b 1:
    290.1 ms at ×3 for every stage, 289.1 ms at these)."""
    S, M = len(copies), num_micro_batches
    busy = [c.forward_s + c.backward_s + (c.input_s + c.weight_s if c.backward_s == 0 else 0.0) for c in costs]
    tau = max(x / c for x, c in zip(busy, copies))
    for s in range(S - 1):  # (the sends over cut s + 1 go over lcm(c_s, c_(s+1)) links: rank_of)
        links = math.lcm(copies[s], copies[s + 1])
        tau = max(tau, costs[s].send_activation_s / links, costs[s + 1].send_gradient_s / links)
    out = list(copy_warmup(copies, M))  # (DAPPLE's minimum per copy, never less)
    for s in range(S - 2, -1, -1):
        trip = (
            costs[s].forward_s
            + costs[s].send_activation_s
            + busy[s + 1]
            + costs[s + 1].send_gradient_s
            + (costs[s].backward_s or costs[s].input_s)
        )
        ahead = max(1, math.ceil(trip / tau)) if tau > 0 else 1
        out[s] = max(min(M - 1, out[s + 1] + ahead), out[s])
    return tuple(out)
