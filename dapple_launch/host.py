"""This machine as local processes see it: the cores they may use, the torch threads each local rank
gets, a free port. Shared by the local launcher, the link and action-cost probes and the measuring
profiler, so they all see the ranks' view; standard library only, so the pure packages may use it."""
from __future__ import annotations

import os
import socket


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which a container or Slurm may narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_rank(ranks: int, cores: int | None = None) -> int:
    """The torch threads each of `ranks` local processes gets: the cores shared out, at least one.
    The measuring profiler and the link probe use the same figure, so they see the ranks' view."""
    return max(1, (cores or usable_cores()) // ranks)


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now, for a local process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
