"""Stages of round-robin copies (1f1b_rr, zb_h1_rr) through this runtime, 4 gloo processes, against
the simulator of their rank orders and against 1F1B on the same processes and layout.

The model: two layers whose forward, input-gradient and weight-gradient sleeps are stated per
sample (the first layer HEAVY times the second's, so that three devices on the first stage and one
on the second balance), a global batch of G samples, stages 3:1. Round-robin copies run micro-batches
of one sample (and two, in full), each of the first stage's three devices taking every third; 1F1B splits each
micro-batch across the three replicas (micro-batches of at least three samples, the split uneven
where three does not divide them) — at each of its micro-batch counts.

Every row: the iteration time against the simulator's prediction (each action its sleep plus the
runtime's own cost per action, calibrated on a run of the same schedule whose layers sleep nothing,
as benchmarks/runtime_chunked.py does), and each rank's most saved activation bytes at once
(saved-tensor hooks, exact) against the simulator's peak for the rank's order, each micro-batch in
flight charged what one forward saves there (less what I frees, where the backward is split).
Nothing here depends on how 2 shared cores are scheduled but the runtime's own cost per action,
which the calibration measures.

    python benchmarks/runtime_round_robin.py [--quick] [--iterations N] [--out runtime_round_robin.json]

benchmarks/runtime.py runs it too and keeps its rows under "schedules" and "round_robin".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import SavedBytes, pipeline_step, print_sleep_table, timed
from dapple_launch.cluster import Topology
from dapple_launch.planner import Limits, fixed_plan
from dapple_launch.profile import LayerProfile, chain
from dapple_launch.runtime.executor import GradientSync, StageExecutor
from dapple_launch.runtime.grid import ProcessGrid, split_sizes
from dapple_launch.runtime.p2p import PointToPoint
from dapple_launch.runtime.rank_executor import build_rank_executor
from dapple_launch.schedule import StageCosts, build_schedule, simulate, simulate_ranks
from tests.multiproc import run_ranks
from tests.saved_bytes import saved_and_freed_at_input

WORLD, WIDTH, G = 4, 1024, 8  # three replicas divide no micro-batch of G: VGG's case in miniature
UNIT = 0.008  # seconds per sample of the light layer's forward, input gradient and weight gradient each
HEAVY = 4  # the first layer's sleeps are HEAVY units: its forward and weight gradient (its input needs none)
REPLICAS = (3, 1)
RR = ("1f1b_rr", "zb_h1_rr")


class _OnInput(torch.autograd.Function):
    """On the input's path: the forward's sleep, and in backward the input gradient's (I)."""

    @staticmethod
    def forward(ctx, x, forward_s, input_s):
        time.sleep(forward_s * x.shape[0])
        ctx.cost = input_s * x.shape[0]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.cost)
        return g, None, None


class _OnWeight(torch.autograd.Function):
    """On the weight's branch: the weight gradient's sleep (W), for the micro-batch's samples."""

    @staticmethod
    def forward(ctx, w, weight_s, rows):
        ctx.cost = weight_s * rows
        return w.view_as(w)

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.cost)
        return g, None, None


class PerSampleSleep(nn.Module):
    """x * w, sleeping `units` × UNIT per sample in F, I and W (scale 0: the same tensors and actions,
    nothing to wait for, what the runtime itself costs)."""

    def __init__(self, units: float):
        super().__init__()
        self.s = units * UNIT
        self.w = nn.Parameter(torch.ones(WIDTH))

    def forward(self, x):
        return _OnInput.apply(x, self.s, self.s) * _OnWeight.apply(self.w, self.s, x.shape[0])


def _loss(y, t):
    return y.float().pow(2).mean(1)


def units(stage: int) -> float:
    return float(HEAVY if stage == 0 else 1)


def plan_of(schedule: str, micro_batches: int):
    layers = [LayerProfile(f"l{i}", units(i) * UNIT, 2 * units(i) * UNIT, WIDTH * 4.0, WIDTH * 4.0) for i in range(2)]
    topo = Topology("bench", 1, WORLD, 8e9, 1.0, 1e10, 1e10, device_kind="cpu")
    limits = Limits(schedule=schedule, copies=REPLICAS) if schedule in RR else Limits(schedule=schedule)
    return fixed_plan(
        chain("bench", layers, batch_size=1),
        topo,
        G,
        2,
        list(REPLICAS),
        micro_batches,
        replace(limits, optimizer_factor=1.0),
    )


def _batch():
    return (torch.randn(G, WIDTH, generator=torch.Generator().manual_seed(1)), torch.zeros(G))


def _one_forward_bytes(layers: nn.Module, stage: int, rows: int) -> tuple[int, int]:
    """What one forward of `rows` samples keeps for backward on this stage (the last: its loss's
    too), and of that what a split backward's I frees (what only the input gradient reads)."""
    x, t = _batch()
    x = x[:rows].clone().requires_grad_(stage > 0)

    def forward():
        y = layers(x)
        return _loss(y, t[:rows]).sum() if stage == 1 else y

    return saved_and_freed_at_input(forward, x, layers.parameters(), stage == 1)


def ours_step(rank, world, schedule, micro_batches, idle):
    """One rank's step and its saved-bytes counter; `step.info`: the rank's stage, order and
    one micro-batch's saved bytes there."""
    plan = plan_of(schedule, micro_batches)
    grid = ProcessGrid.from_plan(plan)
    stage = grid.position(rank)[0]
    layers = nn.Sequential(PerSampleSleep(0.0 if idle else units(stage)))
    groups = {s: dist.new_group(grid.stage_ranks(s)) for s in range(2)}
    batch, b = _batch(), G // micro_batches
    params = list(layers.parameters())
    if schedule in RR:  # a copy runs whole micro-batches, in its stage's order filtered to its share
        ex, syncs = build_rank_executor(plan, grid, rank, {stage: layers[0]}, _loss, groups)
        x, order, rows = plan.build_schedule(), ex.group, b
    else:  # every micro-batch split across the stage's replicas
        replica = grid.stage_ranks(stage).index(rank)
        syncs = [GradientSync(params, groups[stage], grid.replicas[stage])]
        ex = StageExecutor(layers, _loss, PointToPoint(grid, stage, replica), 2, on_last_backward=syncs[0].start)
        x, order, rows = (
            build_schedule(schedule, 2, micro_batches),
            stage,
            split_sizes(b, grid.replicas[stage])[replica],
        )
    one = _one_forward_bytes(layers, stage, rows)
    step = pipeline_step(ex, x, batch, syncs, params)
    step.info = {"stage": stage, "order": order, "micro_batch_bytes": one}
    return step, SavedBytes(params)


def _timed(rank, world, schedule, micro_batches, idle, iterations):
    """common.timed for one side, with the rank's stage, order and one micro-batch's bytes."""
    built = {}

    def build(rank, world, *args):
        built["step"] = ours_step(rank, world, *args)
        return built["step"]

    out = timed(rank, world, (("ours", build),), (schedule, micro_batches, idle), iterations)
    return out | built["step"][0].info


def simulated(schedule: str, micro_batches: int, per_action_s: float, sleep: bool = True, kept=(0, 0)):
    """The simulator on this row: each compute action its sleep (the busiest replica's rows, or the
    whole micro-batch on its copy) plus the runtime's own cost per action; every stage charged
    `kept` = (bytes one forward saves, of which I frees) per micro-batch in flight (one rank's
    figures: read that rank's peak)."""
    b, a = G // micro_batches, per_action_s
    costs = []
    for s in range(2):
        rows = b if schedule in RR else max(split_sizes(b, REPLICAS[s]))
        t = units(s) * UNIT * rows if sleep else 0.0
        i = t if s else 0.0  # the first stage's input needs no gradient
        if schedule == "zb_h1_rr":  # I and W: two actions
            costs.append(
                StageCosts(
                    t + a, i + t + 2 * a, weight_grad_s=t + a, activation_bytes=kept[0], input_only_bytes=kept[1]
                )
            )
        else:
            costs.append(StageCosts(t + a, i + t + a, activation_bytes=kept[0]))
    if schedule in RR:
        return simulate_ranks(plan_of(schedule, micro_batches).build_schedule(), costs, record=False)
    return simulate(build_schedule(schedule, 2, micro_batches), costs, record=False)


def rows_to_run(quick: bool) -> list[tuple[str, int]]:
    """Round-robin at one sample per micro-batch (and two, in full), 1F1B at every micro-batch count
    that fills its two stages (M ≥ 2) and whose micro-batch the first stage's replicas can split (b ≥ 3)."""
    rr = [(name, m) for name in RR for m in ((G,) if quick else (G, G // 2))]
    return rr + [("1f1b", m) for m in (2, 3, 4, 6) if G % m == 0 and G // m >= REPLICAS[0]]


def measure(quick: bool, iterations: int, tmp: str) -> list[dict]:
    rows, per_action = [], {}
    for schedule, m in rows_to_run(quick):
        if schedule not in per_action:  # the runtime's cost per action: a no-sleep run over its unit-cost prediction
            idle = run_ranks(WORLD, _timed, (schedule, m, True, iterations), tmp)
            per_action[schedule] = max(r["wall_s"] for r in idle) / simulated(schedule, m, 1.0, sleep=False).iteration_s
        res = run_ranks(WORLD, _timed, (schedule, m, False, iterations), tmp)
        sim = simulated(schedule, m, per_action[schedule])
        measured = max(r["wall_s"] for r in res)
        rows.append(
            {
                "schedule": schedule,
                "micro_batches": m,
                "measured_s": measured,
                "simulated_s": sim.iteration_s,
                "simulator_error": measured / sim.iteration_s - 1,
                "per_action_s": per_action[schedule],
                "saved_bytes": [r["peak_saved_bytes"] for r in res],
                "simulated_saved_bytes": [
                    int(simulated(schedule, m, 0.0, True, r["micro_batch_bytes"]).peak_activation_bytes[r["order"]])
                    for r in res
                ],
            }
        )
        print(f"  sleep {schedule} 3:1 M={m}: {measured:.3f} s (simulator {sim.iteration_s:.3f} s)", flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    best_1f1b = min((r for r in rows if r["schedule"] == "1f1b"), key=lambda r: r["measured_s"])
    return {
        "simulator_error": max(abs(r["simulator_error"]) for r in rows),
        "saved_bytes_match": all(r["saved_bytes"] == r["simulated_saved_bytes"] for r in rows),
        "over_best_1f1b": {
            name: min(r["measured_s"] for r in rows if r["schedule"] == name) / best_1f1b["measured_s"] for name in RR
        },
        "schedules": {
            name: {
                "simulator_error": max(abs(r["simulator_error"]) for r in rows if r["schedule"] == name),
                "saved_bytes_match": all(
                    r["saved_bytes"] == r["simulated_saved_bytes"] for r in rows if r["schedule"] == name
                ),
            }
            for name in RR
        },
        "rows": rows,
    }


def report(rows: list[dict]) -> dict:
    s = summary(rows)
    print(
        f"\nstages of round-robin copies: 2 layers ({HEAVY * UNIT * 1e3:g} and {UNIT * 1e3:g} ms per sample in F, I and W; "
        f"the first stage's input needs no gradient), stages 3:1 on {WORLD} gloo processes, global batch {G}"
    )
    print_sleep_table(rows, "rank")
    print(
        "\nover the best 1F1B row on the same layout: "
        + ", ".join(f"{name} {x:.3f}" for name, x in s["over_best_1f1b"].items())
    )
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--out", default="runtime_round_robin.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args.quick, args.iterations or (3 if args.quick else 5), tmp)
    Path(args.out).write_text(json.dumps(report(rows), indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
