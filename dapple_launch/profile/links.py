"""Measured links: how fast this machine's processes talk over gloo, as the cost model sees links.

A CPU "cluster" of local processes has no datasheet: its point-to-point and all-reduce speeds
depend on how many processes share how many cores. This probe starts exactly as many gloo
processes as the cluster has devices, with the threads the local launcher gives each, times
point-to-point transfers (rank 0 and 1, ping-pong) and all-reduces over every process at a
small and a large size, and fits the cost model's own forms to them:

    transfer(bytes)   = latency + bytes / bandwidth
    all-reduce(bytes) = 2 (r - 1) latency_ar + 2 (r - 1) / r × bytes / bandwidth_ar   (ring)

Cached on disk keyed by process count and core count, like the measured layer profile.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..cache import cache_dir, read_cached, write_cached

SMALL, LARGE = 4096, 4 * 2**20  # bytes: latency-bound, bandwidth-bound
REPEATS = 15


@dataclass(frozen=True)
class LinkProfile:
    processes: int
    cores: int
    p2p_latency_s: float
    p2p_bandwidth: float  # bytes/s
    allreduce_latency_s: float  # per ring step
    allreduce_bandwidth: float  # bytes/s, the ring's bus bandwidth


def _cache_path(processes: int, cores: int) -> Path:
    return cache_dir() / f"links-gloo-{processes}p-{cores}c.json"


def _fit(small_s: float, large_s: float, scale: float) -> tuple[float, float]:
    """(fixed seconds, bytes/s) of t = fixed + scale × bytes / bw through the two sizes; a
    non-increasing pair (noise) falls back to the large size alone."""
    slope = (large_s - small_s) / (LARGE - SMALL)
    if slope <= 0:
        return max(small_s, 1e-7), scale * LARGE / max(large_s, 1e-9)
    fixed = max(small_s - slope * SMALL, 1e-7)
    return fixed, scale / slope


def _probe_rank(rank: int, worker, world: int, rendezvous: dict, threads: int, out: str, args: tuple) -> None:
    """One process of a gloo probe: torch with the rank's threads, the process group, then
    worker(rank, world, *args), whose dict it writes for the parent."""
    import torch
    import torch.distributed as dist

    os.environ.update(rendezvous)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        Path(f"{out}.{rank}").write_text(json.dumps(worker(rank, world, *args)))
    finally:
        dist.destroy_process_group()


def run_gloo_probe(worker, processes: int, threads: int, *args) -> list[dict]:
    """Run worker(rank, world, *args) -> dict (a module-level function) in `processes` spawned gloo
    processes of `threads` torch threads each, as the local launcher starts ranks; their dicts by rank.
    The measured links' probe and the runtime's cost-per-action probe (runtime/action_cost.py)."""
    import torch.multiprocessing as mp

    from ..host import host_rendezvous

    store, rendezvous = host_rendezvous()  # (this process holds the store while they run)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "probe")
        mp.start_processes(
            _probe_rank,
            args=(worker, processes, rendezvous, threads, out, args),
            nprocs=processes,
            join=True,
            start_method="spawn",
        )
        return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(processes)]


def _time_links(rank: int, world: int) -> dict:
    """Ping-pong between ranks 0 and 1 and all-reduces over every rank, at both sizes: per size
    (as a string), the median one-way transfer and all-reduce seconds."""
    import torch
    import torch.distributed as dist

    timings = {}
    for size in (SMALL, LARGE):
        buf = torch.zeros(size // 4, dtype=torch.float32)
        trips = []
        for rep in range(REPEATS + 2):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if rep >= 2:  # the first two set up the connection
                trips.append((time.perf_counter() - t0) / 2)
        reduces = []
        for rep in range(REPEATS + 2):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            if rep >= 2:
                reduces.append(time.perf_counter() - t0)
        timings[str(size)] = (statistics.median(trips), statistics.median(reduces))
    return timings


def measure_links(processes: int, use_cache: bool = True) -> LinkProfile:
    if processes < 2:
        raise ValueError(f"measuring links needs at least 2 processes, got {processes}")
    from ..host import threads_per_rank, usable_cores

    cores = usable_cores()
    path = _cache_path(processes, cores)
    cached = read_cached(path, lambda text: LinkProfile(**json.loads(text))) if use_cache else None
    if cached is not None:
        return cached
    threads = threads_per_rank(processes, cores)  # what the local launcher gives each rank
    timings = {int(k): v for k, v in run_gloo_probe(_time_links, processes, threads)[0].items()}  # (rank 0's)
    (p2p_small, ar_small), (p2p_large, ar_large) = timings[SMALL], timings[LARGE]
    p2p_latency, p2p_bandwidth = _fit(p2p_small, p2p_large, 1.0)
    r = processes
    ar_fixed, ar_bandwidth = _fit(ar_small, ar_large, 2 * (r - 1) / r)
    links = LinkProfile(processes, cores, p2p_latency, p2p_bandwidth, ar_fixed / (2 * (r - 1)), ar_bandwidth)
    if use_cache:
        write_cached(path, json.dumps(asdict(links)))
    return links
