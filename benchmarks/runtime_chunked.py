"""benchmarks/runtime.py's rows for device groups holding several stages: interleaved 1F1B, interleaved
zero bubble and ZB-V through this runtime (runtime/rank_executor.py) and through
torch.distributed.pipelining's ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble and
ScheduleZBVZeroBubble, on the same stages, cut, chunks and micro-batches,
4 gloo processes; Chimera (which torch does not have) through this runtime alone, against the
simulator and against 1F1B on the same 4 stages' costs.

sleep rows: every stage one layer whose forward sleeps T_F and whose backward sleeps T_I on the
input's branch and T_W on the weight's (benchmarks/zero_bubble.py's SplitSleepLayer): iteration time
ours / theirs and ours / the rank-order simulator's prediction for the same costs (plus the
runtime's per-action cost, calibrated from a row of no-sleep layers). compute rows: each stage two
Linear + GELU: CPU seconds per rank, ours / theirs. Both kinds of row run both runtimes in the same
processes with their iterations alternating (common.time_side_by_side). Every row: the most activation bytes a rank
keeps for backward at once (saved-tensor hooks, exact), ours / theirs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from benchmarks.common import SavedBytes, pipeline_step
from benchmarks.zero_bubble import T_F, T_I, T_W, WIDTH, SplitSleepLayer
from dapple_launch.cluster import Topology
from dapple_launch.planner import Limits, fixed_plan
from dapple_launch.profile import LayerProfile, chain
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.rank_executor import build_rank_executor
from dapple_launch.schedule import StageCosts, simulate_ranks

WORLD, BATCH = 4, 4
COMPUTE_WIDTH, COMPUTE_BATCH = 512, 32
TORCH = {
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
    "interleaved_zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
}  # (Chimera: none)
SPLIT = ("interleaved_zb", "zbv")  # backward split into I and W actions


def stages(schedule: str, chunks: int) -> int:
    return WORLD if schedule == "chimera" else chunks * WORLD


def _layer(kind: str, stage: int) -> nn.Module:
    torch.manual_seed(stage)
    if kind == "sleep":
        return nn.Sequential(SplitSleepLayer())
    if kind == "idle":  # what the runtime costs per action, with nothing to compute
        return nn.Sequential(nn.Identity(), _Scale(WIDTH))
    return nn.Sequential(
        nn.Linear(COMPUTE_WIDTH, COMPUTE_WIDTH), nn.GELU(), nn.Linear(COMPUTE_WIDTH, COMPUTE_WIDTH), nn.GELU()
    )


class _Scale(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.w = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * self.w


def _loss(y, t):
    return y.float().pow(2).mean(1)


def chunked_plan(schedule: str, chunks: int, micro_batches: int, width: int):
    S = stages(schedule, chunks)
    layers = [LayerProfile(f"l{i}", T_F, T_I + T_W, width * 4.0, width * 4.0) for i in range(S)]
    topo = Topology("bench", 1, WORLD, 8e9, 1.0, 1e10, 1e10, device_kind="cpu")
    return fixed_plan(
        chain("bench", layers, batch_size=1),
        topo,
        micro_batches * WORLD,
        S,
        [1],
        micro_batches,
        Limits(schedule=schedule, chunks=chunks, optimizer_factor=1.0),
    )


def _batch(kind: str, micro_batches: int):
    n, width = (COMPUTE_BATCH, COMPUTE_WIDTH) if kind == "compute" else (BATCH, WIDTH)
    return (
        torch.randn(n * micro_batches, width, generator=torch.Generator().manual_seed(1)),
        torch.zeros(n * micro_batches),
    )


def ours_step(rank, world, kind, schedule, chunks, micro_batches):
    plan = chunked_plan(schedule, chunks, micro_batches, COMPUTE_WIDTH if kind == "compute" else WIDTH)
    grid = ProcessGrid.from_plan(plan)
    local = grid.stages_at(rank)
    layers = {s: _layer(kind, s) for s in local}
    groups = {s: dist.new_group(grid.stage_ranks(s)) for s in range(grid.num_stages)}
    ex, syncs = build_rank_executor(plan, grid, rank, layers, _loss, groups)
    x = plan.build_schedule()
    batch = _batch(kind, micro_batches)
    params = [p for m in layers.values() for p in m.parameters()]
    return pipeline_step(ex, x, batch, syncs, params), SavedBytes(params)


def theirs_step(rank, world, kind, schedule, chunks, micro_batches):
    import torch.distributed.pipelining as pp

    S = chunks * world
    local = [rank, 2 * world - 1 - rank] if schedule == "zbv" else [rank + c * world for c in range(chunks)]
    mods = {s: _layer(kind, s) for s in local}
    stages = [pp.PipelineStage(mods[s], s, S, torch.device("cpu")) for s in local]
    sched = getattr(pp, TORCH[schedule])(stages, micro_batches, loss_fn=lambda y, t: _loss(y, t).mean())
    x, target = _batch(kind, micro_batches)
    params = [p for m in mods.values() for p in m.parameters()]
    first, last = 0 in local, S - 1 in local

    def step():
        args = (x,) if first else ()
        kwargs = {"target": target, "losses": []} if last else {}
        sched.step(*args, **kwargs)
        for p in params:
            p.grad = None

    return step, SavedBytes(params)


OURS = (("ours", ours_step),)  # (a side of common.timed)


def sleep_costs(schedule: str, chunks: int) -> list[StageCosts]:
    # the first stage's input needs no gradient: its backward is its weight gradient alone
    S = stages(schedule, chunks)
    return [StageCosts(T_F, T_W, weight_grad_s=T_W)] + [StageCosts(T_F, T_I + T_W, weight_grad_s=T_W)] * (S - 1)


def _simulated(schedule: str, chunks: int, micro_batches: int, sleep: bool, per_action_s: float) -> float:
    """The rank-order simulator on this row: each compute action its sleep (if any) plus the
    runtime's own cost per action."""
    x = chunked_plan(schedule, chunks, micro_batches, WIDTH).build_schedule()
    base = sleep_costs(schedule, chunks) if sleep else [StageCosts(0.0, 0.0, weight_grad_s=0.0)] * x.num_stages
    a = per_action_s
    costs = [
        StageCosts(c.forward_s + a, c.backward_s + 2 * a, weight_grad_s=c.weight_s + a)
        if schedule in SPLIT
        else StageCosts(c.forward_s + a, c.backward_s + a)
        for c in base
    ]
    return simulate_ranks(x, costs, record=False).iteration_s


def per_action_cost(idle_wall_s: float, schedule: str, chunks: int, micro_batches: int) -> float:
    """What one compute action costs the runtime beyond its work: the no-sleep row's measured time
    over its simulated time at one unit per action."""
    return idle_wall_s / _simulated(schedule, chunks, micro_batches, False, 1.0)


def predicted(schedule: str, chunks: int, micro_batches: int, per_action_s: float) -> float:
    return _simulated(schedule, chunks, micro_batches, True, per_action_s)
