"""The search pass over stages of round-robin copies (costed by round_robin.py).

Search: from the best plans the exact passes found (their cuts and replica counts) and layouts of
2 to 4 stages of even device counts, each micro-batch size a copy could help and each warm-up depth,
in two tiers (copies that cut the start's busiest compute; where the start waits on its transfers,
copies that only pipeline them), each followed by a local search from its best at each stage count
(a replica moved between two stages, a cut moved by one layer), a move whose busiest copy alone
cannot win left unsimulated; a third tier, both tiers' layouts at each stage's
own depth fitted to its round trip (round_robin.fitted_depths). The winner then descends over its
stages' own warm-up depths and walks its layouts under them, while either helps. Last, on top of
the budget, the bound's own layouts (below: where its stages and links fit, per micro-batch size)
at their fitted depths, and then per small size and stage count the layout whose slowest stage
(compute, all-reduce, busiest link) is least over every cut and device count at once
(copies_proxy.least_slowest_layouts); the best of the first, and of the second those of the two
best stage counts, finished as the winner is; and from the winner, one stage's devices cut to one
or to half (shrink: a stage whose all-reduce outweighs its compute, which no walk reaches); and
those layouts with each stage's warm-up fitted to its link (link_warmup.py), walked from the best.
Bound over the families, per micro-batch size b, the greater of two: each device runs whole
copy-micro-batches, so the M micro-batches' work over all layers, each layer at its cheapest copy
size g (g devices running ceil(b / g) samples each), is shared by at most D devices:
T >= (M / D) Σ_l min_g g t_l(ceil(b / g)), the compute bound at this granularity; and the least
slowest stage over every cut and device count, its fill, busiest copy and exposed all-reduce
counted (copies_bound.py), which sees that stages are contiguous and that replicas all-reduce;
where an incumbent is given, over layouts with a stage of copies only (the search returns no other).
"""

from __future__ import annotations

import math

import numpy as np

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import SPLIT_BACKWARD
from ..schedule.round_robin import copy_warmup, deepest_copy_depth, round_robin_constraint
from .copies_bound import CopiesBound
from .copies_proxy import balance_cuts, compute_floor, least_slowest_layouts, proxy, share_devices, stage_loads
from .cost import Costed, StageSpec, speed_ratio
from .limits import Limits
from .link_warmup import LINKED
from .polish import depth_steps
from .proposal import Proposal, SearchState
from .round_robin import RR, canonical_copies, evaluate_rr, fitted_depths, rr_costs

START_PLANS = 4  # distinct layouts of the exact passes' best plans the pass starts from
SLACK = 1.25  # how much slower than the incumbent a start of the local search may be
SIZES = 3  # micro-batch sizes (the smallest) the pass re-shares each start's devices for
MOVES_SIMULATED = 6  # per step of the local search, the moves the proxy ranks best
PIPELINED = 8  # of the second tier's layouts, the fewest-compute tried
TRANSFER_SHARE = 0.1  # of a start's time a stage of it sends for, where copies that cut no compute are tried
STAGE_COUNTS = 4  # starts of 2 to this many stages of even device counts, whatever the exact passes kept
SPARE = 0.125  # of the budget, for the walks from each tier's best at its other stage counts
RELAXED = 0.25  # of the budget, on top of it, for the relaxation's own layouts and the finish of their best
FINISH = 0.25  # of the budget, kept for the winner's finish (its warm-ups, families and own depths)
LEAST = 0.5  # of the budget, on top of it, for the layouts of least slowest stage and the finish of their best
LEAST_STAGES = 8  # the most stages those layouts have
LEAST_FINISHED = 2  # of those, the best of this many stage counts finished
LEAST_DEVICES = 64  # up to this many devices (its tables and shares grow with D: BERT-96 on 1024 A100s, +31 % CPU)
SHRINK = 0.25  # of the budget, on top of it, for the winner's stages shrunk and the finish of the best
LINKS = 0.25  # of the budget, on top of it, for the warm-ups fitted to the links and the walk from their best
SHRUNK = 8  # per step of that pass, the shrunk layouts the proxy ranks best, simulated
FEW_SHRUNK = 4  # up to this many times SHRUNK shrunk layouts, each is ranked, not only those the screen passes
STEPS_PER_NODE = 25  # (stage, micro-batch) steps this pass may simulate per strategy.search_nodes


def _depth_of(c: Costed) -> int | tuple[int, ...]:
    """The warm-up depth a candidate of copies was costed at: one for all stages, or one per stage."""
    return c.extra.get("depths", c.warmup_depth)


def contiguous(bounds: tuple[int, ...], replicas: tuple[int, ...]) -> tuple[StageSpec, ...]:
    """Stages [bounds[s], bounds[s + 1]) on contiguous devices in stage order (copies: consecutive
    runs of a stage's devices, so a copy of a node's size or less stays inside a node where it can)."""
    out, first = [], 0
    for s, r in enumerate(replicas):
        out.append(StageSpec(bounds[s], bounds[s + 1], tuple(range(first, first + r))))
        first += r
    return tuple(out)


def granularity_bound(profile: ModelProfile, topology: Topology, global_batch: int, b: int, memo: dict) -> float:
    """T >= (M / D) Σ_l min_g g t_l(ceil(b / g)): no plan of copies at micro-batch size b is faster
    (each device runs whole copy-micro-batches, one step at a time)."""
    D, M = topology.num_devices, global_batch // b
    speed = speed_ratio(profile, topology)
    key = ("granularity", b)
    if key not in memo:
        per_g = []
        for g in sorted({math.ceil(b / n) for n in range(1, b + 1)} | {1}):
            g = min(g, D)
            n = math.ceil(b / g)
            per_g.append(np.array([sum(profile.seconds(l, l + 1, n)) for l in range(profile.num_layers)]) * g * speed)
        memo[key] = float(np.min(per_g, axis=0).sum())
    return M / D * memo[key]


def layout_bounds(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    sizes: list[int],
    incumbent: float,
    memo: dict,
    lower: dict[int, float] | None = None,
) -> tuple[dict[int, float], dict[int, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """Per micro-batch size, the greater of the compute bound at its granularity and the least
    slowest stage over every cut and device count (copies_bound.py), the latter only up to what
    decides the gap: sizes in increasing compute bound, each only up to the least bound so far
    (or the incumbent), since a size whose stages cannot fit below it leaves the gap as it is.
    And per size whose relaxation fit under that, its own layout (CopiesBound.relaxed_layout:
    stops, device counts), a start for the search. `lower`: filled, per size, with its bound
    without the stages' paths (copies_paths.py; Proposal.lower)."""
    speed = speed_ratio(profile, topology)
    capacity = topology.device_memory_bytes * (1 - limits.memory_headroom)
    floor = {b: granularity_bound(profile, topology, global_batch, b, memo) for b in sizes}
    out: dict[int, float] = {}
    relaxed = {}
    least = incumbent
    for b in sorted(sizes, key=lambda b: (floor[b], b)):
        if floor[b] >= least:
            out[b] = floor[b]
            if lower is not None:
                lower[b] = floor[b]
            continue
        cut = CopiesBound(
            profile,
            topology,
            global_batch,
            b,
            speed,
            limits.optimizer_factor,
            capacity,
            incumbent < math.inf,
            keeps_activations=limits.recompute not in ("full", "selective"),  # (evaluate_rr's recompute_sets)
        )
        out[b] = cut.bound(above=floor[b], cap=least)
        if lower is not None:
            lower[b] = min(out[b], cut.before_paths)
        least = min(least, out[b])
        layout = cut.relaxed_layout()
        if layout is not None:
            relaxed[b] = layout
    return out, relaxed


def may_win(bound: float, incumbent: float, best: Costed | None) -> bool:
    """Whether a plan of copies at one micro-batch size may still win: its bound there (over every
    layout with a stage of copies at that size, so over whatever a walk reaches from one: no walk
    changes the size) is below both the incumbent and the best plan of copies so far."""
    return bound < min(incumbent, best.iteration_s if best is not None else math.inf)


def search_round_robin(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    sizes: list[int],
    starts: list[Costed],
    families: list[str],
    incumbent: float,
    lower: dict[int, float] | None = None,
) -> tuple[list[Costed], dict[int, float], int]:
    """(candidates found, bound per micro-batch size, candidates simulated). `lower`: filled with
    the bounds without the stages' paths (layout_bounds)."""
    memo: dict = {}
    # a budget of simulated steps, not candidates: a candidate's simulation walks every (stage,
    # micro-batch) step, so 512 devices' 35 stages × 1024 micro-batches cost what 100 small ones do
    budget = max(STEPS_PER_NODE * 1000, limits.search_nodes * STEPS_PER_NODE)
    scored, walked = 0, 0
    # The tiers may spend all but FINISH of it (the winner's finish gains the most per step: VGG-19
    # on 16 × 1 V100 at 10 Gbps, G 1024, 356.6 -> 337.3 ms); the walks at other stage counts spend
    # SPARE on top of it.
    full = budget
    limit = budget - int(FINISH * budget)
    spare = int(SPARE * budget)
    bounds, relaxed = layout_bounds(profile, topology, global_batch, limits, sizes, incumbent, memo, lower)
    best: Costed | None = None
    if not any(may_win(bounds[b], incumbent, None) for b in sizes):  # (no size where copies may win)
        return [], bounds, 0
    # the local search walks from the best plan of copies even where it starts slower than the
    # incumbent (a plain stage's layout is rarely the right one for copies): within SLACK of it
    cut = incumbent * SLACK

    # each candidate simulated once: the local search's moves and the winner's warm-ups come back to
    # candidates already costed (VGG-19 on 64 A100s: 5 of 42). Each is kept with the cutoff it was
    # simulated under: one cut off then loses again under any cutoff no higher.
    costed: dict[tuple, tuple[Costed | None, float]] = {}

    def consider(layout, b, family, depth, cutoff: float) -> Costed | None:
        nonlocal best, cut, scored, walked
        M = global_batch // b
        copies = tuple(canonical_copies(st.replicas, b) for st in layout)
        # (all copies of one: the plain stage, which the exact passes cost, unless they are not asked)
        if (
            (all(c == 1 for c in copies) and incumbent < math.inf)
            or round_robin_constraint(copies, M)
            or walked >= limit
        ):
            return None
        key = (layout, b, family, depth)
        if key in costed:
            c, under = costed[key]
            if c is not None or cutoff <= under:
                return c if c is not None and c.fits else None
        c = evaluate_rr(profile, topology, layout, copies, b, M, limits, family, depth, cutoff=cutoff, memo=memo)
        costed[key] = (c, cutoff)
        scored += 1
        walked += M * len(layout) * (3 if family in SPLIT_BACKWARD else 2)
        if c is None or not c.fits:
            return None
        if c.iteration_s < cut:
            best, cut = c, c.iteration_s
        return c

    def walk(here: Costed) -> Costed:
        """Local search from `here`: 1 to 3 devices moved between two stages (the cuts kept, or
        re-balanced for the new counts), a cut moved by one layer; the moves the proxy ranks best are
        simulated, and the walk goes on from the best of them while it is faster than where it stands;
        returns where it ends."""
        done = set()
        while walked < limit:
            stops, replicas = tuple(st.stop for st in here.layout), tuple(st.replicas for st in here.layout)
            S, b = len(stops), here.micro_batch_size
            moves = set()
            shifted = []
            for i in range(S):
                for j in range(S):
                    for k in (1, 2, 3):
                        if i != j and replicas[j] > k:
                            r = list(replicas)
                            r[i], r[j] = r[i] + k, r[j] - k
                            shifted.append((proxy(profile, topology, global_batch, stops, tuple(r), b, memo), tuple(r)))
            for _, r in sorted(shifted)[:MOVES_SIMULATED]:  # the best few shifts, with their cuts kept and re-balanced
                moves.add((stops, r))
                moves.add((balance_cuts(profile, topology, global_batch, r, b, memo), r))
            for k in range(S - 1):
                for d in (-1, 1):
                    st = list(stops)
                    st[k] += d
                    if (st[k - 1] if k else 0) < st[k] < st[k + 1]:
                        moves.add((tuple(st), replicas))
            ranked = sorted(
                (m for m in moves if m not in done),
                key=lambda m: (proxy(profile, topology, global_batch, m[0], m[1], b, memo), m),
            )
            step = here
            for st, r in ranked[:MOVES_SIMULATED]:
                done.add((st, r))
                c = consider(contiguous((0, *st), r), b, here.schedule, _depth_of(here), step.iteration_s)
                if c is not None and c.iteration_s < step.iteration_s:
                    step = c
            if step is here:
                return here
            here = step
        return here

    def deepen(here: Costed) -> Costed:
        """Steepest descent over the stages' own warm-up depths from `here` (its layout kept): a stage
        whose copies wait on a slow link needs more micro-batches in flight than one depth for all
        gives it without deepening its neighbours too, whose copies then run every forward before a
        backward and send their gradients one after another (VGG-19 on 16 × 1 V100 at 10 Gbps, G 64,
        copies 8:3:4:1 cut@12,14,17 at b 1: 79.8 ms at the best common depth, 60.6 ms at depths
        2:4:1). Each move takes one stage's depth a step along polish.DEPTHS, or to where it runs
        every forward first."""
        copies, M, S = here.extra["copies"], here.num_micro_batches, len(here.layout)
        if here.warmup_depth == LINKED and "depths" not in here.extra:
            return here  # (a warm-up fitted to the links is no depth to descend from)
        depths = (*here.extra.get("depths", (here.warmup_depth,) * S)[:-1], 1)  # (the last's is never read)
        tried = {here.warmup}
        while walked < limit:
            step, step_depths = here, depths
            for s in range(S - 1):  # (the last stage runs no warm-up)
                top = deepest_copy_depth(copies, M, s)
                at = depths[s]
                lower, higher = depth_steps(at, top)
                for d in {*lower[-1:], *higher[:1], top} - {at}:
                    new = depths[:s] + (d,) + depths[s + 1 :]
                    warmup = copy_warmup(copies, M, new)
                    if warmup in tried:
                        continue
                    tried.add(warmup)
                    c = consider(here.layout, here.micro_batch_size, here.schedule, new, step.iteration_s)
                    if c is not None and c.iteration_s < step.iteration_s:
                        step, step_depths = c, new
            if step is here:
                return here
            here, depths = step, step_depths
        return here

    seen = set()
    shapes = []
    for c in sorted(starts, key=lambda c: (c.iteration_s, c.summary())):
        key = (tuple(st.stop for st in c.layout), tuple(st.replicas for st in c.layout))
        if key in seen or len(seen) == START_PLANS:
            continue
        seen.add(key)
        # the start's busiest device's compute, and whether a stage of it sends for a share of its time
        floor = max(c.num_micro_batches * (x.forward_s + x.backward_s) for x in c.costs)
        sends = max(c.num_micro_batches * (x.send_activation_s + x.send_gradient_s) for x in c.costs)
        shapes.append((*key, floor, sends >= TRANSFER_SHARE * c.iteration_s))
    depths = range(1, limits.max_warmup_depth + 1)
    # copies pay where micro-batches are small against the replica counts: the few smallest sizes
    small = sorted(b for b in sizes if b * START_PLANS <= topology.num_devices)[:SIZES] or sorted(sizes)[:1]
    # Starts of 2 to STAGE_COUNTS stages, each of even device counts and cuts balanced for them:
    # which layouts the exact passes kept depends on when their incumbent fell (VGG-19 on 16 × 1
    # V100 at 10 Gbps, G 1024: with the baselines as the first incumbent, no start of three stages
    # survived, and the copies' plan was 392.1 ms against 337.3 ms without them), and the walk
    # never changes a layout's stage count. Each joins the tiers as leniently as the kept starts do.
    if shapes:
        D = topology.num_devices
        floor, transfers = max(x[2] for x in shapes), any(x[3] for x in shapes)
        for S in range(2, min(D, profile.num_layers, STAGE_COUNTS) + 1):
            even = tuple(D // S + (k < D % S) for k in range(S))
            st = balance_cuts(profile, topology, global_batch, even, small[0], memo)
            key = (st, even)
            if key not in seen:
                seen.add(key)
                shapes.append((*key, floor, transfers))
    # Two tiers of layouts from each start, each searched on its own (its candidates, then a local
    # search from its best): those whose busiest copy computes less than the start's busiest device
    # (a replica count that does not divide the micro-batch, or more replicas than samples); then,
    # from a start with a stage that sends for TRANSFER_SHARE of its time or more, those that cut no
    # compute but may pipeline its transfers at a smaller micro-batch (VGG-19 on 16 × 1 V100 at
    # 10 Gbps, G 128: the start's own cuts and devices at b = 1 beat it by a third). Apart, since
    # the second tier's better start may walk to a worse plan than the first's (VGG-19 on 16 × 1
    # V100, G 64: from the start's own devices at b = 1, 37.0 ms, to 35.4 ms; from the first tier's
    # 49.7 ms, to 35.0 ms).
    tiers: tuple[list, list] = ([], [])
    for stops, replicas, floor, transfers in shapes:
        tried = set()
        layouts = [(stops, replicas, b) for b in small]
        for b in small:  # the start's cuts, its devices re-shared for copies; then cuts for those, and again
            layouts.append((balance_cuts(profile, topology, global_batch, replicas, b, memo), replicas, b))
            st, r = stops, None
            for _ in range(3):
                r = share_devices(profile, topology, global_batch, st, b, memo, r)
                if r is None:
                    break
                st = balance_cuts(profile, topology, global_batch, r, b, memo)
                layouts.append((st, r, b))
        for st, r, b in layouts:
            if (st, r, b) in tried or r is None:
                continue
            tried.add((st, r, b))
            least = compute_floor(profile, topology, global_batch, st, r, b)
            if incumbent == math.inf or least < floor:
                tiers[0].append((least, st, r, b))
            elif transfers and least < (1 - TRANSFER_SHARE) * incumbent:  # (room to hide transfers)
                tiers[1].append((least, st, r, b))
    tiers[1].sort(key=lambda x: x[0])  # (of the second, the PIPELINED of least compute)
    del tiers[1][PIPELINED:]
    for tier in tiers:
        heres: dict[int, Costed] = {}  # per stage count, its best of the tier
        for least, st, r, b in tier:
            cutoff = heres[len(r)].iteration_s if len(r) in heres else incumbent * SLACK
            if least >= cutoff:  # its busiest copy's compute alone reaches the cutoff
                continue
            # at the deepest warm-up first (copies keep fewer micro-batches in flight each; the winner tries every depth)
            c = consider(contiguous((0, *st), r), b, families[-1], depths[-1], cutoff)
            if c is not None and c.iteration_s < cutoff:
                heres[len(r)] = c
        ranked = sorted(heres.values(), key=lambda c: (c.iteration_s, c.summary()))
        for here in ranked[:1]:
            walk(here)
        for here in ranked[1:]:  # the walk keeps its stage count: one from each count's best too
            if here.iteration_s < cut * SLACK and spare > 0:
                before, main = walked, limit
                limit = walked + spare
                walk(here)
                spent = walked - before
                spare, limit, budget = spare - spent, main + spent, budget + spent
    # a third tier: both tiers' layouts at the depths that cover each stage's round trip
    # (fitted_depths), where those differ from stage to stage, walked on their own
    here, cutoff = None, incumbent * SLACK
    own_depths = limits.max_warmup_depth > 1  # (max_warmup_depth=1: DAPPLE's minimal warm-up only)
    for least, st, r, b in (tiers[0] + tiers[1]) if own_depths else []:
        copies = tuple(canonical_copies(x, b) for x in r)
        layout = contiguous((0, *st), r)
        fitted = fitted_depths(rr_costs(profile, topology, layout, copies, b, memo), copies, global_batch // b)
        if least < cutoff and len(set(fitted[:-1])) > 1:
            c = consider(layout, b, families[-1], (*fitted[:-1], 1), cutoff)
            if c is not None and c.iteration_s < cutoff:
                here, cutoff = c, c.iteration_s
    if here is not None:
        walk(here)

    def finish(here: Costed) -> Costed:
        """From `here`: its layout under every family and warm-up depth, then the warm-ups its
        stages want and the layouts under them, while either helps; returns where it ends."""
        for family in families:
            for depth in depths:
                c = consider(here.layout, here.micro_batch_size, family, depth, here.iteration_s)
                if c is not None and c.iteration_s < here.iteration_s:
                    here = c
        while own_depths:
            there = walk(deepen(here))
            if there is here or walked >= budget:
                return there
            here = there
        return here

    limit = budget
    if best is not None:  # the winner's finish
        finish(best)

    def shrink(here: Costed) -> Costed:
        """From `here`: one stage's devices cut to one or to half, those freed left idle or given to
        another stage, where that lowers the stage's own load (its all-reduce outweighs what its
        compute grows by) or the slowest stage's (the proxy: a move of many devices at once, which
        the walk's of one to three never makes), or every one where they are few (FEW_SHRUNK times
        SHRUNK; a fuzz case of three stages on 4:8:4 devices went to 4:4:4, 0.85 -> 0.79 ms, its
        middle stage's all-reduce inside a node, which the proxy ranks worse). The SHRUNK best by
        the proxy, their cuts kept and balanced for the new counts, are simulated, and from the best
        of them that is faster, its finish, while one is. No walk gets there a few devices at a time, as each step adds compute
        and saves little of the all-reduce (VGG-19 on 8 x 8 A100, G 64: its classifier's first
        layer, 411 MB of weights, on 8 devices, 4.51 ms; on one, 4.08 ms)."""
        while walked < limit:
            stops, replicas = tuple(st.stop for st in here.layout), tuple(st.replicas for st in here.layout)
            b, S = here.micro_batch_size, len(stops)
            loads = stage_loads(profile, topology, global_batch, stops, replicas, b, memo)
            slowest_now = max(loads)
            every: dict[tuple[int, ...], tuple[float, bool]] = {}  # replica counts -> proxy, screen passed
            for i in range(S):
                for to in {1, replicas[i] // 2} - {0, replicas[i]}:
                    r = list(replicas)
                    r[i] = to
                    lower = stage_loads(profile, topology, global_batch, stops, tuple(r), b, memo)[i] < loads[i]
                    for j in range(S):  # (j = i: those freed idle)
                        given = tuple(x + (replicas[i] - to if k == j != i else 0) for k, x in enumerate(r))
                        slowest = proxy(profile, topology, global_batch, stops, given, b, memo)
                        every[given] = (slowest, lower or slowest < slowest_now)
            # (where few, all: the proxy misses what the simulator sees of an all-reduce's overlap,
            # as a stage of 4 devices in one node against one of 8 across two does)
            few = len(every) <= SHRUNK * FEW_SHRUNK
            shrunk = {r: slowest for r, (slowest, passed) in every.items() if passed or few}
            kept = sorted(shrunk, key=lambda r: (shrunk[r], r))[:SHRUNK]
            moves = {(stops, r) for r in kept} | {
                (balance_cuts(profile, topology, global_batch, r, b, memo), r) for r in kept
            }
            ranked = sorted(moves, key=lambda m: (proxy(profile, topology, global_batch, m[0], m[1], b, memo), m))
            step = here
            for st, r in ranked[:SHRUNK]:
                c = consider(contiguous((0, *st), r), b, here.schedule, _depth_of(here), step.iteration_s)
                if c is not None and c.iteration_s < step.iteration_s:
                    step = c
            if step is here:
                return here
            here = finish(step)
        return here

    def hopeful(b: int) -> bool:
        """Whether a plan of copies at size b may still win (may_win). The tiers on top of the
        budget, each with a budget of its own, skip the sizes that cannot: what the others find
        stays as it was."""
        return may_win(bounds[b], incumbent, best)

    # a fourth tier, after the finish and on top of the budget (RELAXED of it, so that what came
    # before spends and finds what it did without it): the relaxation's own layouts (copies_bound.py:
    # where the bound's stages and links fit under its value, a plan of copies near it is
    # likeliest), each with its devices as the relaxation counts them and re-shared for its cuts,
    # at its stages' fitted depths and at the deepest; the best of them finished as the winner is
    # (its families and depths, then its own depths and walks while either helps)
    budget = walked + int(RELAXED * budget)
    limit = budget
    here, cutoff = None, incumbent * SLACK
    for b, (st, r) in sorted(relaxed.items()):
        if not hopeful(b):
            continue
        shared = share_devices(profile, topology, global_batch, st, b, memo)
        for devices in (r, shared) if shared not in (None, r) else (r,):
            if compute_floor(profile, topology, global_batch, st, devices, b) >= cutoff:
                continue
            layout = contiguous((0, *st), devices)
            copies = tuple(canonical_copies(x, b) for x in devices)
            fitted = fitted_depths(rr_costs(profile, topology, layout, copies, b, memo), copies, global_batch // b)
            own = (*fitted[:-1], 1) if len(set(fitted[:-1])) > 1 else fitted[0]
            for depth in dict.fromkeys((own, depths[-1]) if own_depths else (depths[-1],)):
                c = consider(layout, b, families[-1], depth, cutoff)
                if c is not None and c.iteration_s < cutoff:
                    here, cutoff = c, c.iteration_s
    if here is not None:
        here = finish(here)
        if not own_depths:  # (finish walks only under its own depths; unlike the winner, never walked)
            walk(here)
    # a fifth, on top of the budget as well (LEAST of it): per small size and stage count, the layout
    # whose slowest stage is least over every cut and device count at once (least_slowest_layouts:
    # what sharing devices and cutting in turn may not reach), at the deepest warm-up; the best of
    # the two best stage counts finished as the winner is (a walk keeps its stage count, and the
    # second's may walk further: VGG-19 on 8 x 8 A100, G 256, 9.77 -> 9.70 ms)
    budget = walked + int(LEAST * full)
    limit = budget
    cutoff = incumbent * SLACK
    by_stages: dict[int, Costed] = {}  # per stage count, its best
    for b in filter(hopeful, small if topology.num_devices <= LEAST_DEVICES else []):
        for st, r in least_slowest_layouts(profile, topology, global_batch, b, LEAST_STAGES, memo).values():
            if compute_floor(profile, topology, global_batch, st, r, b) >= cutoff:
                continue
            c = consider(contiguous((0, *st), r), b, families[-1], depths[-1], cutoff)
            if c is not None and (len(r) not in by_stages or c.iteration_s < by_stages[len(r)].iteration_s):
                by_stages[len(r)] = c
    for here in sorted(by_stages.values(), key=lambda c: (c.iteration_s, c.summary()))[:LEAST_FINISHED]:
        here = finish(here)
        if not own_depths:
            walk(here)
    # last, on top of the budget too (SHRINK of it): the winner's stages shrunk (shrink)
    budget = walked + int(SHRINK * full)
    limit = budget
    if best is not None:
        shrink(best)
    # last, on top of the budget too (LINKS of it): the best plan of copies, the relaxation's
    # layouts and the least slowest ones, with each stage's warm-up fitted to its link
    # (link_warmup.py: no depth's warm-up keeps a stage ahead of a later one of more copies), under
    # each family; the best of them walked under it (VGG-19 on 8 × 8 A100, G 128, copies
    # 26:16:6:8:7:1 at one sample: 5.748 ms at its best depths per stage, 5.699 ms fitted)
    budget = walked + int(LINKS * full)
    limit = budget
    here, cutoff = None, incumbent * SLACK
    layouts = [(c.layout, c.micro_batch_size) for c in ([best] if best is not None else []) + [*by_stages.values()]]
    layouts += [(contiguous((0, *st), r), b) for b, (st, r) in sorted(relaxed.items())]
    for layout, b in dict.fromkeys(layouts) if own_depths else []:
        if not hopeful(b):
            continue
        for family in families:
            c = consider(layout, b, family, LINKED, cutoff)
            if c is not None and c.iteration_s < cutoff:
                here, cutoff = c, c.iteration_s
    if here is not None:
        walk(here)
    return ([best] if best is not None and best.iteration_s < incumbent else []), bounds, scored


class Copies:
    """The proposer of stages of round-robin copies (1f1b_rr, zb_h1_rr), from the layouts the
    per-stage proposers found best."""

    def wanted(self, state: SearchState) -> bool:
        return state.best() is not None and any(f in RR for f in state.limits.allowed())

    def propose(self, state: SearchState) -> Proposal:
        best = state.best()
        assert best is not None  # (wanted)
        starts = [c for c in state.found if c.schedule in ("1f1b", "zb_h1")]
        families = [f for f in RR if f in state.limits.allowed()]
        lower: dict[int, float] = {}
        found, bounds, scored = search_round_robin(
            state.profile,
            state.topology,
            state.global_batch,
            state.limits,
            state.sizes,
            starts,
            families,
            best.iteration_s,
            lower,
        )
        state.stats.nodes += scored
        if state.stats.gap_without_chunked is None:
            state.stats.gap_without_chunked = state.gap()
        return Proposal(tuple(families), found, bounds, lower=lower)
