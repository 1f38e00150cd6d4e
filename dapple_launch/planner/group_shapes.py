"""The shapes of device groups holding several stages (interleaved 1F1B and zero bubble, ZB-V,
Chimera): a shape is (family, stages per group v, the groups' replica counts, micro-batch size b),
the part of a candidate its cuts leave open. Only shapes whose micro-batches suit the groups and
whose groups can hold the model at some cut (shape_memory.holds_model) are drawn."""

from __future__ import annotations

import itertools

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .branch import replica_choices
from .chunked import CHUNKED, INTERLEAVED
from .limits import Limits
from .shape_memory import holds_model

INTERLEAVED_CHUNKS = (2, 3, 4)  # interleaved schedules' stages per group, tried


def _compositions(total: int, parts: int):
    for cut in itertools.combinations(range(1, total), parts - 1):
        yield tuple(b - a for a, b in zip((0, *cut), (*cut, total)))


def groupings(topology: Topology, groups: int) -> list[tuple[int, ...]]:
    """Up to 8 devices every composition; beyond, equal groups and every split into two groups whose
    counts the plain search allows a stage (1 .. a node, then whole nodes: branch.replica_choices)."""
    devices = topology.num_devices
    if devices <= 8:
        return list(_compositions(devices, groups))
    out = [(devices // groups,) * groups] if devices % groups == 0 else []
    if groups == 2:
        allowed = set(replica_choices(topology, devices))
        out += [
            (r, devices - r) for r in range(1, devices) if r * 2 != devices and r in allowed and devices - r in allowed
        ]
    return out


def shapes(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, sizes: list[int]):
    """(family, v, groups, b) for every chunked family the limits allow."""
    L, D = profile.num_layers, topology.num_devices
    families = [f for f in limits.allowed() if f in CHUNKED]
    for family in families:
        for v in INTERLEAVED_CHUNKS if family in INTERLEAVED else (2,):
            most = min(D, L) if family == "chimera" else min(D, L // v)
            for P in range(2, most + 1):  # (one group: a plain stage does as well)
                if family == "chimera" and P % 2:
                    continue
                for groups in groupings(topology, P):
                    if family == "chimera" and groups != groups[::-1]:  # a stage's two copies alike
                        continue
                    for b in sizes:
                        M = global_batch // b
                        if runs_micro_batches(family, groups, b, M) and holds_model(
                            profile, topology, global_batch, limits, family, v, groups, b
                        ):
                            yield family, v, groups, b


def runs_micro_batches(family: str, groups: tuple[int, ...], b: int, M: int) -> bool:
    """M micro-batches of b samples suit the shape: each splits across its group's replicas, and
    (interleaved, Chimera) they come in units of the P groups."""
    return b >= max(groups) and (family == "zbv" or (M % len(groups) == 0 and len(groups) <= M))
