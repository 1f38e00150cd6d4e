"""The room memory leaves 1F1B's micro-batches in flight, under the recomputation a stage may choose:
a term of the proof's 1F1B links table (bounds.suffix_bound: reach_room). Pure numpy over the
table's cells (replicas, stop, start) of one row; the profile's prefix sums come in as arrays."""

from __future__ import annotations

import numpy as np

from ..profile.model_profile import kept_of
from .in_flight import runs_of_holds


def recompute_room(
    recompute: str,
    M: int,
    speed: float,
    pbs: int,
    prefix,
    i: int,
    z,
    n,
    t,
    forward,
    hold,
    ar,
    drain: float,
    room,
    whole,
    reach,
    best,
) -> np.ndarray:
    """`reach` (1F1B's links table's cells, (replicas, stop, start)) raised to when the stage's last
    backward and what follows it (ar: the all-reduce's rest, drain: the gradient's way back) can end
    at the least, over the recomputation the stage may choose.

    With its first k layers recomputed (cost.fit_by_recomputation: 0 under none, all under full, the
    fewest that fit under auto) a micro-batch keeps received + the rest's saves (`keeps`) from its
    forward's end to its backward's, at least `hold` (its round trip and this stage's backward), and
    the backward runs those k layers' forward again (`again`). The schedule keeps at most `in_flight`
    micro-batches at once, and the plan fits only if in_flight × keeps is within the room left by the
    weights and workspace (the segment's extra above `keeps` left out: a bound): so at most K_k at
    once, and their M holds split into K_k runs of disjoint ones (an interval graph's colouring), one
    of ceil(M / K_k) holds after the first forward. So, with X_k = max(ar - again_k, 0, drain):
        T >= max(A_k, B_k),  A_k = M (t + again_k) + X_k,  B_k = forward + ceil(M / K_k) hold + X_k.
    A_k never falls as k grows (M again_k rises at least as fast as ar - again_k falls) and B_k never
    rises (keeps falls, X_k falls): the least of max(A_k, B_k) is at the first k where A_k >= B_k or
    just before it, found by bisection per cell. Only cells that may still attain their start's least
    are bisected (`best`: the least so far per start): the others keep max(A_0, B_deepest), a bound.
    `room` and `whole` are (replicas, stop): the bytes memory leaves beside the weights and workspace,
    and what a micro-batch keeps with no layer recomputed (ModelProfile.kept_bytes). `hold` comes in its
    three parts (way on, the rest's passes, this stage's backward), summed only at the cells raised
    here: most of a row's are not."""
    fwd_fixed, fwd, kept, kept_fixed, cut = prefix
    shape = reach.shape
    # Where memory leaves room for all M micro-batches whole (K_0 >= M) the k = 0 term is within
    # `reach` already (trip >= forward + hold), and no count is less: those stages are done. And a
    # cell at or above its start's least so far cannot attain it, raised or not.
    tight = room < M * whole * (1 - 1e-9)
    if not tight.any():
        return reach
    cells = np.flatnonzero(
        (tight[:, :, None] & np.isfinite(np.broadcast_to(t, shape)) & (reach < best[None, None, :])).ravel()
    )
    out = reach.copy()
    if cells.size == 0:
        return out
    ri, zi, di = np.unravel_index(cells, shape)
    stop, samples = np.asarray(z)[zi], np.asarray(n, dtype=float)[ri]
    m = samples / pbs
    t_c, f_c = t[ri, zi, 0], forward[ri, zi, 0]
    way_on, passes, backward_c = (np.broadcast_to(x, shape)[ri, zi, di] for x in hold)
    hold_c, ar_c = (way_on + passes) + backward_c, np.broadcast_to(ar, shape)[ri, zi, di]
    r = room[ri, zi]
    received = cut[i] * samples / pbs  # (ModelProfile.first_layers_recomputed's operations)

    def sides(k, at: slice | np.ndarray = slice(None)):
        """(A_k, B_k) of the cells `at` at their counts k."""
        j, st, mm = i + k, stop[at], m[at]
        again = ((fwd_fixed[j] - fwd_fixed[i]) + (fwd[j] - fwd[i]) * mm) * speed
        keeps = received[at] + kept_of(kept_fixed[st] - kept_fixed[j], kept[st] - kept[j], 0.0, samples[at], pbs)
        runs = runs_of_holds(r[at], keeps, M)
        with np.errstate(invalid="ignore"):
            after = np.maximum(np.maximum(ar_c[at] - again, 0.0), drain)
            a_side = M * (t_c[at] + again) + after
            b_side = np.where(np.isfinite(runs), f_c[at] + runs * hold_c[at] + after, np.inf)
        return a_side, b_side

    deepest = stop - i
    if recompute != "auto":  # one count: none or every layer
        a_side, b_side = sides(np.zeros_like(deepest) if recompute == "none" else deepest)
        out.flat[cells] = np.maximum(out.flat[cells], np.maximum(a_side, b_side))
        return out
    base = out.flat[cells]
    a0, b0 = sides(np.zeros_like(deepest))
    value = a0  # (k = 0 attains the least where A_0 >= B_0: memory leaves room for every micro-batch)
    rest = np.flatnonzero(a0 < b0)
    out.flat[cells] = np.maximum(base, value)
    if rest.size == 0:
        return out
    ad, bd = sides(deepest[rest], rest)
    low = np.maximum(a0[rest], bd)  # every count's max(A_k, B_k) is at least this
    high = np.minimum(b0[rest], np.maximum(ad, bd))  # and some count's at most this
    value[rest] = low
    # a cell may attain its start's least only below every other cell's high there
    upper = out.copy()
    upper.flat[cells[rest]] = np.maximum(base[rest], high)
    least = np.minimum(upper.min(axis=(0, 1)), best)[di[rest]]
    sel = rest[(np.maximum(base[rest], low) < least) & (low < high)]
    if sel.size:
        lo, hi = np.ones(sel.size, dtype=deepest.dtype), deepest[sel] + 1  # first k with A_k >= B_k (hi: none)
        while True:
            live = lo < hi
            if not live.any():
                break
            mid = np.where(live, (lo + hi) // 2, 0)
            a_side, b_side = sides(mid, sel)
            crossed = a_side >= b_side
            hi = np.where(live & crossed, mid, hi)
            lo = np.where(live & ~crossed, mid + 1, lo)
        a_at, _ = sides(np.minimum(lo, deepest[sel]), sel)
        _, b_before = sides(lo - 1, sel)
        value[sel] = np.minimum(np.where(lo <= deepest[sel], a_at, np.inf), b_before)
    out.flat[cells] = np.maximum(base, value)
    return out
