"""Which first layers each stage of a device-group candidate recomputes so that every device fits
(strategy.recompute=auto on interleaved 1F1B and Chimera, whose backward is not split).

A stage [a, z) that recomputes its first k layers keeps, per micro-batch, the input it received and
the saves of layers a + k .. z - 1, and holds max(0, head - tail) more during its backward (one
segment at the stage's start: ModelProfile.first_layers_recomputed); its backward runs the head's
forward again. What a rank holds at each step of its order does not depend on the times: only on
how many micro-batches each of its stages has in flight there (rank_simulate.py's peak: after a
forward, the kept bytes and a step's workspace; during a backward, the kept bytes, the segment's
extra and the workspace). So each rank's peak is the most, over its steps, of a sum linear in what
its stages keep, and the peaks of any choice of counts are read off a table per rank without a
simulation.

The choice: none where every activation kept fits (read off the same table: the candidate is then
simulated once, keeping them, where before a candidate that did not fit was simulated twice, kept
and then recomputing every layer). Else, on each rank over its capacity, one stage's count raised
at a time, to the count that lowers what the rank holds over its capacity (summed over its steps)
most per second of forward run again, until it fits (every layer where that search sticks and
only every layer fits); then each count lowered again as far as every rank holding the stage
still fits. The candidate is then costed and simulated in full with these layers (the one cost
path): the choice only decides what the simulator is asked about. Before this, such a candidate
recomputed every layer of every stage: a stage whose group had room to keep most of its
activations ran its whole forward again.
"""

from __future__ import annotations

import math

import numpy as np

from ..profile.model_profile import ModelProfile, kept_of
from ..schedule.actions import CODE_OF, Kind
from .cost import StageSpec

_FORWARD, _BACKWARD = CODE_OF[Kind.FORWARD], CODE_OF[Kind.BACKWARD]


def _rank_steps(orders) -> tuple[tuple[tuple[int, ...], np.ndarray, np.ndarray, np.ndarray], ...]:
    """Kept on the orders (chunked.rank_orders shares one object per shape). Per rank: (its stages, counts, stage, after_forward): for each distinct step of its order that
    may set its peak, the micro-batches in flight per stage of the rank (a row), the local index of
    the stage the step runs, and whether it is a forward (kept + workspace) or a backward (kept +
    the segment's extra + workspace). Rows are unique: the peak is their most."""
    if "_recompute_steps" in orders.__dict__:
        return orders.__dict__["_recompute_steps"]
    out = []
    for r, order in enumerate(orders.encoded_orders):
        stages = orders.stages_of(r)
        local = {s: j for j, s in enumerate(stages)}
        counts = [0] * len(stages)
        rows = set()
        for code, s, _ in order:
            j = local[s]
            if code == _FORWARD:
                counts[j] += 1
                rows.add((*counts, j, 1))
            elif code == _BACKWARD:
                rows.add((*counts, j, 0))
                counts[j] -= 1
            else:  # (a split backward: its families keep their activations, never asked here)
                raise ValueError(f"schedule {orders.name!r} splits its backward: no recomputation")
        table = np.array(sorted(rows), dtype=float).reshape(-1, len(stages) + 2)
        out.append((stages, table[:, : len(stages)], table[:, -2].astype(int), table[:, -1].astype(bool)))
    orders.__dict__["_recompute_steps"] = steps = tuple(out)  # (as its cached_property tables are)
    return steps


def first_layers_to_fit(
    profile: ModelProfile,
    layout: tuple[StageSpec, ...],
    workspace: list[float],
    orders,
    held: list[float],
    capacity: float,
    micro_batch_size: int,
) -> tuple[tuple[int, ...], ...] | None:
    """Per stage, the layer positions it recomputes (its first k) so that every rank's peak fits
    `capacity` beside `held` (per rank: the weights and optimizer state of its stages), as the
    docstring says: none where keeping every activation fits, every layer where only that fits
    (the search above stuck), None where nothing fits. `layout`: the stages on the devices whose
    samples they run (Chimera: the down copy's); `workspace`: each stage's step workspace
    (StageCosts.workspace_bytes); `orders`: the candidate's RankSchedule (chunked.rank_orders)."""
    S = len(layout)
    steps = _rank_steps(orders)
    kept, extra, again = _per_count(profile, layout, micro_batch_size)
    ranks_of = [[r for r, (stages, *_) in enumerate(steps) if s in stages] for s in range(S)]
    k = [0] * S

    def values(r: int) -> np.ndarray:
        """Rank r's bytes at each of its rows under the counts k."""
        stages, counts, at, forward = steps[r]
        keep = np.array([kept[s][k[s]] for s in stages])
        top = np.array([workspace[s] + extra[s][k[s]] for s in stages])
        base = np.array([workspace[s] for s in stages])
        return counts @ keep + np.where(forward, base[at], top[at])

    def fits(r: int) -> bool:
        return held[r] + float(values(r).max()) <= capacity

    if all(fits(r) for r in range(len(steps))):
        return ((),) * S  # (keeping fits)
    # (not every layer first, to skip where even that does not fit: a stage with one micro-batch in
    # flight holds max(head, tail) beside its input, least part-way, so some counts may fit there)
    if _raise_counts(steps, k, kept, extra, again, held, capacity, values, fits) is None:
        k[:] = [len(x) - 1 for x in kept]  # every layer recomputed, where that fits
        if not all(fits(r) for r in range(len(steps))):
            return None
    # each count lowered as far as every rank holding the stage still fits: the dearest first
    for s in sorted(range(S), key=lambda s: -again[s][k[s]]):
        while k[s] > 0:
            k[s] -= 1
            if not all(fits(r) for r in ranks_of[s]):
                k[s] += 1
                break
    return tuple(tuple(range(st.start, st.start + c)) for st, c in zip(layout, k))


def _per_count(
    profile: ModelProfile, layout: tuple[StageSpec, ...], micro_batch_size: int
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per stage, over its counts k = 0 .. its layers: what a micro-batch keeps, the extra its
    backward holds, and the forward run again (ModelProfile.first_layers_recomputed, every k at once
    from the same prefix sums, the same floats; on the profile's device: only ratios matter)."""
    p, pbs = profile._prefix, profile.batch_size
    mf, m, ff, f = (np.asarray(p[key], dtype=float) for key in ("mf", "m", "ff", "f"))
    kept, extra, again = [], [], []
    for st in layout:
        n = math.ceil(micro_batch_size / st.replicas)
        a, z, h = st.start, st.stop, np.arange(st.start, st.stop + 1)
        received = profile.cut_bytes[a - 1] * n / pbs if a > 0 else 0.0
        head = kept_of(mf[h] - mf[a], m[h] - m[a], 0.0, n, pbs)
        tail = kept_of(mf[z] - mf[h], m[z] - m[h], 0.0, n, pbs)
        kept.append(received + tail)
        extra.append(np.maximum(0.0, head - tail))
        again.append((ff[h] - ff[a]) + ((f[h] - f[a]) - (ff[h] - ff[a])) * (n / pbs))
    return kept, extra, again


def _raise_counts(steps, k: list[int], kept, extra, again, held, capacity: float, values, fits) -> list[int] | None:
    """Raise the counts k in place, one stage's at a time, on each rank over capacity (the module's
    docstring) until every rank fits: k, or None where some rank's excess no count lowers."""
    S = len(k)
    for _ in range(S + 1):  # (Chimera: a stage's count may raise its other rank's peak: round again)
        over = [r for r in range(len(steps)) if not fits(r)]
        if not over:
            break
        for r in over:
            limit = capacity - held[r]
            stages, counts, at, forward = steps[r]
            while True:
                now = values(r)
                if held[r] + float(now.max()) <= capacity:
                    break
                excess = float(np.maximum(now - limit, 0.0).sum())
                best = None  # (gain per second, stage, count)
                for j, s in enumerate(stages):
                    options = np.arange(k[s] + 1, len(kept[s]))
                    if not len(options):
                        continue
                    backward = (at == j) & ~forward
                    own = counts[:, j] * kept[s][k[s]] + np.where(backward, extra[s][k[s]], 0.0)
                    new = (
                        (now - own)[:, None]
                        + counts[:, j : j + 1] * kept[s][options][None, :]
                        + np.where(backward, 1.0, 0.0)[:, None] * extra[s][options][None, :]
                    )
                    # (the rows over the limit, all of them: where two stages' rows tie at the
                    # peak, a step on one lowers its rows and so the sum, if not yet the peak)
                    gain = excess - np.maximum(new - limit, 0.0).sum(axis=0)
                    cost = again[s][options] - again[s][k[s]]
                    with np.errstate(divide="ignore", invalid="ignore"):
                        ratio = np.where(
                            gain > 0, np.where(cost > 0, gain / np.where(cost > 0, cost, 1.0), np.inf), -1.0
                        )
                    x = int(np.argmax(ratio))
                    if ratio[x] > 0 and (best is None or ratio[x] > best[0]):
                        best = (float(ratio[x]), s, int(options[x]))
                if best is None:
                    return None  # (no count lowers what this rank holds over its capacity)
                k[best[1]] = best[2]
    else:
        return None
    return k if all(fits(r) for r in range(len(steps))) else None
