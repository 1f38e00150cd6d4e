"""The proposer of each stage's own warm-up depth for the exact families' plans (1F1B, ZB-H1).

The per-stage searches try one warm-up depth for every stage (×1 to strategy.max_warmup_depth):
a plan whose one slow link wants the stage before it deep, and the rest shallow, pays either the
link's stalls or the others' memory and their gradients sent late. From the best plan of each exact
family, a steepest descent over the stages' own depths (polish.stage_depths), its layout and
micro-batches kept. Its plans are of the exact families, whose bounds hold whatever the warm-up
(bounds.py): it returns no bound of its own. Last of the proposers, so no other proposer's path
depends on it."""

from __future__ import annotations

from .polish import stage_depths
from .proposal import Proposal, SearchState

FAMILIES = ("1f1b", "zb_h1")
SHARE = 1 / 4  # of strategy.search_nodes, per family


class StageWarmups:
    def wanted(self, state: SearchState) -> bool:
        allowed = state.limits.allowed()
        return state.limits.max_warmup_depth > 1 and any(
            c.schedule in FAMILIES for c in state.found if c.schedule in allowed
        )

    def propose(self, state: SearchState) -> Proposal:
        found = []
        for family in FAMILIES:
            if family not in state.limits.allowed():
                continue
            start = min(
                (c for c in state.found if c.schedule == family and c.fits),
                key=lambda c: (c.iteration_s, c.summary()),
                default=None,
            )
            if start is None:
                continue
            better, cost = stage_depths(
                start,
                state.profile,
                state.topology,
                state.global_batch,
                state.limits,
                state.limits.search_nodes * SHARE,
            )
            state.stats.nodes += cost
            if better is not start:
                found.append(better)
        return Proposal(FAMILIES, found, {})
