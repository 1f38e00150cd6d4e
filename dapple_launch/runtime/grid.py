"""The process grid: which rank runs which replica of which stage, and on which device."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..planner.plan import Plan
from ..schedule.transfers import split_bounds, split_sizes  # noqa: F401 (the runtime's names for them)


@dataclass(frozen=True)
class ProcessGrid:
    """Which rank runs which (stage, replica), and on which planned device.

    Ranks follow the planned device ids: the rank of a replica is the position of its device
    among all the plan's devices in increasing order. A launcher that starts rank r on the r-th
    used device (Slurm's block distribution does: node by node, local index by local index) thus
    puts every replica on the device the planner placed it on. For the planner's contiguous
    placements this is stage-major numbering (stage 0's replicas first)."""

    replicas: tuple[int, ...]
    devices: tuple[tuple[int, ...], ...] = ()
    _ranks: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self):
        if not self.devices:
            object.__setattr__(self, "devices", _stage_major(self.replicas))
        # several stages may share their devices (interleaved and ZB-V: a device group's chunks; Chimera:
        # the two copies of stages s and D-1-s on the same two groups): then all of them; else none
        groups = list(dict.fromkeys(frozenset(ds) for ds in self.devices))
        flat = [d for ds in groups for d in ds]
        if (
            [len(d) for d in self.devices] != list(self.replicas)
            or len(set(flat)) != len(flat)
            or any(len(set(ds)) != len(ds) for ds in self.devices)
        ):
            raise ValueError(
                f"devices {list(map(list, self.devices))} must name {list(self.replicas)} distinct "
                f"devices per stage; stages sharing devices share all of them"
            )
        order = {d: r for r, d in enumerate(sorted(flat))}
        object.__setattr__(self, "_ranks", tuple(tuple(order[d] for d in ds) for ds in self.devices))

    @classmethod
    def from_plan(cls, plan: Plan) -> ProcessGrid:
        return cls(tuple(s.replicas for s in plan.stages), tuple(tuple(s.devices) for s in plan.stages))

    @property
    def world_size(self) -> int:
        return len({d for ds in self.devices for d in ds})

    def stages_at(self, rank: int) -> tuple[int, ...]:
        """The stages a rank holds (several where a device group holds chunks), in stage order."""
        return tuple(s for s, ranks in enumerate(self._ranks) if rank in ranks)

    @property
    def num_stages(self) -> int:
        return len(self.replicas)

    def stage_ranks(self, stage: int) -> list[int]:
        return list(self._ranks[stage])

    def position(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of a rank."""
        for s, ranks in enumerate(self._ranks):
            if rank in ranks:
                return s, ranks.index(rank)
        raise ValueError(f"rank {rank} is beyond the plan's {self.world_size} ranks")

    def device_of(self, rank: int) -> int:
        s, j = self.position(rank)
        return self.devices[s][j]

    def rank_of_device(self, device: int) -> int | None:
        """The rank that runs on a planned device id, or None for a device the plan leaves idle."""
        for ds, ranks in zip(self.devices, self._ranks):
            if device in ds:
                return ranks[ds.index(device)]
        return None


def _stage_major(replicas: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    out, d = [], 0
    for r in replicas:
        out.append(tuple(range(d, d + r)))
        d += r
    return tuple(out)


def group_ranks(grid, schedule, group: int) -> list[int]:
    """The ranks of device group `group` (the one running orders[group]): the devices of its first
    stage, or for a stage on several groups (Chimera's two pipelines, round-robin copies) that
    group's part of them: a stage lists its groups' devices in the order of its placement, in equal
    parts (Chimera: the down pipeline's copy first)."""
    s = schedule.stages_of(group)[0]
    ranks, groups = grid.stage_ranks(s), schedule.placement[s]
    part = len(ranks) // len(groups)
    j = groups.index(group)
    return ranks[j * part : (j + 1) * part]
