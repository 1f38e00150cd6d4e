"""Calibration: the planner's estimate against the measured iteration, with a profile measured here.

For each plan, `python -m dapple_launch` runs a few steps with strategy.profile_source=measured
(each real layer timed on this machine by the planner's measuring profiler) and
trainer.profile_pipeline=true; the run's timeline.json holds the measured iteration (median of
the recorded steps: the schedule's actions and the gradient all-reduce on every rank, the span
the cost model describes; the optimizer step is outside it) and plan.json the estimate.

    python benchmarks/calibration.py [--steps 12] [--out calibration.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["strategy.profile_source=measured", "trainer.profile_pipeline=true", "trainer.progress_bar=false",
          "logger=none", "trainer.val_check_interval=100000"]
# Each CPU process here is a device only when it has a core: the default job's 4 processes share
# 2 cores, so their compute comes in bursts the per-layer profile cannot describe (the timeline
# shows it); the rows say how many processes share the cores.
PLANS = {
    "default model (gpt), 2 stages 1:1, 2 processes": ["cluster.devices_per_node=2"],
    "gpt hidden 256, 2 stages 1:1, 2 processes": ["cluster.devices_per_node=2", "model.hidden=256"],
    "uneven 2:1, gpt hidden 256, 3 processes": ["cluster.devices_per_node=3", "strategy.replicas=[2,1]",
                                                 "model.hidden=256"],
    "uneven 3:1, default gpt, 4 processes": ["strategy.replicas=[3,1]"],
    "default job as shipped (2:2), 4 processes": [],
}


def run(label: str, overrides: list[str], steps: int, tmp: Path) -> dict:
    run_dir = tmp / label.split(" ")[0].replace(":", "-") / str(abs(hash(label)))
    args = [sys.executable, "-m", "dapple_launch", *COMMON, *overrides, f"trainer.max_steps={steps}",
            f"trainer.profile_steps={max(1, steps - 4)}", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "disabled", "DAPPLE_CACHE": str(tmp / "cache")}
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode:
        raise SystemExit(f"{label} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    timeline = json.loads((run_dir / "timeline.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text())
    measured = timeline["measured_median_iteration_s"]
    estimate = plan["estimate"]["iteration_s"]
    return {"plan": label, "layout": ":".join(str(s["replicas"]) for s in plan["stages"]),
            "micro_batches": plan["num_micro_batches"], "measured_s": measured, "estimate_s": estimate,
            "simulated_s": plan["estimate"]["simulated_iteration_s"], "error": estimate / measured - 1,
            "timeline": str(run_dir / "timeline.svg")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--out", default="calibration.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(label, ov, args.steps, Path(tmp)) for label, ov in PLANS.items()]
    print(f"\ncores here: {len(os.sched_getaffinity(0))}; profile measured here (cached per run), "
          f"median of the recorded steps\n")
    print("| plan | layout | M | measured s | estimate s | simulator s | estimate error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['plan']} | {r['layout']} | {r['micro_batches']} | {r['measured_s']:.4f} | {r['estimate_s']:.4f} | "
              f"{r['simulated_s']:.4f} | {r['error']:+.1%} |")
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
