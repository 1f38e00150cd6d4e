"""The third programme of the bound on plans of round-robin copies (copies_bound.py): the stages' paths.

copies_bound's stage terms take micro-batch 0's way to a stage and the last one's way back each
layer at its fastest, and leave out the sends over the cuts before the stage: its programmes' states
do not say where those cuts are. Where a slow link joins the stages, those sends are much of a
plan's time (AmoebaNet-36 on 16 × 1 V100, VGG-19 at 10 Gbps). This programme carries them: over the
layouts of layers 0 .. i - 1 on d devices whose last stage has q devices it keeps the least path
P(i, d, q) through the prefix's stages: each one's forward and input gradient (a first stage's whole
backward, all W under a split one: cost.stage_costs) on its copies' samples per device, and both
sends over each cut between them (the cut's bytes split over the receiving copy's devices, on the
fastest link the pair may use: copies_bound's send table, which rr_costs' sends never beat). A stage
[i, z) on r devices after that prefix then takes at least

    P(i, d, q) + 2 send(i) + n (F + B) - min(n, min(i, d) + 1) (1 - a) B

(n: its busiest copy's micro-batches; a: ModelProfile.least_input_share, so a W is at most (1 - a) B):
the copy starts no sooner than its first micro-batch has crossed the prefix and cut i; then runs,
one at a time, all its forwards and input gradients and all but at most s + 1 of its W before its
last I (s: the stage's index, at most min(i, d) as each stage before holds a layer and a device;
ZB-H1's stage order holds back s W's, zero_bubble.stage_order; 1F1B's last B ends its work); that
gradient then crosses cut i and the prefix back, each stage's I in turn and the first stage's
backward. A plan's layout is a path of this programme on which every stage meets that, its own term
(copies_bound's stage table) and its link's (the pairs) under the plan's time: so where no path fits
within D devices at T, T is a bound. Its states are D^2 per cut: up to PATH_DEVICES devices.
"""

from __future__ import annotations

import numpy as np

PATH_DEVICES = 16  # up to this many devices (its states and steps grow as D^2 per cut)
PATH_BISECTIONS = 12  # halvings of [the pairs' bound, the cap]: a bound within 1/4096 of that span


class StagePaths:
    """Per start i, each stop's and device count's path step and stage term (the docstring's), and
    fits(T). Read from copies_bound's tables, whose columns are classes of alike device counts
    (`column_of[r]`: r's class; a class shares its copies' devices, turns and links, so its
    forwards, backwards and sends are every member's): `spans[i]`, the forwards and backwards of
    every stop after i per class; `send[z - 1]`, the send over cut z per class; `turns` per class;
    `back`, ModelProfile.least_input_share."""

    def __init__(self, spans: list, send: np.ndarray, turns: np.ndarray, back: float, column_of: list[int]):
        L, D = len(spans), len(column_of) - 1
        columns = np.asarray(column_of[1:])  # (count r at index r - 1)
        self.turns = turns[columns]  # the busiest copy's micro-batches
        self.rows = []  # per start i: (step, core, held), each (stops i + 1 .. L, counts 1 .. D)
        for i, (forward, backward) in enumerate(spans):
            forward, backward = forward[:, columns], backward[:, columns]
            over = send[i - 1, columns] if i > 0 else np.zeros(D)  # (over cut i)
            step = forward + (back * backward if i > 0 else backward) + 2 * over  # (what it adds to a path)
            core = self.turns * (forward + backward) + 2 * over  # (its work and its cut both ways)
            self.rows.append((step, core, (1 - back) * backward))  # (held: a W at most)
        self.L, self.D = L, D

    def fits(self, T: float, own: np.ndarray, pairs: np.ndarray) -> bool:
        """Some layout within D devices meets every stage's term here, its own (own[start, stop, r - 1]:
        copies_bound's stage_by_count) and each link's (pairs[cut, before - 1, after - 1]) at T."""
        L, D = self.L, self.D
        reach = np.full((L + 1, D + 1, D + 1), np.inf)  # [i, d, q]: the least path (q = 0: no stage yet)
        reach[0, 0, 0] = 0.0
        counts = np.arange(1, D + 1)
        room = np.arange(D + 1)[:, None] + counts[None, :] <= D  # [d, r - 1]: r more devices fit
        for i in range(L):
            here = reach[i]
            if not np.isfinite(here).any():
                continue
            step, core, held = self.rows[i]
            allowed = own[i, i + 1 :, :] <= T  # [stop, r - 1]
            if i > 0:  # (after a stage of q devices whose link to this one meets T)
                linked = (pairs[i] <= T)[None, :, :]  # [1, q - 1, r - 1]
                base = np.where(linked, here[:, 1:, None], np.inf).min(axis=1)  # [d, r - 1]
                most = np.minimum(self.turns[None, :], np.minimum(i, np.arange(D + 1))[:, None] + 1)  # W's held
                term = base[None] + core[:, None, :] - most[None] * held[:, None, :]
                ok = (term <= T) & allowed[:, None, :] & room[None]
            else:
                base = np.broadcast_to(here[:, :1], (D + 1, D))
                ok = allowed[:, None, :] & room[None]
            cand = np.where(ok, base[None] + step[:, None, :], np.inf)  # [stop, d, r - 1]
            for j in np.flatnonzero(ok.any(axis=(0, 1))):
                r = j + 1
                view = reach[i + 1 :, r:, r]
                np.minimum(view, cand[:, : D + 1 - r, j], out=view)
        return bool(np.isfinite(reach[L]).any())

    def terms(self, stops: list[int], replicas: list[int]) -> list[float]:
        """Each stage's term after the first on one layout (`stops`: each stage's stop), with its own
        index s for the W's held back (the programme's min(i, d) + 1 is at least s + 1): what a plan
        of that layout takes at least, for the tests."""
        out, path, start = [], 0.0, 0
        for s, (stop, r) in enumerate(zip(stops, replicas)):
            step, core, held = self.rows[start]
            z, j = stop - start - 1, r - 1
            if s:
                out.append(float(path + core[z, j] - min(self.turns[j], s + 1) * held[z, j]))
            path += float(step[z, j])
            start = stop
        return out
