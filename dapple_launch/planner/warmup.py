"""The 1F1B warm-up depth: deeper warm-ups searched exactly, with a bound valid for any warm-up.

DAPPLE's minimal warm-up keeps S - s micro-batches in flight on stage s; depth k keeps k times
that (schedule.deeper_warmup), for k times the activation memory. Where a slow link sits on the
steady state's dependency cycle (below), running further ahead hides it, as GPipe does. Every
depth is costed by the simulator, and searched by branch and bound over one tree (branch.py):
DAPPLE's minimal warm-up first, then the deeper ones, each cut by the bound below with the most
micro-batches its depths keep in flight; the bound leaves out everything such a warm-up can hide:

Stage s starts no earlier than a_s = sum_{j<s}(F_j + A_j), the first micro-batch's forward path.
It computes M (F_s + B_s). Its first backward waits for a round trip R_s through the later
stages and back (R_s = sum_{j>s}(F_j + B_j) + the links in between); only its w_s warm-up
forwards, or (for the last micro-batch) the w_s backwards it still owes, can fill that wait. After
its last backward the gradient still goes down to stage 0 and every stage j <= s all-reduces:
down_s = max(AR_s, G_{s-1} + B_{s-1} + down_{s-1}). So, for every stage and link,

    T >= a_s + M t_s + max(0, R_s - w_s F_s, R_s - w_s B_s) + down_s
    T >= a_s + F_s + M A_s + (F + R + B)_{s+1} + G_s + B_s + down_s         (and M G_s alike)

and, with k_s = w_s + 1 micro-batches in flight, the steady state's cycle through the last stage
(for the minimal warm-up, k_s = S - s: DAPPLE's window from s to the last stage):
B_s(m) -> F_s(m + k_s) -> round trip -> B_s(m + k_s), so
    T >= a_s + ceil(M / k_s) (F_s + R_s + B_s) + (backwards left after the last cycle) B_s + down_s

With w_s unknown (a partial plan) the wait term is left out, except with every micro-batch in
flight (M F_s + R_s + B_s and F_s + R_s + M B_s: no warm-up hides those); the suffix tables of
bounds.py (reach_end, round_end) bound the stages not placed yet, that term included. With M <= 2
micro-batches 1F1B already keeps all of them in flight: there is no deeper warm-up to search.
Checked against the simulator for every depth by the tests.
"""

from __future__ import annotations

import math

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import StageCosts
from ..schedule.one_f_one_b import deeper_warmup
from .branch import CELLS_PER_NODE, BranchAndBound, Prefix, exact_sweep
from .cost import Costed, StageSpec, bare_costs, evaluate, memory_per_device, stage_costs
from .limits import Limits
from .link_warmup import LINKED, link_warmup
from .shapes import MIN_MICRO_BATCHES

# Deeper warm-ups: bounded work per candidate (S M at most WARMUP_MAX_ACTIONS simulated; each
# simulated candidate costs branch.CELLS_PER_NODE's share of the node budget).
WARMUP_LAYOUTS, WARMUP_MAX_ACTIONS = 3, 8192


def warmup_bound(costs: list[StageCosts], num_micro_batches: int, warmup: tuple[int, ...]) -> float:
    """No run of these stage costs under the 1F1B schedule with this warm-up is faster (module doc)."""
    S, M = len(costs), num_micro_batches
    F = [c.forward_s for c in costs]
    B = [c.backward_s for c in costs]
    A = [costs[s].send_activation_s for s in range(S - 1)]
    G = [costs[s + 1].send_gradient_s for s in range(S - 1)]
    R = [0.0] * S
    for s in range(S - 2, -1, -1):
        R[s] = R[s + 1] + A[s] + G[s] + F[s + 1] + B[s + 1]
    bound, reach, down = 0.0, 0.0, 0.0
    for s in range(S):
        ar = costs[s].exposed_allreduce_s(False)  # what is left of it after the last B
        down = ar if s == 0 else max(ar, G[s - 1] + B[s - 1] + down)
        in_flight = min(M, warmup[s] + 1)
        ahead = in_flight - 1  # forwards (and, at the end, backwards) that can fill the wait
        wait = max(0.0, R[s] - ahead * F[s], R[s] - ahead * B[s])
        # the steady cycle through the last stage: B_s(m) -> F_s(m + in_flight) -> the round trip ->
        # B_s(m + in_flight), one cycle per `in_flight` micro-batches, then the backwards left
        cycles = (M - 1) // in_flight + 1
        steady = cycles * (F[s] + R[s] + B[s]) + (M - 1 - (cycles - 1) * in_flight) * B[s]
        bound = max(bound, reach + max(M * (F[s] + B[s]) + wait, steady) + down)
        if s < S - 1:
            after = F[s + 1] + R[s + 1] + B[s + 1] + B[s] + down
            bound = max(bound, reach + F[s] + M * A[s] + G[s] + after, reach + F[s] + A[s] + M * G[s] + after)
            reach += F[s] + A[s]
    return bound


def split_bound(costs: list[StageCosts], num_micro_batches: int, warmup: tuple[int, ...]) -> float:
    """No run of these stage costs under ZB-H1 (1F1B's forwards and input gradients in order, each
    weight gradient deferred) with this warm-up is faster. Stage s starts after the first
    micro-batch's forward reached it (a_s), computes M (F_s + I_s + W_s), and all-reduces after its
    last W. Before its first I it can run only its w_s + 1 forwards (a W follows its I), while the
    first micro-batch makes the round trip through the later stages' forwards and input gradients
    R_s: at least max(0, R_s - w_s F_s) idle. (1F1B's other terms do not hold: deferred W's fill the
    end's waits, and 1F1B's bound fails on ZB-H1, tests.)"""
    S, M = len(costs), num_micro_batches
    F = [c.forward_s for c in costs]
    R = [0.0] * S
    for s in range(S - 2, -1, -1):
        R[s] = R[s + 1] + costs[s].send_activation_s + F[s + 1] + costs[s + 1].input_s + costs[s + 1].send_gradient_s
    bound, reach = 0.0, 0.0
    for s, c in enumerate(costs):
        ahead = min(M, warmup[s] + 1) - 1
        bound = max(
            bound,
            reach + M * (c.forward_s + c.backward_s) + max(0.0, R[s] - ahead * F[s]) + c.exposed_allreduce_s(True),
        )
        reach += F[s] + c.send_activation_s
    return bound


def deeper_depths(num_stages: int, num_micro_batches: int, limits: Limits) -> list[tuple[int, tuple[int, ...]]]:
    """(depth, warm-up per stage) for depths 2 .. max_warmup_depth that differ from the one before."""
    out, previous = [], deeper_warmup(num_stages, num_micro_batches, 1)
    for depth in range(2, limits.max_warmup_depth + 1):
        warmup = deeper_warmup(num_stages, num_micro_batches, depth)
        if warmup == previous:
            break  # every stage already runs all its forwards first
        out.append((depth, warmup))
        previous = warmup
    return out


def depths(num_stages: int, num_micro_batches: int, limits: Limits) -> list[tuple[int, tuple[int, ...]]]:
    """(depth, warm-up) for depth 1 (the minimal warm-up, ()) and, where the orders are small enough
    to deepen (WARMUP_MAX_ACTIONS), deeper_depths' up to max_warmup_depth."""
    deeper = (
        deeper_depths(num_stages, num_micro_batches, limits)
        if num_stages * num_micro_batches <= WARMUP_MAX_ACTIONS
        else []
    )
    return [(1, ()), *deeper]


def deepen_best_layouts(found: list[Costed], profile: ModelProfile, topology: Topology, limits: Limits) -> list[Costed]:
    """Layouts found so far again with deeper warm-ups: a strong incumbent for the exact pass
    (deep_sweep), found in a few simulations. Two kinds are worth it: the few fastest under the
    minimal warm-up, and the few whose bound under the deepest warm-up that fits is least: a layout
    that waits on slow links (a straight pipeline on 10 Gbps) can be the slowest under DAPPLE's
    warm-up and the fastest once a deeper one hides its transfers."""
    if limits.schedule != "1f1b" or limits.max_warmup_depth < 2:
        return []
    fastest, potential, seen = [], [], set()
    for c in sorted(found, key=lambda c: (c.iteration_s, c.summary())):
        key = (c.layout, c.micro_batch_size)
        S, M = len(c.layout), c.num_micro_batches
        if key in seen or S < 2 or S * M > WARMUP_MAX_ACTIONS or MIN_MICRO_BATCHES["1f1b"](S) > M:
            continue
        seen.add(key)
        depths = _fitting_depths(c, profile, limits)
        if depths:
            if len(fastest) < WARMUP_LAYOUTS:
                fastest.append((c, depths))
            potential.append((min(warmup_bound(c.costs, M, w) for _, w in depths), c.summary(), c, depths))
    potential.sort(key=lambda x: x[:2])
    chosen = fastest + [(c, d) for _, _, c, d in potential[:WARMUP_LAYOUTS] if all(c is not f for f, _ in fastest)]
    out, incumbent = [], min((c.iteration_s for c in found), default=math.inf)
    for c, depths in chosen:
        best = c.iteration_s if c.schedule == "1f1b" else math.inf
        bare = bare_costs(c, profile, topology)  # (once per layout: each depth fits its own recomputation)
        for depth, warmup in depths:
            if warmup_bound(c.costs, c.num_micro_batches, warmup) >= min(best, incumbent):
                continue  # cannot beat what is known: not worth a simulation
            cand = evaluate(
                profile,
                topology,
                c.layout,
                c.micro_batch_size,
                c.num_micro_batches,
                limits,
                warmup_depth=depth,
                costs=bare,
                cutoff=best * (1 + 1e-9),
            )
            if cand.iteration_s < best * (1 - 1e-9):
                best = cand.iteration_s
                incumbent = min(incumbent, best)
                out.append(cand)
            elif best < math.inf and cand.iteration_s > best * (1 + 1e-9):
                break  # deeper has stopped paying
    return out


def _fitting_depths(c: Costed, profile: ModelProfile, limits: Limits) -> list[tuple[int, tuple[int, ...]]]:
    """The deeper warm-ups (depth, per-stage warm-up) under which this layout still fits memory."""
    M, out = c.num_micro_batches, []
    for depth, warmup in deeper_depths(len(c.layout), M, limits):
        if max(memory_per_device(profile, c.layout, c.costs, M, limits, warmup)) > c.capacity_bytes:
            break  # more depth keeps more micro-batches in flight: none deeper fits either
        out.append((depth, warmup))
    return out


def worth_simulating(
    profile: ModelProfile,
    layout: tuple[StageSpec, ...],
    costs: list[StageCosts],
    num_micro_batches: int,
    depth: int | tuple[int, ...],
    limits: Limits,
    capacity_bytes: float,
    beat: float,
) -> bool:
    """Whether a layout under warm-up `depth` (or LINKED: link_warmup.py) could fit memory and beat `beat`: a check of O(S)
    before a simulation of O(S M). A deeper warm-up must fit without recomputation (the deeper
    searches do not pair the two); the minimal one may still fit by recomputing (evaluate decides).
    The bound is the family's: 1F1B's (warmup_bound) or ZB-H1's (split_bound: deferred weight
    gradients let ZB-H1 run below 1F1B's); other families are not screened."""
    if depth == LINKED:
        warmup = link_warmup(costs, (1,) * len(layout), num_micro_batches)
    else:
        warmup = deeper_warmup(len(layout), num_micro_batches, depth)
    if (depth == LINKED or (depth if isinstance(depth, int) else max(depth)) > 1) and max(
        memory_per_device(profile, layout, costs, num_micro_batches, limits, warmup)
    ) > capacity_bytes:
        return False
    bound = {"1f1b": warmup_bound, "zb_h1": split_bound}.get(limits.schedule)
    return bound is None or bound(costs, num_micro_batches, warmup) < beat


class DeepWarmupSearch(BranchAndBound):
    """The branch and bound of one micro-batch size over layouts with warm-ups deeper than DAPPLE's,
    sharing the minimal pass's tree and bound tables (built for plans that beat an incumbent at least
    as slow as this pass's); its bound is the minimal pass's with up to max_warmup_depth times as
    many micro-batches in flight."""

    @classmethod
    def over(cls, base: BranchAndBound) -> DeepWarmupSearch:
        x = cls.__new__(cls)
        x.__dict__.update(base.__dict__)
        x._root_bound, x.seed = None, None
        x.in_flight_depth = base.limits.max_warmup_depth  # its bound (branch.py: _warmup_bound) holds for every depth
        return x

    def run(self) -> Costed | None:
        self._explore()
        return self.best

    def _leaf(self, placed: Prefix) -> None:
        self.stats.leaves += 1
        S, M = len(placed.stages), self.M
        if S < 2 or MIN_MICRO_BATCHES["1f1b"](S) > M:
            return  # one stage: no warm-up to deepen; or too few micro-batches for the pipeline
        layout = tuple(StageSpec(a, z, devices) for a, z, devices in placed.stages)
        costs = stage_costs(self.p, self.t, layout, self.b)
        for depth, warmup in deeper_depths(S, M, self.limits):
            if max(memory_per_device(self.p, layout, costs, M, self.limits, warmup)) > self.cap:
                return  # a deeper warm-up keeps more micro-batches: it does not fit either
            bound = warmup_bound(costs, M, warmup)
            if bound >= self.cutoff:
                continue  # a deeper one may still win: its bound is lower
            if S * M > WARMUP_MAX_ACTIONS:
                self.open_bound = min(self.open_bound, bound)  # too large to simulate: left open, said so
                continue
            self._spend(math.ceil(S * M / CELLS_PER_NODE), bound)
            cand = evaluate(
                self.p,
                self.t,
                layout,
                self.b,
                M,
                self.limits,
                warmup_depth=depth,
                costs=costs,
                cutoff=self.best_t * (1 - 1e-12),
            )
            if cand.fits and cand.iteration_s < self.best_t * (1 - 1e-12):
                self.best_t, self.best = cand.iteration_s, cand


def deep_sweep(
    searches: list[BranchAndBound], incumbent: float, limits: Limits, budget: int
) -> tuple[list[Costed], dict[int, float], int]:
    """The exact pass over deeper warm-ups, every micro-batch size, least root bound first:
    (best found per size, a lower bound per size on every deeper-warm-up plan, candidates scored)."""
    if limits.schedule != "1f1b" or limits.max_warmup_depth < 2:
        return [], {}, 0
    # (M <= 2: 1F1B already keeps every micro-batch in flight: no layout of that size has a deeper warm-up)
    return exact_sweep(
        [DeepWarmupSearch.over(s) for s in searches],
        incumbent,
        budget,
        lambda x: not any(deeper_depths(S, x.M, limits) for S in range(2, x.max_stages + 1)),
    )
