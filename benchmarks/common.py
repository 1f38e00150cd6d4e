"""What the benchmarks share: layers of known cost and an exact count of saved activation bytes.

A SleepLayer sleeps a stated time in forward and backward (per micro-batch, or per sample so
that splitting a micro-batch across replicas divides it), so schedule timing does not depend
on how 2 shared cores are scheduled; its `extra_params` adds parameters whose gradient the
all-reduce must carry (VGG's fully connected layers, in miniature;
GradientSync all-reduces a parameter without a gradient as zeros). SavedBytes (tests/saved_bytes.py) counts the bytes
of tensors autograd keeps for backward, alive at once, through saved-tensor hooks: exact, not RSS.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.saved_bytes import SavedBytes  # noqa: E402  (the benchmarks' exact memory count)


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, big, layer):
        time.sleep(layer.cost(x, layer.forward_s))
        ctx.save_for_backward(x, w)
        ctx.layer = layer
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        time.sleep(ctx.layer.cost(x, ctx.layer.backward_s))
        # The extra parameters get no per-micro-batch gradient (accumulating it would add a memory-bound
        # cost no profile states); the stage's gradient all-reduce still carries them every iteration.
        return g * w, (g * x).sum(0), None, None


class SleepLayer(nn.Module):
    def __init__(
        self, width: int, forward_s: float, backward_s: float, per_sample: bool = False, extra_params: int = 0
    ):
        super().__init__()
        self.forward_s, self.backward_s, self.per_sample = forward_s, backward_s, per_sample
        self.w = nn.Parameter(torch.ones(width))
        self.big = nn.Parameter(torch.zeros(max(extra_params, width))) if extra_params else None

    def cost(self, x: torch.Tensor, seconds: float) -> float:
        return seconds * x.shape[0] if self.per_sample else seconds

    def forward(self, x):
        return _Sleep.apply(x, self.w, self.big, self)


def pipeline_step(ex, schedule, batch, syncs, params):
    """One benchmark iteration of an executor: its schedule over the batch, the gradient all-reduces
    finished, the gradients dropped (each iteration starts as the first did)."""

    def step():
        ex.run(schedule, batch)
        for sync in syncs:
            sync.finish()
        for p in params:
            p.grad = None

    return step


def print_sleep_table(rows: list[dict], per: str) -> None:
    """The sleep rows against the simulator: time and each `per`'s most saved bytes at once
    (measured, and whether the simulator's count equals it)."""
    print(f"\n| schedule | M | measured s | simulator s | error | peak saved bytes per {per} (= simulator's) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        same = (
            "yes" if r["saved_bytes"] == r["simulated_saved_bytes"] else f"no: simulator {r['simulated_saved_bytes']}"
        )
        print(
            f"| {r['schedule']} | {r['micro_batches']} | {r['measured_s']:.3f} | {r['simulated_s']:.3f} | "
            f"{r['simulator_error']:+.1%} | {[int(b) for b in r['saved_bytes']]} ({same}) |"
        )


def median_runs(runs: list[list[dict]]) -> list[dict]:
    """Per rank, the median of each figure over repeated runs."""
    return [{k: statistics.median(run[rank][k] for run in runs) for k in runs[0][rank]} for rank in range(len(runs[0]))]


def time_side_by_side(steps: dict, iterations: int, counters: dict) -> dict:
    """time_iterations for several runtimes in the same processes, one iteration of each in turn (the
    order reversed every round: A B, B A, A B, …), each side's medians. The load of a shared machine
    drifts over seconds; taken in alternation it falls on every side alike, where separate runs a
    minute apart differ by more than the effect measured (CPU seconds, ±15 % between runs on 2 cores)."""
    names = list(steps)
    walls: dict = {n: [] for n in names}
    cpus: dict = {n: [] for n in names}
    for i in range(iterations + 1):  # the first round connects peers and learns shapes
        for n in names if i % 2 == 0 else names[::-1]:
            dist.barrier()
            w0, c0 = time.perf_counter(), time.process_time()
            with counters[n].hooks():
                steps[n]()
            if i:
                walls[n].append(time.perf_counter() - w0)
                cpus[n].append(time.process_time() - c0)
    return {
        n: {
            "wall_s": statistics.median(walls[n]),
            "cpu_s": statistics.median(cpus[n]),
            "peak_saved_bytes": counters[n].peak,
        }
        for n in names
    }


def time_iterations(step, iterations: int, counter: SavedBytes) -> dict:
    """Median wall and CPU seconds of `iterations` calls of step() (all ranks start each together,
    torch.distributed initialised), and the most saved bytes at once over them: time_side_by_side
    with one side."""
    return time_side_by_side({"": step}, iterations, {"": counter})[""]


def timed(rank, world, sides: tuple, step_args: tuple, iterations: int) -> dict:
    """A benchmark rank (tests/multiproc.run_ranks' worker): `sides`, (name, builder) pairs of
    module-level step builders, builder(rank, world, *step_args) -> (step, SavedBytes). One side is
    timed alone (time_iterations); several in alternation (time_side_by_side), keyed by name."""
    built = {name: build(rank, world, *step_args) for name, build in sides}
    if len(built) == 1:
        ((step, counter),) = built.values()
        return time_iterations(step, iterations, counter)
    return time_side_by_side({n: s for n, (s, _) in built.items()}, iterations, {n: c for n, (_, c) in built.items()})
