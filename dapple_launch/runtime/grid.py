"""The process grid: which rank runs which replica of which stage, and on which device."""
from __future__ import annotations

from dataclasses import dataclass

from ..planner.plan import Plan


def split_sizes(n: int, parts: int) -> list[int]:
    """Contiguous split of n samples into `parts` (torch.tensor_split's sizes: the first get one more)."""
    q, r = divmod(n, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def split_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    out, lo = [], 0
    for size in split_sizes(n, parts):
        out.append((lo, lo + size))
        lo += size
    return out


@dataclass(frozen=True)
class ProcessGrid:
    """Ranks are numbered stage by stage: stage 0's replicas first, then stage 1's, and so on."""
    replicas: tuple[int, ...]
    devices: tuple[tuple[int, ...], ...]

    @classmethod
    def from_plan(cls, plan: Plan) -> "ProcessGrid":
        return cls(tuple(s.replicas for s in plan.stages), tuple(tuple(s.devices) for s in plan.stages))

    @property
    def world_size(self) -> int:
        return sum(self.replicas)

    @property
    def num_stages(self) -> int:
        return len(self.replicas)

    def stage_ranks(self, stage: int) -> list[int]:
        start = sum(self.replicas[:stage])
        return list(range(start, start + self.replicas[stage]))

    def position(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of a rank."""
        for s, r in enumerate(self.replicas):
            if rank < r:
                return s, rank
            rank -= r
        raise ValueError(f"rank beyond the grid's {self.world_size} ranks")

    def device_of(self, rank: int) -> int:
        s, j = self.position(rank)
        return self.devices[s][j]
