"""Schedules whose ranks hold several stages: each rank (device group) runs one order of steps.

A step names its stage: (kind, stage, micro-batch). Interleaved 1F1B gives rank r the stages
r, r + P, …; ZB-V the stages r and 2P - 1 - r; Chimera runs two pipelines in opposite directions,
so stage s sits on two ranks (s and D - 1 - s) and each micro-batch takes one of them. Which rank
runs a micro-batch on a stage is where its forward is: its backward runs there too.

Transfers are implied by the steps, as plan.json's `orders` state them: a forward of (s, m) needs
the forward of (s - 1, m), a backward (B or I) of (s, m) the backward of (s + 1, m). When both run
on one rank the hand-off is local (no transfer); otherwise the producer sends over the directed
link between the two ranks. The stage-per-rank schedules (GPipe, 1F1B, ZB-H1) are the case of one
stage per rank (from_stages): one format for the validator, the simulator and plan.json.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache
from operator import itemgetter

from .actions import CODE_OF, COMPUTE_CODES, Kind, Schedule


@dataclass(frozen=True, order=True)
class Step:
    kind: Kind
    stage: int
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.kind.value}{self.micro_batch}@{self.stage}"

    def to_json(self) -> list:
        return [self.kind.value, self.stage, self.micro_batch]


@lru_cache(maxsize=1 << 16)
def shared_step(kind: Kind, stage: int, micro_batch: int) -> Step:
    """One Step per (kind, stage, micro-batch), shared (a Step is frozen): a planner's search builds
    the orders of many candidates, each of S × M steps (12,288 at 4 stages and 1,024 micro-batches),
    and making each anew took as long as simulating it."""
    return Step(kind, stage, micro_batch)


@dataclass(frozen=True)
class RankSchedule:
    name: str
    num_stages: int
    num_micro_batches: int
    orders: tuple[tuple[Step, ...], ...]  # per rank: its compute steps in order
    placement: tuple[tuple[int, ...], ...]  # per stage: the ranks holding it (two for Chimera)
    forward_only: bool = False  # evaluation: forwards alone

    @property
    def num_ranks(self) -> int:
        return len(self.orders)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages a rank holds (its chunks), in stage order."""
        return tuple(s for s, ranks in enumerate(self.placement) if rank in ranks)

    @cached_property
    def route(self) -> dict[tuple[int, int], int]:
        """(stage, micro-batch) -> the rank that runs it: where its forward is."""
        return {
            (a.stage, a.micro_batch): r for r, order in enumerate(self.orders) for a in order if a.kind is Kind.FORWARD
        }

    def with_tables(self, encoded: tuple, work: tuple, route: list[list[int]]) -> RankSchedule:
        """This schedule with the tables its simulation reads given (encoded_orders, work,
        route_table), as a generator that built them with its orders: not derived again."""
        self.__dict__.update(encoded_orders=encoded, work=work, route_table=route)
        return self

    @cached_property
    def encoded_orders(self) -> tuple[tuple[tuple[int, int, int], ...], ...]:
        """orders as (kind code, actions.CODE_OF; stage; micro-batch): what the simulator walks."""
        return tuple(tuple((CODE_OF[a.kind], a.stage, a.micro_batch) for a in order) for order in self.orders)

    @cached_property
    def work(self) -> tuple[tuple[tuple[int, int, int], ...], ...]:
        """Per rank, (kind code, stage, how many steps of that kind on that stage it runs): a rank
        computes one step at a time, so its steps' summed costs bound any simulation of the orders."""
        kind_and_stage = itemgetter(0, 1)
        tallies = (Counter(map(kind_and_stage, order)) for order in self.encoded_orders)
        return tuple(tuple((code, s, n) for (code, s), n in sorted(t.items())) for t in tallies)

    @cached_property
    def route_table(self) -> list[list[int]]:
        """route as [stage][micro-batch] -> rank (the simulator's inner loop reads it)."""
        table = [[0] * self.num_micro_batches for _ in range(self.num_stages)]
        for r, order in enumerate(self.encoded_orders):
            for code, s, m in order:
                if code == 0:  # (a forward: CODE_OF[Kind.FORWARD])
                    table[s][m] = r
        return table

    def grid(self, marks: dict[int, int] | None = None) -> str:
        """Rank × step grid; `marks` maps rank -> step index to flag."""
        marks = marks or {}
        rows = []
        for r, order in enumerate(self.orders):
            cells = [f">{a}<" if marks.get(r) == i else str(a) for i, a in enumerate(order)]
            rows.append(f"rank {r}: " + " ".join(cells))
        return "\n".join(rows)


def from_stages(schedule: Schedule) -> RankSchedule:
    """A stage-per-rank schedule (GPipe, 1F1B, ZB-H1) as rank orders: rank s runs stage s."""
    orders = tuple(
        tuple(Step(a.kind, s, a.micro_batch) for a in actions if a.kind.is_compute)
        for s, actions in enumerate(schedule.stage_actions)
    )
    return RankSchedule(
        schedule.name,
        schedule.num_stages,
        schedule.num_micro_batches,
        orders,
        tuple((s,) for s in range(schedule.num_stages)),
        schedule.forward_only,
    )


def forward_only_orders(placement: tuple[tuple[int, ...], ...], num_ranks: int, num_micro_batches: int) -> RankSchedule:
    """Evaluation over the same stages: each rank runs its stages' forwards stage by stage, every
    micro-batch in turn (GPipe's forward half: a stage's forward only waits for the one before it).
    A stage on two ranks (Chimera) takes micro-batches alternately."""
    orders: list[list[Step]] = [[] for _ in range(num_ranks)]
    for s, ranks in enumerate(placement):
        for m in range(num_micro_batches):
            orders[ranks[m % len(ranks)]].append(Step(Kind.FORWARD, s, m))
    return RankSchedule(
        "forward-only", len(placement), num_micro_batches, tuple(map(tuple, orders)), placement, forward_only=True
    )


def steps_from_json(actions: list) -> tuple[Step, ...]:
    """[[kind, stage, micro-batch], ...] (plan.json's orders) -> steps; a clear error on bad entries."""
    kinds = {k.value: k for k in COMPUTE_CODES}
    out = []
    for i, a in enumerate(actions):
        if not (
            isinstance(a, (list, tuple))
            and len(a) == 3
            and a[0] in kinds
            and all(isinstance(x, int) and x >= 0 for x in a[1:])
        ):
            raise ValueError(
                f"action {i} is {a!r}: an action is [kind, stage, micro_batch] with kind one of "
                f"{sorted(kinds)} and non-negative integers"
            )
        out.append(Step(kinds[a[0]], a[1], a[2]))
    return tuple(out)
