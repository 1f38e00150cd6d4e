"""GPipe vs DAPPLE's 1F1B on the real runtime: saved activation bytes and iteration time.

4 gloo processes (4 stages × 1 replica), micro-batches 4, 8, 16. Every layer sleeps a known time
in forward and backward (so 2 shared cores do not blur the schedule) and saves its input for
backward. Saved tensors are counted exactly with autograd's saved-tensor hooks (bytes alive at
once, per stage), not read from RSS. The simulator predicts the iteration time from the same
action lists and the known sleep costs.

    python benchmarks/schedule_memory_time.py [--iterations 3] [--out schedule_bench.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import SavedBytes, SleepLayer
from dapple_launch.runtime.executor import StageExecutor
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.p2p import PointToPoint
from dapple_launch.schedule import StageCosts, build_schedule, simulate
from tests.multiproc import run_ranks

STAGES, FORWARD_S, BACKWARD_S, WIDTH, BATCH_PER_MICRO = 4, 0.020, 0.040, 4096, 4


def _rank(rank, world, schedule_name, micro_batches, iterations):
    grid = ProcessGrid((1,) * STAGES, tuple((d,) for d in range(STAGES)))
    layers = nn.Sequential(SleepLayer(WIDTH, FORWARD_S, BACKWARD_S))
    ex = StageExecutor(layers, lambda y, t: y.mean(1), PointToPoint(grid, rank, 0), STAGES)
    schedule = build_schedule(schedule_name, STAGES, micro_batches)
    n = BATCH_PER_MICRO * micro_batches
    batch = (torch.randn(n, WIDTH), torch.zeros(n))
    counter = SavedBytes()
    times = []
    for _ in range(iterations + 1):  # the first iteration warms up the connections
        dist.barrier()
        t0 = time.perf_counter()
        with counter.hooks():
            ex.run(schedule, batch)
        dist.barrier()
        times.append(time.perf_counter() - t0)
        layers.zero_grad(set_to_none=True)
    return {"peak_saved_bytes": counter.peak, "iteration_s": min(times[1:])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--out", default="schedule_bench.json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in (4, 8, 16):
            for name in ("gpipe", "1f1b"):
                res = run_ranks(STAGES, _rank, (name, m, args.iterations), tmp)
                sim = simulate(build_schedule(name, STAGES, m), [StageCosts(FORWARD_S, BACKWARD_S)] * STAGES)
                measured = max(r["iteration_s"] for r in res)
                rows.append(
                    {
                        "schedule": name,
                        "micro_batches": m,
                        "peak_saved_bytes": [r["peak_saved_bytes"] for r in res],
                        "iteration_s": measured,
                        "simulated_s": sim.iteration_s,
                        "error": measured / sim.iteration_s - 1,
                    }
                )
    by = {(r["schedule"], r["micro_batches"]): r for r in rows}
    print(
        f"4 stages × 1 replica, forward {FORWARD_S * 1e3:.0f} ms / backward {BACKWARD_S * 1e3:.0f} ms sleep per "
        f"layer, {BATCH_PER_MICRO} samples × {WIDTH} floats per micro-batch\n"
    )
    print(
        "| schedule | M | peak saved MiB per stage (0,1,2,3) | 1F1B/GPipe stage 0 | bound S/M | iteration s | simulator s | error |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        g = by[("gpipe", r["micro_batches"])]["peak_saved_bytes"][0]
        ratio = r["peak_saved_bytes"][0] / g
        mib = ", ".join(f"{b / 2**20:.2f}" for b in r["peak_saved_bytes"])
        bound = f"{STAGES / r['micro_batches']:.2f}" if r["schedule"] == "1f1b" else ""
        print(
            f"| {r['schedule']} | {r['micro_batches']} | {mib} | {ratio:.2f} | {bound} | {r['iteration_s']:.3f} "
            f"| {r['simulated_s']:.3f} | {r['error']:+.1%} |"
        )
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
