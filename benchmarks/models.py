"""model=llama through the pipeline against the same model as a single-process Hugging Face training
loop, and the planner's memory estimate against the exact saved bytes per stage.

model=llama (hidden 128, 4 layers, 4 query heads on 2 key/value heads, 128 tokens, tied embedding)
on 4 gloo processes, 2 stages × 2 replicas, 1F1B, 4 micro-batches, global batch 16, one thread per
process; the reference is `LlamaForCausalLM` of the same shape (`Llama.hf_config`, the same weights'
arithmetic: tests/test_hf.py) trained with AdamW on the same global batch in one process (one
thread, and as many threads as the pipeline has processes). Steps per second are medians after two
warm-up steps. Per stage: the peak of bytes saved for backward, counted exactly with saved-tensor
hooks (the weights left out), against the planner's estimate (micro-batches in flight × what one
micro-batch keeps, from the analytic profile), in fp32 and bf16-mixed.

    python benchmarks/models.py [--steps 12] [--out models.json]
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
from dapple_launch.models import build_model
from dapple_launch.runtime.executor import GradientSync, StageExecutor
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.module import PipelineModule
from dapple_launch.runtime.p2p import PointToPoint
from dapple_launch.runtime.precision import MixedPrecision
from dapple_launch.runtime.tied import TiedSync, local_tied_parameters, tied_groups
from dapple_launch.schedule import build_schedule
from tests.multiproc import run_ranks

SHAPE = dict(num_layers=4, hidden=128, heads=4, kv_heads=2, ffn_hidden=344, seq_len=128, vocab_size=512)
CUTS = [(0, 3), (3, 6)]  # embed, layer0, layer1 | layer2, layer3, head
REPLICAS, MICRO, GLOBAL = 2, 4, 16
PER_MICRO = GLOBAL // MICRO // REPLICAS  # samples per micro-batch on one replica


def model():
    return build_model("llama", "tiny", **SHAPE)


def batches(steps: int):
    g = torch.Generator().manual_seed(0)
    m = model()
    return [m.batch(GLOBAL, g) for _ in range(steps)]


def _rank(rank, world, precision, steps):
    torch.set_num_threads(1)
    m = model()
    grid = ProcessGrid((REPLICAS, REPLICAS))
    stage, replica = grid.position(rank)
    a, b = CUTS[stage]
    module = PipelineModule(m, precision=precision, seed=1).materialize(list(range(a, b)))
    params = list(module.parameters())
    groups = [dist.new_group(grid.stage_ranks(s)) for s in range(2)]
    ties = tied_groups(m, CUTS)
    for t in ties:
        t.group = dist.new_group(sorted({r for s in t.stages for r in grid.stage_ranks(s)}))
    tied = TiedSync(ties, local_tied_parameters(module.layers, m), stage, replica)
    sync = GradientSync(params, groups[stage], REPLICAS)
    ex = StageExecutor(
        module.local_stack(), m.loss, PointToPoint(grid, stage, replica), 2, precision=MixedPrecision(precision)
    )
    opt = torch.optim.AdamW(params, lr=1e-3)
    schedule = build_schedule("1f1b", 2, MICRO)
    counter = SavedBytes(params)
    walls = []
    for x, y in batches(steps):
        dist.barrier()
        t0 = time.perf_counter()
        with counter.hooks():
            ex.run(schedule, (x, y))
        sync.finish()
        tied.sync()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        walls.append(time.perf_counter() - t0)
    return {"stage": stage, "peak_saved_bytes": counter.peak, "step_s": statistics.median(walls[2:])}


def hf_loop(steps: int, threads: int) -> float:
    """The same model as Hugging Face's LlamaForCausalLM, one process: median seconds per step."""
    import transformers

    torch.set_num_threads(threads)
    torch.manual_seed(1)
    hf = transformers.AutoModelForCausalLM.from_config(model().hf_config())
    hf.train()
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-3)
    walls = []
    for x, y in batches(steps):
        t0 = time.perf_counter()
        loss = hf(input_ids=x, labels=y, shift_labels=y.contiguous()).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls[2:])


def planned_saved_bytes(precision: str) -> list[float]:
    from dapple_launch.planner.cost import in_flight
    from dapple_launch.profile import analytic_profile

    profile = analytic_profile(model(), 2, 1.0, "cpu", precision=precision)
    return [in_flight("1f1b", s, 2, MICRO) * profile.kept_bytes(a, b, PER_MICRO) for s, (a, b) in enumerate(CUTS)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", default="models.json")
    args = ap.parse_args()
    out: dict = {"shape": SHAPE, "layout": "2 stages × 2 replicas, 1F1B, 4 micro-batches", "global_batch": GLOBAL}
    with tempfile.TemporaryDirectory() as tmp:
        pipe = {p: run_ranks(4, _rank, (p, args.steps), tmp) for p in ("32", "bf16-mixed")}
    hf1 = hf_loop(args.steps, 1)
    hf4 = hf_loop(args.steps, 4)
    step = max(r["step_s"] for r in pipe["32"])
    out["steps_per_s"] = {"pipeline_2x2": 1 / step, "hf_1_thread": 1 / hf1, "hf_4_threads": 1 / hf4}
    print(f"model=llama {SHAPE}, global batch {GLOBAL}, {args.steps} steps\n")
    print("| run | steps/s | vs HF loop (1 thread) |")
    print("|---|---|---|")
    for name, v in out["steps_per_s"].items():
        print(f"| {name} | {v:.2f} | {v * hf1:.2f}× |")
    print("\n| precision | stage | exact peak saved | planner's estimate | estimate / exact |")
    print("|---|---|---|---|---|")
    out["memory"] = []
    for precision, ranks in pipe.items():
        planned = planned_saved_bytes(precision)
        for s in range(2):
            exact = max(r["peak_saved_bytes"] for r in ranks if r["stage"] == s)
            row = {
                "precision": precision,
                "stage": s,
                "exact": exact,
                "planned": planned[s],
                "ratio": planned[s] / exact,
            }
            out["memory"].append(row)
            print(
                f"| {precision} | {s} | {exact / 2**20:.2f} MiB | {planned[s] / 2**20:.2f} MiB | {row['ratio']:.3f} |"
            )
    Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
