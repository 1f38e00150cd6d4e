"""Communicators: one per distinct set of ranks and purpose.

NCCL gives every process group its own communicator, buffers and streams: two groups over the same
ranks for the same purpose (stages that share their devices, a tied weight's group equal to a
stage's) cost twice and serialise nothing better. Purposes stay apart on purpose:
- "collective": gradient all-reduces of a stage's replicas, tied weights;
- "p2p": one group per rank pair for the pipeline's transfers. A batched transfer runs on its
  group's own communicator and stream (pytorch/pytorch#132852): on a pair's own group it queues
  behind that pair's transfers only, never behind another peer's or an all-reduce.

Every rank asks for every group, in the same order, members or not (torch.distributed's rule for
new_group; a non-member's call returns at once). Pair groups too: torch 2.13's locally synchronised
groups (`use_local_synchronization`) are named from the ranks and the number of groups the caller
already has, which differs between ranks holding different pairs, so their rendezvous never meets.
"""

from __future__ import annotations

from typing import cast

import torch.distributed as dist


class Communicators:
    def __init__(self, world) -> None:
        self.world = world  # the default group these were made under (a new one starts afresh)
        self.groups: dict[tuple[str, tuple[int, ...]], dist.ProcessGroup] = {}
        # a new group's rendezvous and its operations time out as the world's do (trainer.timeout_s):
        # new_group's own default is torch's 30 minutes, so a peer that never joins would hold every
        # other rank that long
        self.timeout = world_timeout(world)

    def get(self, ranks, purpose: str = "collective") -> dist.ProcessGroup:
        key = (purpose, tuple(sorted(set(ranks))))
        group = self.groups.get(key)
        if group is None:
            # (on a rank outside `ranks`, torch's NON_GROUP_MEMBER marker, which that rank never uses)
            group = cast(dist.ProcessGroup, dist.new_group(list(key[1]), timeout=self.timeout))
            self.groups[key] = group
        return group

    def make_pairs(self, pairs: list[tuple[int, int]]) -> None:
        """Create the pair groups of `pairs` not made yet (every rank passes the same sorted list)."""
        for pair in pairs:
            self.get(pair, "p2p")


def world_timeout(world):
    """The timeout the default group was made with (None where its backend does not say)."""
    for device in getattr(world, "_device_types", ()):
        try:
            return world._get_backend(device).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return None


_CURRENT: Communicators | None = None


def communicators() -> Communicators:
    """The communicators of the current default process group."""
    global _CURRENT
    world = dist.distributed_c10d._get_default_group()
    if _CURRENT is None or _CURRENT.world is not world:
        _CURRENT = Communicators(world)
    return _CURRENT
