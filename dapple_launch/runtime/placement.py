"""Placement: the plan's device ids become the real ranks and devices.

Device id = node × devices_per_node + local index. Rank r runs the replica the grid gives it
(ranks follow device ids, see grid.py) on node `device // devices_per_node`, local device
`device % devices_per_node`; on GPUs the rank binds exactly that CUDA device. A launcher starts one
process per device of the nodes the plan touches; a process whose device the plan leaves idle
exits at once instead of joining the process group.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from lightning.fabric.plugins.environments import ClusterEnvironment

from ..cluster import Topology
from ..planner.plan import Plan
from ..schedule.ranks import RankSchedule
from .grid import ProcessGrid


def check_plan_runs_on(plan: Plan, topology: Topology, num_layers: int | None = None) -> None:
    """Refuse a plan the cluster cannot run, before any process starts: with the numbers and the fix."""
    D, k = topology.num_devices, topology.devices_per_node
    if plan.devices_per_node and plan.devices_per_node != k:
        raise ValueError(
            f"the plan was made for {plan.devices_per_node} devices per node (device id = node × "
            f"{plan.devices_per_node} + local index) but cluster {topology.name} has cluster.devices_per_node={k}, "
            f"so its device ids would land on other GPUs; re-plan for this cluster or set "
            f"cluster.devices_per_node={plan.devices_per_node}"
        )
    for s, stage in enumerate(plan.stages):
        if len(stage.devices) != stage.replicas:
            raise ValueError(
                f"stage {s} has replicas={stage.replicas} but lists {len(stage.devices)} devices "
                f"{list(stage.devices)}; list exactly one device per replica"
            )
        bad = [d for d in stage.devices if not 0 <= d < D]
        if bad:
            raise ValueError(
                f"stage {s} is placed on device(s) {bad}, which cluster {topology.name} does not have: it has "
                f"{topology.nodes} node(s) × {k} devices = ids 0..{D - 1}; re-plan for this cluster or use one "
                f"with more nodes (cluster.nodes)"
            )
    _check_device_sharing(plan)
    stops = [s.layers for s in plan.stages]
    expected = 0
    for s, (a, z) in enumerate(stops):
        if a != expected or z <= a:
            raise ValueError(
                f"stage {s} covers layers [{a}, {z}) but must start at {expected} and hold at least "
                f"one layer: stages cut the model's layers in order, without gaps or overlap"
            )
        expected = z
    if num_layers is not None and expected != num_layers:
        raise ValueError(
            f"the plan's stages cover {expected} layers but the model has {num_layers}; re-plan for this model"
        )
    if plan.micro_batch_size * plan.num_micro_batches != plan.global_batch_size:
        raise ValueError(
            f"micro_batch_size {plan.micro_batch_size} × num_micro_batches {plan.num_micro_batches} "
            f"must equal global_batch_size {plan.global_batch_size}"
        )


def _check_device_sharing(plan: Plan) -> None:
    """One stage per device, but where the schedule puts several stages on one device group
    (interleaved, ZB-V, Chimera): there every stage of a group lists that group's devices, in one
    order (a replica's rank hands its slice of a micro-batch to the same replica of the group's
    next stage), and no device is in two groups."""
    from ..schedule import CHUNKED_SCHEDULES, RANK_ORDER_SCHEDULES

    if plan.schedule not in RANK_ORDER_SCHEDULES:
        owners: dict[int, list[int]] = {}
        for s, stage in enumerate(plan.stages):
            for d in stage.devices:
                owners.setdefault(d, []).append(s)
        shared = {d: st for d, st in owners.items() if len(st) > 1}
        if shared:
            d, st = next(iter(sorted(shared.items())))
            raise ValueError(
                f"device {d} is given to stages {sorted(set(st))} (and {len(shared) - 1} more shared device(s)); under "
                f"schedule {plan.schedule} each device runs one replica of one stage: give every replica its own "
                f"device id, or use a schedule that puts several stages on a device group ({', '.join(CHUNKED_SCHEDULES)})"
            )
        return
    schedule = plan.build_schedule()  # a ValueError naming the rule where stages and chunks do not fit the family
    assert isinstance(schedule, RankSchedule)  # (a chunked plan's)
    group_devices: dict[int, tuple[int, tuple[int, ...]]] = {}  # group -> (the first stage listing it, its devices)
    for s, stage in enumerate(plan.stages):
        groups = schedule.placement[s]
        if len(stage.devices) % len(groups):
            raise ValueError(
                f"stage {s} lists {len(stage.devices)} devices but sits on {len(groups)} device groups "
                f"under {plan.schedule} (a Chimera stage lists its down copy's devices, then its up "
                f"copy's): list the same number for each"
            )
        for g, devices in plan.devices_by_group(schedule, s):
            if len(set(devices)) != len(devices):
                raise ValueError(
                    f"stage {s} lists device(s) {sorted({d for d in devices if devices.count(d) > 1})} "
                    f"more than once in {list(devices)}: each replica runs on its own device"
                )
            first, known = group_devices.setdefault(g, (s, devices))
            if known != devices:
                raise ValueError(
                    f"stages {first} and {s} share device group {g} under {plan.schedule} but list its devices as "
                    f"{list(known)} and {list(devices)}: the stages of a group list the same devices in the same order"
                )
    seen: dict[int, int] = {}
    for g, (_, devices) in sorted(group_devices.items()):
        for d in devices:
            if seen.setdefault(d, g) != g:
                raise ValueError(
                    f"device {d} is in device groups {seen[d]} and {g} under {plan.schedule}; each device "
                    f"belongs to one group: give each group its own device ids"
                )


def check_world_size(plan: Plan, world_size: int) -> None:
    if world_size != plan.world_size:
        raise ValueError(
            f"the plan needs {plan.world_size} ranks ({plan.layout()}, devices "
            f"{[list(s.devices) for s in plan.stages]}) but this run has {world_size}; launch exactly "
            f"{plan.world_size} processes (one per planned device)"
        )


@dataclass(frozen=True)
class RankPlace:
    rank: int
    device: int  # planned device id
    node: int
    local: int  # device index inside the node: the CUDA device this rank binds


def place(plan: Plan, rank: int, devices_per_node: int) -> RankPlace:
    device = ProcessGrid.from_plan(plan).device_of(rank)
    return RankPlace(rank, device, device // devices_per_node, device % devices_per_node)


def job_shape(plan: Plan, devices_per_node: int) -> tuple[int, int]:
    """(nodes, tasks per node) of a job that has one task on every device the plan uses."""
    used = [d for s in plan.stages for d in s.devices]
    return max(used) // devices_per_node + 1, max(d % devices_per_node for d in used) + 1


def idle_devices(plan: Plan, devices_per_node: int) -> list[int]:
    nodes, per_node = job_shape(plan, devices_per_node)
    used = Counter(d for s in plan.stages for d in s.devices)
    return [
        n * devices_per_node + j for n in range(nodes) for j in range(per_node) if n * devices_per_node + j not in used
    ]


class PlannedEnvironment(ClusterEnvironment):
    """Lightning's view of a rank that a launcher started on its planned device.

    RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the launcher (local Popen or a Slurm
    task); the local and node rank come from the plan. Processes are created externally, and the
    environment registers no signal handler: under Slurm, submitit alone owns requeue."""

    def __init__(self, plan: Plan, devices_per_node: int):
        super().__init__()
        self._world = int(os.environ.get("WORLD_SIZE", str(plan.world_size)))
        self._rank = int(os.environ.get("RANK", "0"))
        check_world_size(plan, self._world)
        self.place = place(plan, self._rank, devices_per_node)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "12910"))

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self._world

    def set_world_size(self, size: int) -> None:
        pass  # fixed by the plan

    def global_rank(self) -> int:
        return self._rank

    def set_global_rank(self, rank: int) -> None:
        pass  # fixed by the launcher

    def local_rank(self) -> int:
        return self.place.local

    def node_rank(self) -> int:
        return self.place.node
