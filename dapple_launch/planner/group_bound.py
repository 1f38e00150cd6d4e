"""A lower bound on every cut of one shape of device groups (chunked_search.py), by duality.

A shape (family, v, groups r_0 .. r_{P-1}, micro-batch size b) leaves only its S cuts open. For any
cut, group g's time is at least

    busy_g = fill_g + M Σ_{s on g} (F_s + B_s) [+ drain_g under a whole backward]
    ar_g   = fill_g + M Σ_{s on g} F_s + Σ_{s on g} AR_s

fill_g: micro-batch 0's forward through the layers ahead of g's earliest stage, each at its fastest;
drain_g: the last gradient's way back through them, where g's last action is a B of that stage
(shape_bound.pipeline_ends). ar_g: every stage's gradient all-reduce starts no sooner than its
last gradient action, which follows B of the last micro-batch there, which follows that
micro-batch's forward on every stage, so each of g's stages has run all M forwards first; the
all-reduces of one group run one after another on its devices (rank_simulate.py's queue), each at
least one ring of its stage's weights on the best placement of r_g devices. Chimera's stages run
M / 2 micro-batches on each of their two groups and all-reduce across both (2 r_g devices): its
ar_g counts the fill and the all-reduces alone; its busy_g the drain too (its backward is whole).
Two more read the shape's rank orders, which fix each group's last step and where its stages'
last gradient steps fall:

    tail_g  = fill_g + M Σ_{s on g} (F_s + B_s) + left_{s_last}
    queue_g = fill_g + (g's steps before the first of its stages' last gradient steps) + Σ_{s on g} ring_s

left_s: what of stage s's all-reduce its last gradient step leaves (allreduce.py's buckets: at least
the ring of the bucket holding its first weighted layer, less the unweighted layers' backward
below it, or every byte's ring less one backward); tail_g takes it in place of the drain (both
follow the last step at once). queue_g: no all-reduce starts before its stage's last gradient
step, and a group's run one after another.

So T >= max_g (θ busy_g + (1 - θ) ar_g) >= Σ_g λ_g (θ busy_g + (1 - θ) ar_g) for every θ in [0, 1]
and λ on the simplex (and Σ_g λ_g tail_g, Σ_g λ_g queue_g), and every term is a sum over stages of what the stage's span [i, z) costs on
its group (the fills at each group's earliest stage): for fixed λ and θ the least over cuts is a
dynamic programme over (stage, stop), O(S L^2). The bound is its most over λ (θ in {0, 1}), found
by multiplicative weights on the groups' terms at the DP's cut (each step's value is itself a valid
bound; the best is kept). The busiest-group average (λ uniform) with cut-blind per-layer minima is
the old shape bound; this one sees that layers come in contiguous stages, that groups differ, and
that all-reduces cost.

Under a cap (the least bound of the shapes before, or the best plan: above it a bound changes
nothing), the programmes leave out every span that alone makes a cut last at least the cap
(stage_floor: the fill before it, its group's work on it, then its drain or its all-reduce's
tail), and the bound is the least of the cap and their value. The weights' worst cut otherwise
heaps the model on the stages they weigh least (a stage of half the model, its group twice as busy
as any plan's), which the mixed terms, each linear in the stages, cannot rule out. Nor do they
take a span no stage of an admissible plan can take for want of memory (self.room:
shape_memory.span_masks, whatever the cap): a cut with such a stage does not fit.

Under recompute=auto, a shape whose stages may recompute their first layers to fit: per stage and
span, the fewest first layers that let the stage alone hold its most micro-batches in flight
(shape_recompute.span_heads) have their forward run again in each backward of every plan that
fits, and the busy terms and the paths count it in B (again(); a span where no count fits is left
out, as memory leaves it out). Before, a cut-blind bound could only count the layers every stage
that may hold them must recompute (shape_recompute.forced_layers)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..cluster import Topology, ring_allreduce_s
from ..profile.model_profile import ModelProfile
from ..schedule import SPLIT_BACKWARD
from .allreduce import tied_ring_s
from .chunked import groups_of, rank_orders
from .group_orders import order_facts
from .path_bound import (
    CYCLE_ACTION_CELLS,
    MASK_STAGE_CELLS,
    ORDER_ACTION_CELLS,
    ORDER_ACTION_CELLS_ELSE,
    TABLE_CELLS,
    cycle_terms,
    least_cut,
    link_terms,
    order_actions,
    path_bound,
    path_terms,
    programme_cells,
    send_tables,
)

STEPS = 10  # multiplicative-weights steps per θ


class GroupBound:
    """Per-span costs on each group size of one (family, groups, b), and the bound over cuts."""

    def __init__(
        self,
        profile: ModelProfile,
        topology: Topology,
        global_batch: int,
        family: str,
        v: int,
        groups: tuple[int, ...],
        b: int,
        layer_times,
        tables: dict | None = None,
    ):
        """`layer_times(r)`: each layer's (forward, backward) on a replica's share of b, (L, 2).
        `tables`: the search's tables over every span, shared by its shapes (a shape's forwards and
        backwards on r replicas at b are another's of the same r and b); self.cells counts each
        table made here (TABLE_CELLS), none found."""
        L, P, k = profile.num_layers, len(groups), topology.devices_per_node
        self.L, self.P, self.family, self.b = L, P, family, b
        M = global_batch // b
        self.S = P if family == "chimera" else v * P
        runs = M / 2 if family == "chimera" else M
        # per stage: (group, micro-batches it runs there)
        self.on = [[(g, runs) for g in groups_of(family, s, P)] for s in range(self.S)]
        self.first = {}  # group -> its earliest stage
        for s in range(self.S):
            for g, _ in self.on[s]:
                self.first.setdefault(g, s)
        self.tables = {} if tables is None else tables
        self.cells = 0
        # a weight layer 0 shares with layer L - 1 (a tied embedding): the first and the last stage
        # hold it whatever the cut, so the all-reduce of each leaves at least its sum over both
        # stages' groups after it (cost.stage_costs; allreduce.tied_ring_s): one group where the last
        # stage is on the first's (ZB-V's V); Chimera's copies sum it over their down pipeline's
        # (chunked._over_both_copies keeps what the tie adds there)
        self.tied_ends = 0.0
        if self.S > 1:
            first, last = self.on[0][0][0], self.on[self.S - 1][0][0]
            devices = groups[first] + (groups[last] if last != first else 0)
            for layers, nbytes in profile.tied:
                if devices > 1 and nbytes > 0 and 0 in layers and L - 1 in layers:
                    self.tied_ends += float(tied_ring_s(np.array([devices]), nbytes, topology)[0])

        def spans():
            params = np.asarray(profile._prefix["p"])
            i, z = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
            valid = z > i
            w = np.where(valid, params[np.minimum(z, L)] - params[i], 0.0)  # weights of [i, z)
            return i, z, valid, w, np.where(valid, 0.0, np.inf)

        i, z, valid, w, empty = self._shared("span", 1, spans)
        self.empty: np.ndarray = empty  # (a stage holds at least one layer)
        self.span_bytes: np.ndarray = w
        self.forward, self.backward, self.ring = {}, {}, {}
        self.layer_forward: dict[int, np.ndarray] = {}  # per group size, each layer's forward (heads)
        fastest = None
        for r in sorted(set(groups)):
            t = layer_times(r)
            self.layer_forward[r] = t[:, 0]
            fastest = t if fastest is None else np.minimum(fastest, t)

            def work(t=t):
                pf, pb = (np.concatenate(([0.0], np.cumsum(t[:, c]))) for c in (0, 1))
                over_spans = lambda prefix: np.where(valid, prefix[np.minimum(z, L)] - prefix[i], 0.0)
                return over_spans(pf), over_spans(pb)

            self.forward[r], self.backward[r] = self._shared(("work", r, b), 2, work)
        # a stage's all-reduce over its group's devices (Chimera: both copies', twice as many)
        for r in {x * (2 if family == "chimera" else 1) for x in groups}:
            # (r > k devices span nodes; r <= k fit one: the best placement)
            ring = lambda r=r: np.where(w > 0, ring_allreduce_s(r, w, topology.fastest_allreduce_link(r > k)), 0.0)
            self.ring[r] = self._shared(("ring", r), 1, ring)
        assert fastest is not None
        drain = family not in SPLIT_BACKWARD
        self.fill = np.concatenate(([0.0], np.cumsum(fastest[:, 0])))  # fill[i]: layers 0 .. i - 1
        self.drain = np.concatenate(([0.0], np.cumsum(fastest[:, 1]))) if drain else np.zeros(L + 1)
        self.groups = groups
        # (the all-reduce terms' tables are made when the busy terms leave the bound short: bound())
        self._tail_inputs = (profile, topology, family, groups, M, v)
        self.tail: dict[int, np.ndarray] | None = None
        self.last: dict[int, int] | None = None  # (and the queues: _tails, from the rank orders)
        self.rings: dict[int, np.ndarray] = {}
        self.has_tails = False
        self.share: np.ndarray | None = None  # W's share of each span's backward (made on first use, or given)
        self.with_paths = True  # (the paths of the rank orders: bound() adds them when asked)
        self.warm: dict | None = None  # per rank orders, the path weights that did best (path_bound)
        self.lead: dict | None = None  # per (family, P, S), the kind of term that last reached the cap
        self.built: set | None = None  # the rank orders built so far in this search (counted once)
        self.masks = [self.empty] * self.S  # per stage, the spans a stage may not take (_masks: a cap's too)
        self.room: list[np.ndarray] | None = None  # per stage, the spans memory leaves out (shape_memory.span_masks)
        # per stage, over every span, the first layer its backwards need not run again to fit
        # (shape_recompute.span_heads, -1: none fits), where its stages may recompute their first
        # layers (recompute=auto), and the layers whose forward the profile's backwards hold already
        # (forced: shape_recompute.forced_layers, so none is counted twice); see again()
        self.heads: list[np.ndarray] | None = None
        self.forced: tuple[int, ...] = ()
        self._again: dict[tuple[int, int], np.ndarray] = {}
        # θ = 0 trades a stage's M backwards for its all-reduce: only where some single layer's
        # ring (its latency included) outweighs its backwards could it raise the bound
        one = np.arange(L)
        self.all_reduces_may_bind = any(
            bool(
                np.any(
                    self.ring[r * (2 if family == "chimera" else 1)][one, one + 1]
                    > runs * self.backward[r][one, one + 1]
                )
            )
            for r in set(groups)
        )

    def _tails(self, profile: ModelProfile, topology: Topology, family: str, groups, M: int, v: int) -> None:
        """self.last: per group, the stage of its order's last step where that step is the stage's
        last gradient action (a B, or a W under a split backward); self.tail[r]: over every span
        [i, z), the least of that stage's all-reduce left after the action ends, on r replicas.

        The runtime all-reduces a stage's gradients in buckets of whole layers from the last, each
        sent once its lowest weighted layer's gradient is done (allreduce.py): the bucket holding
        the stage's first weighted layer is done only when the action has run every layer below
        it, none weighted, and its ring moves at least that layer's weights. So the action's end
        leaves at least ring(that layer's bytes) less the backward of the unweighted layers below
        it: T >= fill_g + busy_g + tail of g's last stage. (Under a whole backward the drain after
        the last step runs on other groups at the same time: a term has the drain or the tail.)"""
        self._count_orders()
        self.last, self.queue = order_facts(family, len(groups), M, v)
        self._tail_tables()
        assert self.tail is not None
        self.has_tails = (
            any(bool(np.any(t > 0)) for t in self.tail.values())
            or (self.tied_ends > 0 and any(s in (0, self.S - 1) for s in self.last.values()))
        ) and bool(self.last)

    def _tail_tables(self) -> None:
        """self.tail and self.rings (_tails), which need no rank orders: a stage's masks read them too.
        Made on first ask; each group size's pair is the search's (self.tables) once made: TABLE_CELLS
        a table."""
        if self.tail is not None:
            return
        profile, topology, family, groups, _, _ = self._tail_inputs
        L, k = self.L, topology.devices_per_node

        def lows():
            weights = np.array([x.parameter_bytes for x in profile.layers] + [0.0])
            low = np.full(L + 1, L)  # low[i]: the first weighted layer at or after i (L: none)
            for i in range(L - 1, -1, -1):
                low[i] = i if weights[i] > 0 else low[i + 1]
            i, z = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
            return weights, low, (low[:, None] < z) & (z > i)  # (holds: the span [i, z) holds a weighted layer)

        weights, low, holds = self._shared("low", 1, lows)
        span_bytes = self.span_bytes
        self.tail, self.rings = {}, {}
        for r in set(groups):
            devices = r * (2 if family == "chimera" else 1)  # (Chimera: both copies all-reduce together)
            if devices <= 1:
                continue

            def tail(devices=devices, r=r):
                # the faster link where the devices may sit in one node (a bound holds on the best placement)
                links = [topology.allreduce_link(True)] + ([topology.allreduce_link(False)] if devices <= k else [])
                ring = np.min([ring_allreduce_s(devices, weights[low], link) for link in links], axis=0)
                below = self.backward[r][np.arange(L + 1), low]  # the unweighted layers' backward before it
                whole = np.min([ring_allreduce_s(devices, span_bytes, link) for link in links], axis=0)
                rings = np.where(span_bytes > 0, whole, 0.0)
                # or: every bucket's ring, one after another, less the action's time (at most a backward)
                first_bucket = np.where(holds, np.maximum(0.0, ring - below)[:, None], 0.0)
                return rings, np.maximum(first_bucket, rings - self.backward[r])

            self.rings[r], self.tail[r] = self._shared(("tail", devices, r, self.b), 2, tail)

    def _count_orders(self) -> None:
        """Count building the shape's rank orders once per search."""
        family = self._tail_inputs[2]
        self._count_once((), ORDER_ACTION_CELLS.get(family, ORDER_ACTION_CELLS_ELSE))

    def _count_once(self, what: tuple, per_action: int) -> None:
        """Count `per_action` cells an action of the shape's rank orders for what is built from them
        (`what`: () the orders themselves) once per search (self.built: the keys built), whether or
        not a cache of this process holds it, so the count is the same on every run."""
        _, _, family, groups, M, v = self._tail_inputs
        key = (*what, family, len(groups), M, v)
        if self.built is None or key not in self.built:
            if self.built is not None:
                self.built.add(key)
            self.cells += order_actions(family, self.S, M) * per_action

    def _kinds(self, s: int, r: int) -> tuple[np.ndarray, ...]:
        """Stage s's F, B, I, W over every span on r replicas, as the simulator charges them less its
        cost per action (the first stage's split backward is all W: cost.stage_costs)."""
        f, b = self.forward[r], self.backward[r]
        if self.heads is not None:  # (a whole backward runs the head's forward again: again())
            b = b + self.again(s, r)
        if self.share is None:
            self.share = weight_share_table(self._tail_inputs[0])
        w = b if s == 0 else b * self.share
        return f, b, b - w, w

    def _queue_terms(self) -> list[list[tuple[int, np.ndarray]]]:
        """Per stage, per group: a group's all-reduces run one after another on its devices, none
        before its stage's last gradient action starts, so T >= the group's fill + its steps before
        the first of its stages' last gradient actions (the order says which) + every stage's ring
        (and the first and last stages' share of a tied weight's sum: __init__)."""
        out = []
        for s in range(self.S):
            terms = []
            for g, _ in self.on[s]:
                r = self.groups[g]
                counts = self.queue[g].get(s, (0, 0, 0, 0))
                cost = self.rings.get(r, np.zeros_like(self.empty)) + sum(
                    n * x for n, x in zip(counts, self._kinds(s, r)) if n
                )
                if self.first[g] == s:
                    cost = cost + self.fill[:, None]
                if s in (0, self.S - 1):  # (a tied weight's sum queues after each end stage's own: __init__)
                    cost = cost + self.tied_ends
                terms.append((g, cost))
            out.append(terms)
        return out

    def _terms(self, theta: float, tails: bool = False) -> list[list[tuple[int, np.ndarray]]]:
        """Per stage, per group it runs on: that group's cost of the stage over every span [i, z)
        (its ends added at the group's earliest stage, as a function of i; with `tails`, the
        all-reduce its last step leaves, at that step's stage, in place of the drain)."""
        out = []
        for s in range(self.S):
            terms = []
            for g, runs in self.on[s]:
                r = self.groups[g]
                backward = self.backward[r] if self.heads is None else self.backward[r] + self.again(s, r)
                if self.family == "chimera":  # (the forwards before an all-reduce: not counted)
                    cost = theta * runs * (self.forward[r] + backward) + (1 - theta) * self.ring[2 * r]
                else:
                    cost = runs * (self.forward[r] + theta * backward) + (1 - theta) * self.ring[r]
                if self.first[g] == s:
                    cost = cost + (self.fill + (0.0 if tails else theta) * self.drain)[:, None]
                left = (self.tail or {}).get(r) if tails and (self.last or {}).get(g) == s else None
                if left is not None:
                    cost = cost + left
                if tails and s in (0, self.S - 1) and (self.last or {}).get(g) == s:
                    cost = cost + self.tied_ends  # (a tied weight's sum after the stage's own: __init__)
                terms.append((g, cost))
            out.append(terms)
        return out

    def set_heads(self, heads: list[np.ndarray], forced: tuple[int, ...]) -> None:
        """Read shape_recompute.span_heads' tables (self.heads): a span where no count of first
        layers fits is one no stage of a fitting plan takes (self.room, the programmes' masks);
        elsewhere each backward runs the head's forward again (again()). `forced`: the layers whose
        forward the profile's backwards hold already (shape_recompute.forced_layers), not counted
        twice."""
        self.heads, self.forced = heads, forced
        room = self.room if self.room is not None else [self.empty] * self.S
        self.room = [np.where(h >= 0, x, np.inf) for h, x in zip(heads, room)]

    def again(self, s: int, r: int) -> np.ndarray:
        """Over every span [i, z): the forward stage s on r replicas runs again in each backward at
        least to fit (self.heads: layers i .. h - 1, less the forced ones the profile's backwards
        hold already; 0 where none fits: the masks leave those spans out). Every plan of the shape
        that fits recomputes at least those layers of such a stage, each backward running their
        forward again (the simulator's B), so its busy terms and paths count them in the backward."""
        assert self.heads is not None
        key = (id(self.heads[s]), r)
        if key not in self._again:
            forward = np.where(np.isin(np.arange(self.L), self.forced), 0.0, self.layer_forward[r])
            prefix = np.concatenate(([0.0], np.cumsum(forward)))
            heads = self.heads[s]
            i = np.arange(self.L + 1)[:, None]
            self._again[key] = np.where(heads >= 0, prefix[np.maximum(heads, 0)] - prefix[i], 0.0)
        return self._again[key]

    def _least(self, terms, lam: np.ndarray) -> tuple[float, np.ndarray]:
        """min over cuts of Σ_g λ_g (group g's terms), and each group's terms at that cut."""
        masks = self.masks
        step = lambda s, starts, stops: (
            sum(lam[g] * cost[starts, stops] for g, cost in terms[s]) + masks[s][starts, stops]
        )
        value, spans = least_cut(self.S, self.L, step)
        per_group = np.zeros(self.P)
        for s, (i, z) in enumerate(spans):
            for g, cost in terms[s]:
                per_group[g] += cost[i, z]
        return value, per_group

    def _modes(self):
        """(θ, tails) of each kind of term in turn, θ < 0 the queues: under a whole backward the
        busy terms with their drain first, the all-reduce tables only once those leave the bound
        below its cap (a generator: bound() stops asking once it reaches the cap)."""
        if self.drain.any():  # (a whole backward: the drain, then the tail in its place)
            yield 1.0, False
        if self.last is None:
            self._tails(*self._tail_inputs)
        if self.has_tails:
            yield 1.0, True
        elif not self.drain.any():  # (a split backward: the tail adds to the busy terms, where there is one)
            yield 1.0, False
        if self.rings or self.tied_ends > 0:
            yield -1.0, False
        if self.all_reduces_may_bind:
            yield 0.0, False

    def bound(self, cap: float = math.inf, cells: float = math.inf) -> float:
        """The most over the steps and θ of the dual value, then of the paths' (path_bound.py,
        where self.with_paths); stops once it reaches `cap`, or once the
        programmes have walked `cells` (stage, start, stop) cells: self.cells counts them."""
        if self.S > self.L:
            return math.inf  # (no cut: every stage needs a layer)
        self.masks = self._masks(cap)
        best = self._dual(cap, cells)
        if best < cap and self.with_paths and math.isfinite(best):
            best = max(best, self._paths(cap, cells, self.warm))
        return min(best, cap)  # (a cut the masks left out is at least the cap: the bound is the least of both)

    def critical(self, cap: float, cells: float) -> float:
        """The paths' bound with the critical paths of the cuts it answers with (path_bound.py's
        `orders`), up to `cap`, within `cells`: chunked_bounds.cut_bounds' last pass."""
        if self.S > self.L:
            return math.inf
        self.masks = self._masks(cap)
        return min(self._paths(cap, cells, None, critical=True), cap)

    def _masks(self, cap: float) -> list[np.ndarray]:
        """Per stage, +inf on the spans whose stage_floor is at least `cap`, and on those memory
        leaves out (self.room; 0 elsewhere, +inf on no span). The programmes' least over the other
        cuts, capped at `cap`, bounds every cut: it keeps the cut player from answering the weights
        with a cut no plan would take (a stage of many times its share of the model, which
        lightens every term the weights lean on at once)."""
        room = self.room if self.room is not None else [self.empty] * self.S
        if not math.isfinite(cap):
            return room
        self.cells += self.S * MASK_STAGE_CELLS
        return [np.where(self.stage_floor(s) >= cap, np.inf, room[s]) for s in range(self.S)]

    def stage_floor(self, s: int) -> np.ndarray:
        """Over every span [i, z): what stage s on it alone makes any cut last. Micro-batch 0's
        forward reaches layer i no sooner than fill[i]; the stage's group then runs each of its
        micro-batches' forward and backward of the span there, one at a time; after the last, the
        gradient still crosses layers 0 .. i - 1 (drain, under a whole backward) and the stage's
        all-reduce leaves at least its tail (tail tables: no rank order needed), side by side."""
        self._tail_tables()
        assert self.tail is not None
        # (the search's, once made: its fill and drain are the fastest of the shape's group sizes)
        key = ("floor", self.b, tuple(sorted(set(self.groups))), bool(self.drain.any()), self.family == "chimera")
        key += tuple(sorted({(self.groups[g], runs) for g, runs in self.on[s]}))
        tail = self.tail
        return self._shared(
            key,
            2,
            lambda: (
                self.fill[:, None]
                + np.min(
                    [
                        runs * (self.forward[self.groups[g]] + self.backward[self.groups[g]])
                        + np.maximum(self.drain[:, None], tail.get(self.groups[g], 0.0))
                        for g, runs in self.on[s]
                    ],
                    axis=0,
                )
            ),
        )

    def _shared(self, key: Any, count: int, make: Callable[[], Any]) -> Any:
        """The search's table(s) `key` (self.tables), made by `make` and counted (`count` tables of
        TABLE_CELLS) where no shape of this search made them yet."""
        if key not in self.tables:
            self.tables[key] = make()
            self.cells += count * TABLE_CELLS
        return self.tables[key]

    def _lead_key(self) -> tuple:
        return (self.family, self.P, self.S)

    def _ordered_modes(self):
        """_modes, the kind that last lifted a shape of the same family and stage count to its cap
        first (self.lead: shared by the shapes of one search; a neighbouring shape is most often
        lifted by the same kind)."""
        first = (self.lead or {}).get(self._lead_key())
        rest = []
        modes = self._modes()
        if first is not None:
            for mode in modes:
                if mode == first:
                    yield mode
                    break
                rest.append(mode)
        yield from rest
        yield from modes

    def _dual(self, cap: float, cells: float) -> float:
        """Each kind of term (_modes) climbs on its own multiplicative weights, STEPS at most; the
        kinds take turns: each its first step in _modes' order, then always the one standing
        highest. Which kind binds differs from shape to shape (the all-reduce queues on one, the
        tails on another), and a shape that one kind lifts to the cap in one step is left after
        that step rather than after every step of the kinds before it. Each kind's steps are the
        same whatever the turns, so without a cap or a count this is the most over all of them."""
        best = 0.0
        each = programme_cells(self.S, self.L)
        climbs: list[list] = []  # [value so far, its turn, terms, λ, steps taken, its kind (θ, tails)]
        modes = self._ordered_modes()  # (a generator: the later kinds' tables are made only when reached)
        while True:
            mode = next(modes, None) if modes is not None else None
            if mode is not None:  # every kind's first step before any kind's second
                theta, tails = mode
                terms = self._queue_terms() if theta < 0 else self._terms(theta, tails)
                climb = [0.0, len(climbs), terms, np.full(self.P, 1.0 / self.P), 0, mode]
                climbs.append(climb)
            else:
                modes = None
                going = [c for c in climbs if c[4] < STEPS]
                if not going:
                    return best
                climb = max(going, key=lambda c: (c[0], -c[1]))
            if self.cells + each > cells:
                return best
            self.cells += each
            value, per_group = self._least(climb[2], climb[3])
            climb[4] += 1
            climb[0] = max(climb[0], value)
            best = max(best, value)
            if best >= cap or not math.isfinite(value):
                if self.lead is not None and best >= cap:
                    self.lead[self._lead_key()] = climb[5]
                return best
            # toward the groups the cut left busiest: their weight buys the most bound
            spread = per_group.max() - per_group.min()
            if spread <= 1e-12 * max(per_group.max(), 1e-300):
                climb[4] = STEPS  # (every group alike at this cut: its weights are where they stay)
                continue
            lam = climb[3] * np.exp(2.0 / math.sqrt(climb[4]) * (per_group - per_group.max()) / spread)
            climb[3] = lam / lam.sum()

    def _paths(self, cap: float, cells: float, warm: dict | None = None, critical: bool = False) -> float:
        """path_bound.py's over the group runs, link loads and round trips of the shape's rank orders, within
        `cells` (self.cells counts them). `warm`: per rank orders, the weights that did best on a
        shape before (read and updated)."""
        profile, topology, family, groups, M, v = self._tail_inputs
        self._count_orders()
        runs, whole = path_terms(family, self.P, M, v, self.S)
        # (a link's load: not Chimera's, whose links carry one pipeline's activations and the
        # other's gradients, M / 2 each; its group runs count a stage's steps on either copy alike)
        links = link_terms(family, self.P, M, self.S) if family != "chimera" else np.zeros((0, self.S, 5))
        if critical:  # (the whole runs and the links: the critical paths found add the rest, a small game)
            runs, whole = runs[whole], whole[whole]
        cycles = cycle_terms(family, self.P, M, v, self.S)
        self._count_once(("cycles",), CYCLE_ACTION_CELLS)
        terms = np.concatenate([runs, links, cycles])
        key = (family, self.P, M, v)
        start = (warm or {}).get(key)
        if start is None:  # (each group's whole run: its busy time with fill and drain; the round trips)
            start = np.concatenate([whole, np.zeros(len(links), dtype=bool), np.ones(len(cycles), dtype=bool)]).astype(
                float
            )
        sends = send_tables(profile, topology, family, groups, self.b, self.S)
        tables = lambda s: (*self._kinds(s, groups[self.on[s][0][0]]), sends[s])
        orders = rank_orders(family, self.P, M, v) if critical else None
        value, walked, lam = path_bound(terms, tables, self.masks, start, cap, cells - self.cells, orders)
        self.cells += walked
        if warm is not None:
            warm[key] = lam
        return value


def weight_share_table(profile: ModelProfile) -> np.ndarray:
    """W's share of the backward of every span [i, z) (ModelProfile.weight_share: measured where
    every layer of the span was measured split, else half, as the simulator charges it)."""
    L = profile.num_layers
    b = np.concatenate(([0.0], np.cumsum([x.backward_s for x in profile.layers])))
    w = np.concatenate(([0.0], np.cumsum([x.weight_grad_s or 0.0 for x in profile.layers])))
    unmeasured = np.concatenate(([0], np.cumsum([x.weight_grad_s is None for x in profile.layers])))
    i, z = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
    total, weights = b[z] - b[i], w[z] - w[i]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(total > 0, np.minimum(1.0, weights / total), 0.5)
    return np.where((unmeasured[z] - unmeasured[i] > 0) | (total <= 0), 0.5, share)
