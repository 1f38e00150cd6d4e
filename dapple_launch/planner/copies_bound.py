"""A lower bound on every plan of round-robin copies at one micro-batch size, over every cut.

A plan of copies (round_robin.py) is stages of contiguous layers [i, z), stage s on r_s devices
that form c = r / gcd(r, b) canonical copies of g = gcd(r, b) devices, each copy running whole
micro-batches of b samples, b / g per device. Whatever the cuts, the order or the warm-up, a stage's
busiest copy (ceil(M / c) of the M micro-batches):

- starts no sooner than micro-batch 0's forward has crossed layers 0 .. i - 1 (each at its fastest:
  the fewest samples per device any copy can run);
- runs ceil(M / c) forwards and backwards of its layers on b / g samples, one at a time;
- runs no backward of a micro-batch before its round trip: its forward on through layers z .. L - 1
  and its input gradient back (trip(z), at the fastest; of a split backward only the input's share);
- then the stage's gradient all-reduce over its r devices is left: its buckets (planner/allreduce.py)
  are all-reduced one after another, each once the copy's last gradient action has run its layers,
  so the weights of the stage's lowest layers [i, z) wait for the backward down to layer z - 1 and
  then take at least one ring all-reduce of their bytes: at least ring(w[i, z)) - B(i, z - 1) is
  left after the action, for every z.

So T >= stage(i, z, r) = fill(i) + max(n (F + B), F + trip(z) + n B, n F + trip(z) + B) + exposed
(n = ceil(M / c)) for every stage, and the stages' device counts sum to at most D. The least T for which some cut and device counts
keep every stage under T is the bound: for a trial T each span [i, z) needs the fewest r whose
stage time is at most T (a running minimum over r, as more devices are not always faster: the
all-reduce grows), a dynamic programme over the cuts finds the least total, and bisection on T
finds where it first fits in D. An all-reduce is priced on the best placement of r devices (inside
one node when r fits one); transfers and the pipeline's drain are left out, so it holds for both
families (a split backward may end on a W)."""

from __future__ import annotations

import math

import numpy as np

from ..cluster import Topology, ring_allreduce_s
from ..profile.model_profile import ModelProfile

BISECTIONS = 30  # halvings of [lo, hi]: within 1e-9 of the relaxation's optimum


class CopiesBound:
    """The stage times of every span and device count at one micro-batch size, and the bound.
    `capacity_bytes`: a device's usable memory (a stage whose weights and optimizer state alone
    exceed it is in no plan)."""

    def __init__(
        self,
        profile: ModelProfile,
        topology: Topology,
        global_batch: int,
        b: int,
        speed: float,
        optimizer_factor: float,
        capacity_bytes: float,
    ):
        L, D, k, pbs = profile.num_layers, topology.num_devices, topology.devices_per_node, profile.batch_size
        M = global_batch // b
        pre = profile._prefix
        f, bw, ff, bf = (np.asarray(pre[key]) for key in ("f", "b", "ff", "bf"))
        params = np.asarray(pre["p"])
        every = np.arange(1, D + 1)
        g = np.gcd(every, b)  # each copy's devices; a copy runs b / g samples per device
        turns = -(-M // (every // g))  # the busiest copy's micro-batches
        # device counts alike in all but the all-reduce (which only grows with r) need only their
        # fewest: the least stage time with at most r devices is reached at one of these
        alike = {}
        for x, key in enumerate(zip(g.tolist(), turns.tolist(), (every > k).tolist())):
            alike.setdefault(key, x)
        pick = np.array(sorted(alike.values()))
        r, g, turns = every[pick], g[pick], turns[pick]
        n = b // g
        # micro-batch 0's forward through layer l at its fastest: the fewest samples per device
        least = float(n.min())
        fwd = (ff[1:] - ff[:-1]) + (f[1:] - f[:-1] - (ff[1:] - ff[:-1])) * least / pbs
        self.fill = np.concatenate(([0.0], np.cumsum(fwd))) * speed  # fill[i]: layers 0 .. i - 1
        # its input gradient's way back through them: a split backward's I, B less its W share (half
        # where not measured; measured, at least what the layer of largest share leaves)
        bwd = (bf[1:] - bf[:-1]) + (bw[1:] - bw[:-1] - (bf[1:] - bf[:-1])) * least / pbs
        shares = [
            x.weight_grad_s / x.backward_s for x in profile.layers if x.backward_s > 0 and x.weight_grad_s is not None
        ]
        measured = all(x.weight_grad_s is not None for x in profile.layers)
        back = 1.0 - min(1.0, max(shares, default=1.0)) if measured else 0.5
        each = (fwd + back * bwd) * speed
        trip = np.concatenate((np.cumsum(each[::-1])[::-1], [0.0]))  # trip[z]: layers z .. L - 1 and back
        (inter_bw, inter_lat), (intra_bw, intra_lat) = topology.allreduce_link(True), topology.allreduce_link(False)
        across = r > k  # (r devices fit one node otherwise: the best placement)
        link = (np.where(across, inter_bw, intra_bw), np.where(across, inter_lat, intra_lat))
        per = n / pbs
        # per start i, every stop z > i at once: rows z = i + 1 .. L, columns r = 1 .. D
        rows = []
        for i in range(L):
            z = np.arange(i + 1, L + 1)[:, None]
            forward = ((ff[z] - ff[i]) + (f[z] - f[i] - (ff[z] - ff[i])) * per) * speed
            backward = ((bf[z] - bf[i]) + (bw[z] - bw[i] - (bf[z] - bf[i])) * per) * speed  # B(i, z)
            # the buckets holding layers i .. z - 1 are complete no sooner than a backward over
            # [i, stop) has run its layers down to z - 1, and their all-reduces (one after another,
            # together at least one ring of their bytes) begin no sooner: they end at least
            # ring(w[i, z)) - B(i, z - 1) after the action; the most over z <= stop is what a stage
            # [i, stop) leaves exposed at least (a W, a share of B, hides less)
            w = params[z] - params[i]
            below = ((bf[z - 1] - bf[i]) + (bw[z - 1] - bw[i] - (bf[z - 1] - bf[i])) * per) * speed
            left = np.where(w > 0, ring_allreduce_s(r, w, link), 0.0) - below  # (0 where r = 1)
            exposed = np.maximum(0.0, np.maximum.accumulate(left, axis=0))
            # no backward before a micro-batch's round trip through layers z .. L - 1: not the
            # first one's (all backwards after it), nor the last one's (after all forwards)
            busy = np.maximum(
                turns * (forward + backward),
                np.maximum(forward + trip[z] + turns * backward, turns * forward + trip[z] + backward),
            )
            stage = self.fill[i] + busy + exposed
            stage[(w[:, 0] * optimizer_factor > capacity_bytes)] = np.inf
            rows.append(stage)
        self.spans = np.triu_indices(L + 1, 1)  # every span [i, z), in the rows' order
        stage = np.concatenate(rows)
        # the least stage time with at most r devices: nonincreasing in r, so a trial T's fewest
        # devices per span follow from a count of the entries above T
        self.least = np.minimum.accumulate(stage, axis=1)
        self.counts = np.append(r, np.inf)  # [j]: the device count of column j (past the last: none)
        self.L, self.D = L, D

    def fits(self, T: float) -> bool:
        """Some cut and device counts keep every stage's time at most T within D devices."""
        need = self.counts[(self.least > T).sum(axis=1)]  # fewest devices per span (inf: none suffice)
        i, z = self.spans
        fewest = np.full(self.L + 1, np.inf)
        fewest[0] = 0.0
        for stop in range(1, self.L + 1):
            into = z == stop
            fewest[stop] = np.min(fewest[i[into]] + need[into])
        return bool(fewest[self.L] <= self.D)

    def bound(self, above: float = 0.0, cap: float = math.inf) -> float:
        """The least T that fits, from below: a T known not to fit (never more than the optimum of
        the relaxation). `above`: a valid bound already known (the search starts there); `cap`: a
        bound is only wanted up to it (a T there that does not fit is returned as it is)."""
        finite = self.least[np.isfinite(self.least)]
        # past its largest finite stage time no span needs fewer devices: a T there fits if any does
        hi = cap if math.isfinite(cap) else float(finite.max()) if finite.size else math.inf
        lo = above
        if lo >= hi or self.fits(lo):
            return lo
        if not math.isfinite(hi) or not self.fits(hi):
            return cap if math.isfinite(cap) else math.inf
        for _ in range(BISECTIONS):
            mid = (lo + hi) / 2
            if self.fits(mid):
                hi = mid
            else:
                lo = mid
        return lo
