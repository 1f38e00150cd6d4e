"""A lower bound on every plan of round-robin copies at one micro-batch size, over every cut.

A plan of copies (round_robin.py) is stages of contiguous layers [i, z), stage s on r_s devices
that form c = r / gcd(r, b) canonical copies of g = gcd(r, b) devices, each copy running whole
micro-batches of b samples, b / g per device. Whatever the cuts, the order or the warm-up, a stage's
busiest copy (ceil(M / c) of the M micro-batches):

- starts no sooner than micro-batch 0's forward has crossed layers 0 .. i - 1 (each at its fastest:
  the fewest samples per device any copy can run);
- runs ceil(M / c) forwards and backwards of its layers on b / g samples, one at a time;
- runs no forward of a micro-batch before it has crossed cut i (a send of its b samples split over
  at most the copy's g devices, on the fastest link the stage and a neighbour can share);
- runs no backward of a micro-batch before its round trip: its forward on through layers z .. L - 1
  and its input gradient back (trip(z), at the fastest; of a split backward only the input's share),
  cut z crossed both ways;
- then the stage's gradient all-reduce over its r devices is left: its buckets (planner/allreduce.py)
  are all-reduced one after another, each once the copy's last gradient action has run its layers,
  so the weights of the stage's lowest layers [i, z) wait for the backward down to layer z - 1 and
  then take at least one ring all-reduce of their bytes: at least ring(w[i, z)) - B(i, z - 1) is
  left after the action, for every z.

So T >= stage(i, z, r) = fill(i) + send(i) + max(n (F + B), F + trip'(z) + n B, n F + trip'(z) + B)
+ exposed (n = ceil(M / c), trip' = trip + both sends over cut z) for every stage. And the stage's
last backward (of a split one, its last I) sends its gradient back over cut i and the layers before
it run theirs (drain(i), at the fastest, each at least its input share): the same three terms with
each B at its input share, the send and the drain after them (not the all-reduce: it runs beside).
Where two stages meet at cut i, micro-batch m crosses it from copy m mod c to copy m mod c' (c and
c' the two stages' copies), so over lcm(c, c') links, the busiest carrying ceil(M / lcm(c, c'))
activations one after another (the simulator's links are serial; two plain stages, one copy each,
share one link for all M), each split over the smaller copy and over the network where the two
stages hold more devices than a node: T >= fill(i) + (ceil(M / lcm) + 1) send(i) + trip(i) +
drain(i), the last of them followed by its round trip and its gradient's way back (VGG-19 on 16 × 1
V100: a relaxation of copies 2:2 at a conv cut, each pair of copies one link, was a third of what
it simulates at without it). The stages' device counts sum to at most D. The least T for which
some cut and device counts keep every term under T is the bound: for a trial T each span [i, z)
needs the fewest r whose stage time is at most T (a running minimum over r, as more devices are not
always faster: the all-reduce grows), as a plain stage, as one after a plain stage, and as copies;
a dynamic programme over the cuts and whether the last stage is plain finds the least total, and
bisection on T finds where it first fits in D. Up to PAIR_DEVICES devices a second programme, over
the cuts and the last stage's device count, prices every link between two stages too, from there.
An all-reduce is priced on the best placement of r devices (inside one node when r fits one); the
other cuts' sends are left out and the backwards count at their input share, so it holds for both
families (a split backward may end on a W). The search over copies returns only layouts with a stage
of copies (r not dividing b): an all-plain layout is a plan of the exact families, bounded there. So
with `copies_required` the first programme carries whether a stage of copies came yet and counts
only the layouts that hold one (BERT-48 on 16 × 1 V100 at 10 Gbps, G 64: where every stage plain
fit the relaxation, 759 -> 919 ms); the second, every link priced, starts from its value. Up to
copies_paths.PATH_DEVICES devices and under a cap, a third carries each stage's path through the
stages before it, their sends included (copies_paths.py), from the second's value."""

from __future__ import annotations

import math

import numpy as np

from ..cluster import Topology, ring_allreduce_s
from ..profile.model_profile import ModelProfile, kept_of
from .allreduce import tied_floor_s
from .copies_paths import PATH_BISECTIONS, PATH_DEVICES, StagePaths
from .in_flight import runs_of_holds

BISECTIONS = 30  # halvings of [lo, hi]: within 1e-9 of the relaxation's optimum
PAIR_DEVICES = 64  # up to this many devices, each cut's link is priced on both stages' counts (D^2 per cut)


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
        copies_required: bool = False,
        keeps_activations: bool = True,
    ):
        self.copies_required = copies_required
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
        # (r >= k: no neighbour fits the node beside it, so its sends cross nodes)
        # (g = r: a plain stage, one copy, whose sends to a plain neighbour share one link)
        keys = zip(g.tolist(), turns.tolist(), (every > k).tolist(), (every >= k).tolist(), (g == every).tolist())
        classes = [alike.setdefault(key, x) for x, key in enumerate(keys)]  # each count's fewest alike
        pick = np.array(sorted(alike.values()))
        column_of = {int(x): int(np.searchsorted(pick, x)) for x in pick}
        self.column_of = [-1] + [column_of[x] for x in classes]  # [r]: the column of r's class
        r, g, turns = every[pick], g[pick], turns[pick]
        n = b // g
        # micro-batch 0's forward through layer l at its fastest: the fewest samples per device
        least = float(n.min())
        fwd, bwd = map(np.asarray, profile.layer_seconds(least))
        self.fill = np.concatenate(([0.0], np.cumsum(fwd))) * speed  # fill[i]: layers 0 .. i - 1
        # its input gradient's way back through them: a split backward's I, B less its W share (at
        # least what the layer of largest share leaves, and a half where any layer is unmeasured:
        # ModelProfile.least_input_share; a half alone did not hold for a stage of measured layers)
        back = profile.least_input_share()
        each = (fwd + back * bwd) * speed
        trip = np.concatenate((np.cumsum(each[::-1])[::-1], [0.0]))  # trip[z]: layers z .. L - 1 and back
        # a gradient's way on back through layers 0 .. i - 1 (drain[i]) once a stage has run its
        # backward (a split backward's I: the first stage's W, a whole backward, is no less)
        drain = np.concatenate(([0.0], np.cumsum(back * bwd * speed)))
        (inter_bw, inter_lat), (best_bw, best_lat) = (
            topology.allreduce_link(True),
            topology.fastest_allreduce_link(False),
        )
        across = r > k  # (r devices fit one node otherwise: the best placement)
        link = (np.where(across, inter_bw, best_bw), np.where(across, inter_lat, best_lat))
        per = n / pbs
        # a micro-batch's cut crosses to the next stage's copy (its activation) and back (its
        # gradient) over a link between two ranks (round_robin.rr_costs: the larger of the two
        # copies' shares over the slower link of the two stages' devices), so at least the cut's
        # b samples split over this copy's g devices, on the fastest link the pair can use: inside
        # a node only where this stage and a neighbour fit one (r < k)
        # (a pair that fits one node may still sit across two, whose link may be the faster one)
        p2p = r >= k
        (across_bw, across_lat), (best_bw, best_lat) = topology.fastest_p2p_link(True), topology.fastest_p2p_link(False)
        send_bw, send_lat = np.where(p2p, across_bw, best_bw), np.where(p2p, across_lat, best_lat)
        cut = np.append(np.asarray(profile.cut_bytes[: L - 1], dtype=float) * b / pbs, 0.0)  # cut[z - 1]: after z - 1
        send = send_lat + cut[:, None] / (g * send_bw)  # send[z - 1]: over cut z, z = 1 .. L - 1
        send[L - 1] = 0.0  # (the last stage sends nothing on)
        # per start i, every stop z > i at once: rows z = i + 1 .. L, columns r = 1 .. D
        rows, joined = [], []  # (joined: over the plain columns only)
        # what a copy's device keeps per micro-batch in flight (ModelProfile.kept_bytes) and holds
        # beside them at a step (ModelProfile.workspace: its layers' largest fixed part and part per
        # sample), on its b / g samples
        kept_all, kept_fixed = np.asarray(pre["m"]), np.asarray(pre["mf"])
        received = np.concatenate(([0.0], np.asarray(profile.cut_bytes[: L - 1], dtype=float)))
        ws_fixed = np.asarray([min(x.workspace_fixed_bytes, x.workspace_bytes) for x in profile.layers])
        ws_slope = np.asarray([x.workspace_bytes for x in profile.layers]) - ws_fixed
        plain = np.nonzero(g == r)[0]  # the columns of plain stages (one copy: r divides b)
        other = np.nonzero(g != r)[0]
        # (up to copies_paths.PATH_DEVICES devices, each start's forwards and backwards are kept for
        # the third programme, which reads them and the sends again: its links are the pairs')
        spans = [] if D <= PATH_DEVICES and D <= PAIR_DEVICES else None
        for i in range(L):
            z = np.arange(i + 1, L + 1)[:, None]
            forward = ((ff[z] - ff[i]) + (f[z] - f[i] - (ff[z] - ff[i])) * per) * speed
            backward = ((bf[z] - bf[i]) + (bw[z] - bw[i] - (bf[z] - bf[i])) * per) * speed  # B(i, z)
            if spans is not None:
                spans.append((forward, backward))
            # the buckets holding layers i .. z - 1 are complete no sooner than a backward over
            # [i, stop) has run its layers down to z - 1, and their all-reduces (one after another,
            # together at least one ring of their bytes) begin no sooner: they end at least
            # ring(w[i, z)) - B(i, z - 1) after the action; the most over z <= stop is what a stage
            # [i, stop) leaves exposed at least (a W, a share of B, hides less)
            w = params[z] - params[i]
            below = ((bf[z - 1] - bf[i]) + (bw[z - 1] - bw[i] - (bf[z - 1] - bf[i])) * per) * speed
            left = np.where(w > 0, ring_allreduce_s(r, w, link), 0.0) - below  # (0 where r = 1)
            exposed = np.maximum(0.0, np.maximum.accumulate(left, axis=0))
            if profile.tied:  # a weight it shares with a layer outside it: summed after (allreduce.py)
                exposed = exposed + tied_floor_s(profile, i, z[:, 0], r, topology)
            # no backward before a micro-batch's round trip through layers z .. L - 1, its cut z
            # crossed both ways: not the first one's (all backwards after it), nor the last one's
            # (after all forwards); no forward before the micro-batch has crossed cut i
            back_and_forth = trip[z] + 2 * send[z[:, 0] - 1]
            busy = np.maximum(
                turns * (forward + backward),
                np.maximum(forward + back_and_forth + turns * backward, turns * forward + back_and_forth + backward),
            )
            arrive = send[i - 1] if i > 0 else np.zeros(len(r))
            # the stage's last backward (a split one's last I, at least its share of B) is followed
            # by that gradient's send over cut i and the drain: each of the three above again, the
            # backwards at their input share and the drain after (the all-reduce left runs beside it)
            light = back * backward
            after = arrive + drain[i] if i > 0 else 0.0
            drained = after + np.maximum(
                turns * (forward + light),
                np.maximum(forward + back_and_forth + turns * light, turns * forward + back_and_forth + light),
            )
            stage = self.fill[i] + arrive + np.maximum(busy + exposed, drained)
            if keeps_activations:
                stage = np.maximum(
                    stage,
                    self.fill[i]
                    + arrive
                    + forward
                    + self._in_flight(
                        kept_all[z] - kept_all[i],
                        kept_fixed[z] - kept_fixed[i],
                        received[i],
                        np.maximum.accumulate(ws_fixed[i:])[:, None]
                        + np.maximum.accumulate(ws_slope[i:])[:, None] * per,
                        w * optimizer_factor,
                        capacity_bytes,
                        n,
                        pbs,
                        turns,
                        back_and_forth + light,
                    ),
                )
            stage[(w[:, 0] * optimizer_factor > capacity_bytes)] = np.inf
            rows.append(stage)
            # a plain stage after a plain stage: all M activations over their one link, one after
            # another (rank_simulate.py: a link is a serial resource), the first once micro-batch
            # 0 has crossed layers 0 .. i - 1, the last followed by its round trip through layers
            # i .. L - 1 and its gradient's way back over the cut (a send split over at most this
            # stage's r devices)
            pair = self.fill[i] + (M + 1) * arrive[plain] + trip[i] + drain[i] if i > 0 else 0.0
            joined.append(np.maximum(stage[:, plain], pair))
        self.spans = np.triu_indices(L + 1, 1)  # every span [i, z), in the rows' order
        self.stage = stage = np.concatenate(rows)
        self.joined = np.concatenate(joined)
        # the least stage time with at most r devices, among copies, plain stages, and plain stages
        # after a plain stage (its own time or its link's, whichever is more): nonincreasing in r,
        # so a trial T's fewest devices per span follow from a count of the entries above T
        # (their least, their columns' device counts)
        self.kinds = [
            (np.minimum.accumulate(table, axis=1), np.append(r[columns], np.inf))
            for table, columns in ((stage[:, other], other), (stage[:, plain], plain), (self.joined, plain))
        ]
        self.plain_column = {int(x): j for j, x in enumerate(plain)}
        self.L, self.D = L, D
        self.pairs: np.ndarray | None = None  # (made when bound() first needs them: _pair_tables)
        self.fitting, self.priced_links = math.inf, False  # (bound()'s: what relaxed_layout reads)
        self.before_paths = math.nan  # (bound()'s value before its third programme)
        self._pair_inputs = (topology, M, b, cut, trip, drain) if D <= PAIR_DEVICES else None
        self._path_inputs = (spans, send, turns, back) if spans is not None else None

    @staticmethod
    def _in_flight(kept, kept_fixed, received, workspace, weights, capacity, samples, pbs, turns, hold):
        """The busiest copy's micro-batches, K at most in flight (memory), each held a round trip.

        Without recomputation (none under strategy.recompute=auto or none: cost.recompute_sets) a
        copy's device keeps each micro-batch's activations from its forward's end to its backward's
        (a split one's I: its W frees the rest later), at least `hold` = the round trip through the
        layers after it with both sends and its own input gradient. The simulator's peak holds
        them all with a step's workspace beside (rank_simulate.py), and the plan fits only within
        capacity: at most K = (capacity - weights - workspace) / kept at once. Intervals of which at
        most K overlap split into K disjoint runs (an interval graph's colouring), so one run holds
        ceil(n / K) of the copy's n, one after another, the first after a forward: this returns
        ceil(n / K) hold (inf where none fits). Memory-bound models (Llama 3 70B on 256 A100s: three
        layers a device leave room for two micro-batches) are bound here, not by their compute."""
        held = kept_of(kept_fixed, kept, received, samples, pbs)  # (ModelProfile.kept_bytes)
        room = capacity - weights - workspace
        runs = runs_of_holds(room, held, turns)
        with np.errstate(invalid="ignore"):
            return np.where(np.isfinite(runs), runs * hold, np.inf)  # (inf where none fits, not inf × 0)

    def _pair_tables(self, topology: Topology, M: int, b: int, cut: np.ndarray, trip: np.ndarray, drain: np.ndarray):
        """The link between two neighbouring stages (the docstring's pairs): pair[z, rA, rB] for the
        stages before and after cut z on rA and rB devices, and each stage's own term per count:
        stage_by_count[span, r] (its class's fewest devices: the all-reduce only grows with r)."""
        L, D, k = self.L, self.D, topology.devices_per_node
        every = np.arange(1, D + 1)
        g = np.gcd(every, b)
        c = every // g
        # micro-batch m runs on copy m mod c of every stage (round_robin.rank_of), so the activations
        # over cut z go over lcm(cA, cB) links, the busiest carrying ceil(M / lcm) of them
        turns = -(-M // np.lcm(c[:, None], c[None, :]))
        least_g = np.minimum(g[:, None], g[None, :])  # (rr_costs: the cut over the smaller copy)
        across = (every[:, None] + every[None, :]) > k  # (more devices than a node: some link leaves it)
        (across_bw, across_lat), (best_bw, best_lat) = topology.fastest_p2p_link(True), topology.fastest_p2p_link(False)
        bw, lat = np.where(across, across_bw, best_bw), np.where(across, across_lat, best_lat)
        pairs = np.full((L + 1, D, D), np.inf)
        for z in range(1, L):
            send = lat + cut[z - 1] / (least_g * bw)
            pairs[z] = self.fill[z] + (turns + 1) * send + trip[z] + drain[z]
        self.pairs = pairs
        column = np.asarray(self.column_of[1:])  # (count r at index r - 1)
        dense = np.full((L + 1, L + 1, D), np.inf)  # [start, stop, r - 1]
        dense[self.spans[0], self.spans[1]] = self.stage[:, column]
        self.stage_by_count = dense

    def pair_s(self, cut: int, before: int, after: int) -> float:
        """What the bound asks of the link over `cut` between a stage of `before` devices and the next
        of `after` (the docstring's pairs)."""
        if self.pairs is None and self._pair_inputs is not None:
            self._pair_tables(*self._pair_inputs)
        assert self.pairs is not None
        return float(self.pairs[cut, before - 1, after - 1])

    def stage_s(self, start: int, stop: int, replicas: int, after_plain: bool = False) -> float:
        """What the bound asks of a stage [start, stop) on `replicas` devices (the least over its
        class of alike counts); `after_plain`: of a plain stage after a plain stage, its link's too."""
        row = start * self.L - start * (start - 1) // 2 + (stop - start - 1)  # (the spans' order)
        column = self.column_of[replicas]
        return float(self.joined[row, self.plain_column[column]] if after_plain else self.stage[row, column])

    def fits(self, T: float) -> bool:
        """Some cut and device counts keep every stage's time at most T within D devices (each link
        between two stages priced only where both are plain: _fits_pairs prices every one)."""
        # fewest devices per span [i, z) (inf: none suffice), as copies, as a plain stage, and as
        # a plain stage after a plain stage: need[kind, z, i]
        need = np.full((3, self.L + 1, self.L + 1), np.inf)
        for kind, (least, counts) in enumerate(self.kinds):
            need[kind][self.spans[1], self.spans[0]] = counts[(least > T).sum(axis=1)]
        other, plain, joined = need
        # fewest devices to hold layers 0 .. stop - 1: its last stage copies; plain, with copies
        # before it; plain, with none (the first stage has no stage before it: as if after copies
        # for its link, but no copies yet); `before`: the least of the three (0 before layer 0)
        after_other, after_plain, only_plain = (np.full(self.L + 1, np.inf) for _ in range(3))
        before = np.full(self.L + 1, np.inf)
        before[0] = 0.0
        for stop in range(1, self.L + 1):
            after_other[stop] = (before[:stop] + other[stop, :stop]).min()
            after_plain[stop] = min(
                (after_other[:stop] + plain[stop, :stop]).min(), (after_plain[:stop] + joined[stop, :stop]).min()
            )
            only_plain[stop] = min(plain[stop, 0], (only_plain[:stop] + joined[stop, :stop]).min())
            before[stop] = min(after_other[stop], after_plain[stop], only_plain[stop])
        fewest = min(after_plain[self.L], after_other[self.L])
        if not self.copies_required:
            fewest = min(fewest, only_plain[self.L])
        return bool(fewest <= self.D)

    def _fits_pairs(self, T: float) -> bool:
        """fits, with each cut's link between the two stages' device counts (_pairs_programme)."""
        return bool(self._pairs_programme(T)[0][self.L].min() <= self.D)

    def _pairs_programme(self, T: float, keep: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """fewest[z, r - 1] = the fewest devices that hold layers 0 .. z - 1 with every stage's and
        link's term at most T, the last stage on r; with `keep`, each entry's choice too:
        parent[z, r - 1] = (the last stage's start, the stage before's r - 1)."""
        assert self.pairs is not None
        L, D = self.L, self.D
        counts = np.arange(1, D + 1, dtype=float)
        cost = np.where(self.stage_by_count <= T, counts, np.inf)  # [start, stop, r - 1]
        blocked = np.where(self.pairs <= T, 0.0, np.inf)  # [cut, before - 1, after - 1]
        # (every layout, a stage of copies or not: a relaxation of fits' requirement, kept to one
        # programme since its tables cost D^2 per cut; the bisection starts from fits' value)
        fewest = np.full((L + 1, D), np.inf)
        parent = np.zeros((L + 1, D, 2), dtype=int) if keep else None
        columns = np.arange(D)
        for z in range(L):
            # the fewest devices before a stage that starts at layer z on r (none before layer 0)
            prior = columns * 0
            if z == 0:
                before = np.zeros(D)
            else:
                through = fewest[z][:, None] + blocked[z]  # [before - 1, after - 1]
                if parent is None:
                    before = through.min(axis=0)
                else:
                    prior = through.argmin(axis=0)
                    before = through[prior, columns]
            if not np.isfinite(before).any():
                continue
            total = before[None, :] + cost[z, z + 1 :]  # [stop - z - 1, r - 1]
            if parent is not None:  # (the first of equal choices kept)
                better = total < fewest[z + 1 :]
                parent[z + 1 :, :, 0] = np.where(better, z, parent[z + 1 :, :, 0])
                parent[z + 1 :, :, 1] = np.where(better, prior[None, :], parent[z + 1 :, :, 1])
            fewest[z + 1 :] = np.minimum(fewest[z + 1 :], total)
        return fewest, parent

    def bound(self, above: float = 0.0, cap: float = math.inf) -> float:
        """The least T that fits, from below: a T known not to fit (never more than the optimum of
        the relaxation). `above`: a valid bound already known (the search starts there); `cap`: a
        bound is only wanted up to it (a T there that does not fit is returned as it is). First
        with fits, then (up to PAIR_DEVICES devices) from there with every link priced, which only
        raises it: its tables and programme cost D^2 per cut, so where no link binds, one trial.
        self.fitting: the least T the last programme was seen to fit (inf: none below the cap)."""
        finite = np.concatenate([least[np.isfinite(least)] for least, _ in self.kinds])
        value, self.fitting = _least_fitting(self.fits, finite, above, cap)
        self.priced_links = False
        self.before_paths = value  # (the bound without the paths' programme: layout_bounds' `lower`)
        if self._pair_inputs is None or value >= cap or not math.isfinite(value):
            return value
        if self.pairs is None:
            self._pair_tables(*self._pair_inputs)
        assert self.pairs is not None
        finite = np.concatenate([finite, self.pairs[np.isfinite(self.pairs)]])
        value, self.fitting = _least_fitting(self._fits_pairs, finite, value, cap)
        self.priced_links = True
        self.before_paths = value
        # then (up to PATH_DEVICES devices, and only up to a cap: its terms are not among `finite`)
        # with each stage's path through the stages before it (copies_paths.py), which only raises
        # it; self.fitting stays the pairs' (relaxed_layout's start is their layout)
        paths = self.stage_paths()
        if paths is not None and value < cap and math.isfinite(cap):
            pairs = self.pairs
            fits = lambda T: paths.fits(T, self.stage_by_count, pairs)
            value = _least_fitting(fits, finite, value, cap, PATH_BISECTIONS)[0]
        return value

    def stage_paths(self) -> StagePaths | None:
        """The third programme's tables (copies_paths.py) on this bound's, up to its devices."""
        return None if self._path_inputs is None else StagePaths(*self._path_inputs, self.column_of)

    def relaxed_layout(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The relaxation's own layout where bound() priced every link and found a T that fits: the
        cuts (each stage's stop) and device counts that fit it on the fewest devices (_pairs_programme
        with its choices kept). Not a plan's time, a start: the search of copies walks from
        it (VGG-19 on 16 × 1 V100 at 10 Gbps, G 64, b 1: 8:2:5:1 cut@12,14,17, 61.6 ms at its stages'
        fitted warm-ups, against 65.7 ms found without it). None where there is none."""
        if not self.priced_links or not math.isfinite(self.fitting) or self.pairs is None:
            return None
        L, D = self.L, self.D
        fewest, parent = self._pairs_programme(self.fitting, keep=True)
        assert parent is not None
        last = int(fewest[L].argmin())
        if fewest[L, last] > D:
            return None
        stops, replicas, stop, r = [], [], L, last
        while stop > 0:
            stops.append(stop)
            replicas.append(r + 1)
            stop, r = int(parent[stop, r, 0]), int(parent[stop, r, 1])
        return tuple(reversed(stops)), tuple(reversed(replicas))


def _least_fitting(
    fits, finite: np.ndarray, lo: float, cap: float, bisections: int = BISECTIONS
) -> tuple[float, float]:
    """Bisection for the least T where fits(T), from lo (a bound already) up to cap (a T there that
    does not fit is returned as it is). Past the largest finite term (`finite`: every stage's and
    link's) no span needs fewer devices and no link blocks: a T there fits if any does. Returns the
    bound and the least T seen to fit (inf where none was)."""
    hi = cap if math.isfinite(cap) else float(finite.max()) if finite.size else math.inf
    if lo >= hi:
        return lo, math.inf
    if fits(lo):
        return lo, lo
    if not math.isfinite(hi) or not fits(hi):
        return (cap if math.isfinite(cap) else math.inf), math.inf
    for _ in range(bisections):
        mid = (lo + hi) / 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return lo, hi
