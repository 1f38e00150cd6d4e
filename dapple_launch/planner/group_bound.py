"""A lower bound on every cut of one shape of device groups (chunked_search.py), by duality.

A shape (family, v, groups r_0 .. r_{P-1}, micro-batch size b) leaves only its S cuts open. For any
cut, group g's time is at least

    busy_g = fill_g + M Σ_{s on g} (F_s + B_s) [+ drain_g under a whole backward]
    ar_g   = fill_g + M Σ_{s on g} F_s + Σ_{s on g} AR_s

fill_g: micro-batch 0's forward through the layers ahead of g's earliest stage, each at its fastest;
drain_g: the last gradient's way back through them, where g's last action is a B of that stage
(chunked_search.pipeline_ends). ar_g: every stage's gradient all-reduce starts no sooner than its
last gradient action, which follows B of the last micro-batch there, which follows that
micro-batch's forward on every stage, so each of g's stages has run all M forwards first; the
all-reduces of one group run one after another on its devices (rank_simulate.py's queue), each at
least one ring of its stage's weights on the best placement of r_g devices. Chimera's stages run
M / 2 micro-batches on each of their two groups and all-reduce across both (2 r_g devices): its
ar_g counts the fill and the all-reduces alone; its busy_g the drain too (its backward is whole).

So T >= max_g (θ busy_g + (1 - θ) ar_g) >= Σ_g λ_g (θ busy_g + (1 - θ) ar_g) for every θ in [0, 1]
and λ on the simplex, and every term is a sum over stages of what the stage's span [i, z) costs on
its group (the fills at each group's earliest stage): for fixed λ and θ the least over cuts is a
dynamic programme over (stage, stop), O(S L^2). The bound is its most over λ (θ in {0, 1}), found
by multiplicative weights on the groups' terms at the DP's cut (each step's value is itself a valid
bound; the best is kept). The busiest-group average (λ uniform) with cut-blind per-layer minima is
the old shape bound; this one sees that layers come in contiguous stages, that groups differ, and
that all-reduces cost."""

from __future__ import annotations

import math

import numpy as np

from ..cluster import Topology, ring_allreduce_s
from ..profile.model_profile import ModelProfile
from ..schedule import SPLIT_BACKWARD
from .chunked import groups_of

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
    ):
        """`layer_times(r)`: each layer's (forward, backward) on a replica's share of b, (L, 2)."""
        L, P, k = profile.num_layers, len(groups), topology.devices_per_node
        self.L, self.P, self.family = L, P, family
        M = global_batch // b
        self.S = P if family == "chimera" else v * P
        runs = M / 2 if family == "chimera" else M
        # per stage: (group, micro-batches it runs there)
        self.on = [[(g, runs) for g in groups_of(family, s, P)] for s in range(self.S)]
        self.first = {}  # group -> its earliest stage
        for s in range(self.S):
            for g, _ in self.on[s]:
                self.first.setdefault(g, s)
        params = np.asarray(profile._prefix["p"])
        i, z = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
        valid = z > i
        w = np.where(valid, params[np.minimum(z, L)] - params[i], 0.0)
        self.forward, self.backward, self.ring = {}, {}, {}
        fastest = None
        for r in sorted(set(groups)):
            t = layer_times(r)
            fastest = t if fastest is None else np.minimum(fastest, t)
            pf, pb = (np.concatenate(([0.0], np.cumsum(t[:, c]))) for c in (0, 1))
            self.forward[r] = np.where(valid, pf[np.minimum(z, L)] - pf[i], 0.0)
            self.backward[r] = np.where(valid, pb[np.minimum(z, L)] - pb[i], 0.0)
        # a stage's all-reduce over its group's devices (Chimera: both copies', twice as many)
        for r in {x * (2 if family == "chimera" else 1) for x in groups}:
            # (r > k devices span nodes; r <= k fit one: the best placement)
            self.ring[r] = np.where(w > 0, ring_allreduce_s(r, w, topology.allreduce_link(r > k)), 0.0)
        assert fastest is not None
        drain = family not in SPLIT_BACKWARD
        self.fill = np.concatenate(([0.0], np.cumsum(fastest[:, 0])))  # fill[i]: layers 0 .. i - 1
        self.drain = np.concatenate(([0.0], np.cumsum(fastest[:, 1]))) if drain else np.zeros(L + 1)
        self.groups = groups
        self.cells = 0
        self.empty = np.where(valid, 0.0, np.inf)  # a stage holds at least one layer
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

    def _terms(self, theta: float) -> list[list[tuple[int, np.ndarray]]]:
        """Per stage, per group it runs on: that group's cost of the stage over every span [i, z)
        (its ends added at the group's earliest stage, as a function of i)."""
        out = []
        for s in range(self.S):
            terms = []
            for g, runs in self.on[s]:
                r = self.groups[g]
                if self.family == "chimera":  # (the forwards before an all-reduce: not counted)
                    cost = theta * runs * (self.forward[r] + self.backward[r]) + (1 - theta) * self.ring[2 * r]
                else:
                    cost = runs * (self.forward[r] + theta * self.backward[r]) + (1 - theta) * self.ring[r]
                if self.first[g] == s:
                    cost = cost + (self.fill + theta * self.drain)[:, None]
                terms.append((g, cost))
            out.append(terms)
        return out

    def _least(self, terms, lam: np.ndarray) -> tuple[float, np.ndarray]:
        """min over cuts of Σ_g λ_g (group g's terms), and each group's terms at that cut."""
        L, S = self.L, self.S
        best = np.full((S + 1, L + 1), np.inf)
        back = np.zeros((S + 1, L + 1), dtype=int)
        best[0, 0] = 0.0
        for s in range(S):
            step = sum(lam[g] * cost for g, cost in terms[s]) + self.empty  # [i, z]
            total = best[s][:, None] + step
            back[s + 1] = np.argmin(total, axis=0)
            best[s + 1] = total[back[s + 1], np.arange(L + 1)]
        value = float(best[S, L])
        per_group = np.zeros(self.P)
        z = L
        for s in range(S, 0, -1):
            i = int(back[s, z])
            for g, cost in terms[s - 1]:
                per_group[g] += cost[i, z]
            z = i
        return value, per_group

    def bound(self, cap: float = math.inf, cells: float = math.inf) -> float:
        """The most over the steps and θ of the dual value (stops once it reaches `cap`, or once the
        programmes have walked `cells` (stage, start, stop) cells: self.cells counts them)."""
        if self.S > self.L:
            return math.inf  # (no cut: every stage needs a layer)
        best = 0.0
        each = self.S * (self.L + 1) ** 2
        for theta in (1.0, 0.0) if self.all_reduces_may_bind else (1.0,):
            terms = self._terms(theta)
            lam = np.full(self.P, 1.0 / self.P)
            for step in range(STEPS):
                if self.cells + each > cells:
                    return best
                self.cells += each
                value, per_group = self._least(terms, lam)
                best = max(best, value)
                if best >= cap or not math.isfinite(value):
                    return best
                # toward the groups the cut left busiest: their weight buys the most bound
                spread = per_group.max() - per_group.min()
                if spread <= 1e-12 * max(per_group.max(), 1e-300):
                    break
                lam = lam * np.exp(2.0 / math.sqrt(step + 1) * (per_group - per_group.max()) / spread)
                lam /= lam.sum()
        return best
