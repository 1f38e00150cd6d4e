"""The runtime's own cost per action on this machine, measured: Topology.action_overhead_s for a CPU
cluster of local processes.

A layer profile times layers; the executor adds its own time to every compute action on top (its
Python, the autograd engine's call, posting and reaping transfers). On a GPU that time hides behind
the kernels it queues; on a CPU cluster it is paid in full, and for small layers it is a large part
of the step (the default job: 8 actions per stage of 2 to 5 ms each, each costing about a
millisecond more than its layers). The simulator has the term (StageCosts.action_s); this probe
measures it the way benchmarks/runtime.py calibrates its sleep rows:

- start as many gloo processes as the cluster has devices, with the threads the local launcher
  gives each (they compete for the cores as the ranks will);
- run the real executor over an idle pipeline, one stage per process, 1F1B with 2P micro-batches of
  a layer too small to cost anything itself (its measured forward and backward are costed anyway),
  the iteration timed as the slowest rank's median;
- find by bisection the cost per action that makes the simulator of the same schedule, with the
  measured links' transfer times (profile/links.py), give that time.

So the figure is what the simulator is missing, not the wall time divided by the actions: the
transfers' latencies, which the links already count, are not counted twice. Cached on disk by
process count, cores and torch version, like the measured links.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..profile.links import LinkProfile

WIDTH = 64  # the idle layer's width: a transfer of a few kilobytes, latency-bound as the links' small size
ROWS = 4  # samples per micro-batch
WARMUP, ITERATIONS = 5, 40
VERSION = 1  # of the probe's method: a cache written by another is measured again


def _cache_path(processes: int, cores: int) -> Path:
    import torch

    from ..cache import cache_dir

    return cache_dir() / f"actions-gloo-{processes}p-{cores}c-torch{torch.__version__.split('+')[0]}.json"


def _time_idle_pipeline(rank: int, world: int) -> dict:
    """One rank of the probe (profile/links.run_gloo_probe): its median idle iteration, and its
    layer's own forward and backward, which the simulator is given as the stage's compute."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from ..schedule import build_schedule
    from .executor import StageExecutor
    from .grid import ProcessGrid
    from .p2p import PointToPoint

    torch.manual_seed(0)
    layer = nn.Linear(WIDTH, WIDTH)
    M = 2 * world
    ex = StageExecutor(
        [layer], lambda y, t: y.float().pow(2).mean(1), PointToPoint(ProcessGrid((1,) * world), rank, 0), world
    )
    schedule = build_schedule("1f1b", world, M)
    batch = (torch.randn(ROWS * M, WIDTH), torch.zeros(ROWS * M))
    times = []
    for i in range(WARMUP + ITERATIONS):
        dist.barrier()
        t0 = time.perf_counter()
        ex.run(schedule, batch)
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
        layer.zero_grad(set_to_none=True)
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    fwd, bwd = [], []
    for _ in range(ITERATIONS):
        t0 = time.perf_counter()
        y = layer(x)
        t1 = time.perf_counter()
        y.backward(torch.ones_like(y))
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
    return {
        "iteration_s": statistics.median(times),
        "forward_s": statistics.median(fwd),
        "backward_s": statistics.median(bwd),
    }


def fit_action_cost(world: int, iteration_s: float, forward_s: float, backward_s: float, send_s: float) -> float:
    """The cost per compute action a for which the simulator of the idle pipeline (world stages, 1F1B,
    2 world micro-batches, each stage `forward_s` + a and `backward_s` + a, every transfer `send_s`)
    takes `iteration_s`; 0 when it takes that long without one (the simulator grows with a)."""
    from ..schedule import StageCosts, build_schedule, simulate

    schedule = build_schedule("1f1b", world, 2 * world)

    def predicted(a: float) -> float:
        costs = [
            StageCosts(forward_s, backward_s, send_s if s < world - 1 else 0.0, send_s if s else 0.0, action_s=a)
            for s in range(world)
        ]
        return simulate(schedule, costs, record=False).iteration_s

    if predicted(0.0) >= iteration_s:
        return 0.0
    lo, hi = 0.0, iteration_s
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted(mid) < iteration_s else (lo, mid)
    return (lo + hi) / 2


def _cached_cost(text: str) -> float | None:
    """A cache entry's cost per action; None when another version of the probe wrote it (measured
    again without a warning); a damaged entry raises, for read_cached to warn and measure again."""
    entry = json.loads(text)
    return float(entry["action_overhead_s"]) if entry.get("version") == VERSION else None


def measure_action_cost(processes: int, links: LinkProfile | None, use_cache: bool = True) -> float:
    """Seconds the runtime adds to each compute action with `processes` local ranks (see the module's
    docstring). `links`: those measured between as many processes (None for one: no transfers)."""
    from ..cache import read_cached, write_cached
    from ..host import threads_per_rank, usable_cores
    from ..profile.links import run_gloo_probe

    cores = usable_cores()
    path = _cache_path(processes, cores)
    cached = read_cached(path, _cached_cost) if use_cache else None
    if cached is not None:
        return cached
    # one of the probe's transfers (a micro-batch's activation or its gradient, fp32) over the measured links
    send = links.p2p_latency_s + ROWS * WIDTH * 4.0 / links.p2p_bandwidth if links is not None else 0.0
    threads = threads_per_rank(processes, cores)
    ranks = run_gloo_probe(_time_idle_pipeline, processes, threads)
    iteration = max(r["iteration_s"] for r in ranks)
    forward = statistics.median(r["forward_s"] for r in ranks)
    backward = statistics.median(r["backward_s"] for r in ranks)
    cost = fit_action_cost(processes, iteration, forward, backward, send)
    if use_cache:
        write_cached(
            path,
            json.dumps(
                {
                    "version": VERSION,
                    "processes": processes,
                    "cores": cores,
                    "threads": threads,
                    "iteration_s": iteration,
                    "forward_s": forward,
                    "backward_s": backward,
                    "send_s": send,
                    "action_overhead_s": cost,
                }
            ),
        )
    return cost
