"""Calibration: the planner's estimate against the measured iteration, with a profile measured here.

For each plan, `python -m dapple_launch` runs a few steps with strategy.profile_source=measured
(each real layer timed on this machine by the planner's measuring profiler, and the gloo links
between that many processes measured by profile/links.py) and
trainer.profile_pipeline=true; the run's timeline.json holds the measured iteration (median of
the recorded steps: the schedule's actions and the gradient all-reduce on every rank, the span
the cost model describes; the optimizer step is outside it) and plan.json the estimate.

    python benchmarks/calibration.py [--steps 34] [--repeats 3] [--out calibration.json]

This machine is shared: its speed drifts between the profile's measurement and the run (the same
plan's iteration has varied by a third from one run to the next). Each plan is therefore run
--repeats times, each run measuring its own profile and links afresh, and the table gives every
run's error and their median.
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
sys.path.insert(0, str(ROOT))
from dapple_launch.host import usable_cores  # noqa: E402

COMMON = [
    "strategy.profile_source=measured",
    "trainer.profile_pipeline=true",
    "trainer.progress_bar=false",
    "logger=none",
    "trainer.val_check_interval=100000",
]
# Each CPU process here is a device only when it has a core: on this machine's cores (2 here) the
# default model's own plan (strategy=auto) runs one process per core; more processes than cores
# share them, and their compute comes in bursts of the scheduler's time slices that no per-layer
# profile describes (the timeline shows it): those rows say how many processes share the cores.
CORES = usable_cores()
PLANS = {
    f"default model (gpt), the planner's plan, {CORES} processes (one per core)": [
        "strategy=auto",
        f"cluster.devices_per_node={CORES}",
    ],
    f"gpt hidden 256, the planner's plan, {CORES} processes (one per core)": [
        "strategy=auto",
        f"cluster.devices_per_node={CORES}",
        "model.hidden=256",
    ],
    "uneven 2:1, gpt hidden 256, 3 processes": [
        "cluster.devices_per_node=3",
        "strategy.replicas=[2,1]",
        "model.hidden=256",
    ],
    "uneven 3:1, default gpt, 4 processes": ["strategy.replicas=[3,1]"],
    "default job as shipped (2:2), 4 processes": [],
}


def run(label: str, overrides: list[str], steps: int, tmp: Path) -> dict:
    run_dir = tmp / label.split(" ")[0].replace(":", "-") / str(abs(hash(label)))
    args = [
        sys.executable,
        "-m",
        "dapple_launch",
        *COMMON,
        *overrides,
        f"trainer.max_steps={steps}",
        f"trainer.profile_steps={max(1, steps - 4)}",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "WANDB_MODE": "disabled", "DAPPLE_CACHE": str(tmp / "cache")}
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode:
        raise SystemExit(f"{label} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    timeline = json.loads((run_dir / "timeline.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text())
    measured = timeline["measured_median_iteration_s"]
    estimate = plan["estimate"]["iteration_s"]
    return {
        "plan": label,
        "layout": ":".join(str(s["replicas"]) for s in plan["stages"])
        + (f" warm-up {plan['warmup']}" if plan.get("warmup") else ""),
        "micro_batches": plan["num_micro_batches"],
        "measured_s": measured,
        "estimate_s": estimate,
        "simulated_s": plan["estimate"]["simulated_iteration_s"],
        "error": estimate / measured - 1,
        "timeline": str(run_dir / "timeline.svg"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=34)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="calibration.json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, ov in PLANS.items():
            runs = [run(label, ov, args.steps, Path(tmp) / f"run{k}") for k in range(args.repeats)]
            errors = sorted(r["error"] for r in runs)
            rows.append({**runs[0], "runs": runs, "median_error": errors[len(errors) // 2]})
            print(f"{label}: errors {[f'{e:+.1%}' for e in (r['error'] for r in runs)]}", flush=True)
    print(
        f"\ncores here: {CORES}; each run measures its own profile and links, then its median recorded "
        f"iteration (steps 2..{args.steps - 4})\n"
    )
    print(
        "| plan | layout | M | measured s (per run) | estimate s (per run) | estimate error (per run) | median error |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        measured = ", ".join(f"{x['measured_s']:.4f}" for x in r["runs"])
        estimate = ", ".join(f"{x['estimate_s']:.4f}" for x in r["runs"])
        errors = ", ".join(f"{x['error']:+.1%}" for x in r["runs"])
        print(
            f"| {r['plan']} | {r['layout']} | {r['micro_batches']} | {measured} | {estimate} | {errors} | "
            f"{r['median_error']:+.1%} |"
        )
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
