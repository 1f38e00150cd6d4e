"""Wall-clock readings that mean what they say on a GPU.

CUDA kernels and NCCL operations are only enqueued when a Python call returns: a host clock read
right after one measures the enqueue, not the work. Every measured time of the runtime (the
iteration span the plan's estimate is compared with, the recorded timeline, the all-reduce span,
the step time) reads the clock through `now(device)`, which first waits for the device's queued
work on a CUDA device and costs nothing on the CPU.
"""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device | None = None) -> float:
    """time.time() after the device's queued work has finished."""
    synchronize(device)
    return time.time()


def perf(device: torch.device | None = None) -> float:
    """time.perf_counter() after the device's queued work has finished."""
    synchronize(device)
    return time.perf_counter()
