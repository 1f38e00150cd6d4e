"""What the driver (search.py) and its proposers share: the search's state and a proposer's answer.

A proposer covers one part of the plan space (per-stage 1F1B/GPipe, ZB-H1, device groups holding
several stages, stages of round-robin copies). Given the state so far (the candidates every earlier
proposer found, their bounds, the one budget's running count), it returns a Proposal: the candidates
it found, each scored by the one score (score.py), and per micro-batch size a lower bound on every
plan of its part it did not return. The driver keeps one incumbent (the fastest candidate of any
proposer), one budget (`stats.nodes`, which a proposer adds what it scored to) and one proven gap:
the incumbent against the least bound any proposer left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .branch import BranchAndBound, SearchStats
from .cost import Costed
from .limits import Limits


@dataclass
class Proposal:
    families: tuple[str, ...]  # the schedules its candidates and bounds cover
    found: list[Costed]
    # per micro-batch size: no plan of those families at that size that it did not return is faster
    bounds: dict[int, float]
    # the candidates and bounds so far were this proposer's starts only (their family is not allowed):
    # the driver keeps only its families' candidates and its bounds
    supersedes: bool = False
    # per micro-batch size, a cheaper bound of the same plans, at most `bounds` (the copies' without
    # the stages' paths): what the proposers after first aim their own bounds at, so that their
    # budgeted passes spend as they would without the dearer one (chunked_bounds.cut_bounds)
    lower: dict[int, float] | None = None


@dataclass
class SearchState:
    profile: ModelProfile
    topology: Topology
    global_batch: int
    limits: Limits
    sizes: list[int]  # the micro-batch sizes, largest first
    stats: SearchStats = field(default_factory=SearchStats)
    found: list[Costed] = field(default_factory=list)  # every admissible candidate, in the order found
    bounds: dict[int, float] = field(default_factory=dict)
    lower: dict[int, float] = field(default_factory=dict)  # (the proposals' lower where given, else their bounds)
    prior: list[Costed] = field(default_factory=list)  # the default budget's plans (a larger budget starts there)
    # one branch and bound per micro-batch size (their tables: bounds.py), made by the per-stage
    # proposer and walked again by ZB-H1's
    searches: list[BranchAndBound] = field(default_factory=list)
    # its plans are only another search's starts (the copies-only search's 1F1B and ZB-H1 starts): a
    # proposer that only finishes a plan (table_starts.py) is left out, so the starts stay the same
    for_starts: bool = False
    keep: int = 4  # the runners-up the search returns beside its plan

    def best(self) -> Costed | None:
        return min(self.found, key=lambda c: c.iteration_s, default=None)

    def incumbent(self) -> float:
        return min((c.iteration_s for c in self.found), default=math.inf)

    def gap(self) -> float:
        best = self.best()
        return proven_gap(best.iteration_s, self.bounds) if best is not None else 0.0

    def take(self, proposal: Proposal) -> None:
        if proposal.supersedes:
            self.found = [c for c in self.found if c.schedule in proposal.families]
            self.bounds, self.lower = {}, {}
        self.found += proposal.found
        self.bounds = _least(self.bounds, proposal.bounds)
        self.lower = _least(self.lower, proposal.bounds if proposal.lower is None else proposal.lower)


def _least(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    """Per micro-batch size, the lesser of two bounds (a size one lacks: the other's)."""
    return {k: min(a.get(k, math.inf), b.get(k, math.inf)) for k in {*a, *b}}


def proven_gap(best: float, bounds: dict[int, float]) -> float:
    """How far above the optimum `best` can be: 1 - (least lower bound of anything not yet ruled
    out, over every micro-batch size) / best."""
    lowest = min(bounds.values(), default=math.inf)
    return 0.0 if lowest >= best * (1 - 1e-9) else 1 - lowest / best


class Proposer(Protocol):
    """One part of the plan space. `wanted`: whether it runs on this state (its families allowed, and
    what it starts from found); `propose`: its Proposal, what it scored added to state.stats.nodes."""

    def wanted(self, state: SearchState) -> bool: ...

    def propose(self, state: SearchState) -> Proposal: ...
