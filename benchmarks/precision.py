"""fp32 against bf16-mixed through the pipeline: bytes between stages, saved activations, CPU time, loss.

A GPT where compute dominates (hidden 256, 4 blocks, 64 tokens, tied embedding) on 2 gloo
processes, 2 stages × 1 replica, one thread each, 4 micro-batches of 4 sequences, trained the same
number of steps from the same seed on the generated grammar corpus with each precision. Per
stage: payload bytes sent to the other stage per iteration (activations forward, gradients back;
bf16 must be half), the peak of activation bytes saved for backward (counted exactly with
saved-tensor hooks, the weights themselves left out), CPU seconds per iteration (this process's,
median); the loss at the end (mean of the last 5 steps).

    python benchmarks/precision.py [--steps 40] [--out precision.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import SavedBytes
from dapple_launch.data.datasets import TextWindows
from dapple_launch.models import build_model
from dapple_launch.runtime.executor import GradientSync, StageExecutor
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.module import PipelineModule
from dapple_launch.runtime.p2p import PointToPoint
from dapple_launch.runtime.precision import MixedPrecision
from dapple_launch.runtime.tied import TiedSync, local_tied_parameters, tied_groups
from dapple_launch.schedule import build_schedule
from tests.multiproc import run_ranks

SHAPE = dict(num_layers=4, hidden=256, heads=4, seq_len=64, vocab_size=64)
CUTS = [(0, 3), (3, 6)]  # embed, block0, block1 | block2, block3, head
MICRO, PER_MICRO = 4, 4


def _rank(rank, world, precision, steps):
    model = build_model("gpt", "tiny", **SHAPE)
    grid = ProcessGrid((1, 1))
    a, b = CUTS[rank]
    module = PipelineModule(model, precision=precision, seed=1).materialize(list(range(a, b)))
    params = list(module.parameters())
    ties = tied_groups(model, CUTS)
    for g in ties:
        g.group = dist.new_group([0, 1])
    tied = TiedSync(ties, local_tied_parameters(module.layers, model), rank, 0)
    sync = GradientSync(params, None, 1)
    p2p = PointToPoint(grid, rank, 0)
    ex = StageExecutor(module.local_stack(), model.loss, p2p, 2, precision=MixedPrecision(precision))
    opt = torch.optim.AdamW(params, lr=3e-3)
    data = TextWindows(steps * MICRO * PER_MICRO, SHAPE["seq_len"], seed=1, masked=False)
    schedule = build_schedule("1f1b", 2, MICRO)
    counter = SavedBytes(params)
    losses, cpu, sent = [], [], []
    n = MICRO * PER_MICRO
    for step in range(steps):
        items = [data[i] for i in range(step * n, (step + 1) * n)]
        batch = (torch.stack([x for x, _ in items]), torch.stack([y for _, y in items]))
        before, c0 = p2p.comms.bytes_sent, time.process_time()
        with counter.hooks():
            result = ex.run(schedule, batch)
        sync.finish()
        tied.sync()
        opt.step()
        opt.zero_grad(set_to_none=True)
        cpu.append(time.process_time() - c0)
        sent.append(p2p.comms.bytes_sent - before)
        loss = result.loss_sum.clone()
        dist.all_reduce(loss)
        losses.append(loss.item())
    return {
        "bytes_sent": sent[-1],
        "peak_saved_bytes": counter.peak,
        "cpu_s": statistics.median(cpu[2:]),
        "final_loss": statistics.mean(losses[-5:]),
        "first_loss": losses[0],
    }


def planned_activation_bytes(precision: str) -> list[float]:
    """What the planner's memory model says each stage keeps: micro-batches in flight (1F1B: S - s)
    × what one micro-batch keeps (ModelProfile.kept_bytes), from the analytic profile."""
    from dapple_launch.profile import analytic_profile

    profile = analytic_profile(build_model("gpt", "tiny", **SHAPE), 2, 1.0, "cpu", precision=precision)
    return [(len(CUTS) - s) * profile.kept_bytes(a, b, PER_MICRO) for s, (a, b) in enumerate(CUTS)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default="precision.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("32", "bf16-mixed"):
            rows[precision] = run_ranks(2, _rank, (precision, args.steps), tmp)
    print(
        f"GPT hidden {SHAPE['hidden']}, {SHAPE['num_layers']} blocks, {SHAPE['seq_len']} tokens, 2 stages × 1 "
        f"replica, {MICRO} micro-batches × {PER_MICRO}, {args.steps} steps\n"
    )
    print(
        "| precision | stage | bytes sent / iteration | peak saved activations | planner's estimate | CPU s / iteration | loss: first → final |"
    )
    print("|---|---|---|---|---|---|---|")
    for precision, res in rows.items():
        predicted = planned_activation_bytes(precision)
        for s, r in enumerate(res):
            r["planned_saved_bytes"] = predicted[s]
            print(
                f"| {precision} | {s} | {r['bytes_sent'] / 2**10:.0f} KiB | {r['peak_saved_bytes'] / 2**20:.2f} MiB "
                f"| {predicted[s] / 2**20:.2f} MiB | {r['cpu_s']:.3f} | {r['first_loss']:.3f} → {r['final_loss']:.3f} |"
            )
    ratios = {
        k: [rows["bf16-mixed"][s][k] / rows["32"][s][k] for s in range(2)]
        for k in ("bytes_sent", "peak_saved_bytes", "cpu_s")
    }
    print(
        f"\nbf16-mixed / fp32: bytes sent {ratios['bytes_sent']}, peak saved {ratios['peak_saved_bytes']}, "
        f"CPU time {ratios['cpu_s']}"
    )
    Path(args.out).write_text(json.dumps({"rows": rows, "bf16_over_fp32": ratios}, indent=2))


if __name__ == "__main__":
    main()
