"""Frontier benchmark (TensorOpt's FT): time against memory per device, and devices as an objective.

Rows: the shipped DAPPLE profiles on v100x16 and a100x64 at global batch 128 and 512. Each row: the
frontier's size and planning time (objective=pareto, the default step), the fastest and the
least-memory points, and the fastest plan within 50 % and 25 % of the card's usable memory against
the best baseline that fits the same budget (data parallel and uniform pipelines, with recomputation
where they need it: recompute=auto). Then the device frontier of BERT-48 and GPT-2 XL on a100x64:
iteration time and device-seconds per sample from 8 to 64 devices (whole nodes).

    python benchmarks/pareto.py [--quick] [--out pareto.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.planner import PROFILES, load_profile  # noqa: E402
from dapple_launch.models import build_model  # noqa: E402
from dapple_launch.plan_config import shipped_topology  # noqa: E402
from dapple_launch.planner.baselines import all_baselines  # noqa: E402
from dapple_launch.planner.frontier import device_seconds_per_sample, plan_choice, sub_cluster  # noqa: E402
from dapple_launch.planner.limits import Limits  # noqa: E402
from dapple_launch.planner.search import NoFeasiblePlan, plan  # noqa: E402
from dapple_launch.profile import analytic_profile  # noqa: E402

LIMITS = Limits(schedules=("1f1b", "zb_h1"), recompute="auto")
GIB = 2**30


def peak(p) -> float:
    return max(p.estimate.peak_memory_bytes)


def best_baseline(profile, topo, G, budget):
    """The fastest baseline within `budget` bytes per device (recomputation where it needs it)."""
    capped = replace(topo, device_memory_bytes=budget / (1 - LIMITS.memory_headroom))
    found = [
        (name, c)
        for name, c in all_baselines(profile, capped, G, replace(LIMITS, schedule="1f1b")).items()
        if c is not None and c.fits
    ]
    return min(found, key=lambda x: x[1].iteration_s, default=(None, None))


def within(profile, topo, G, budget):
    capped = replace(topo, device_memory_bytes=budget / (1 - LIMITS.memory_headroom))
    try:
        return plan(profile, capped, G, LIMITS)
    except NoFeasiblePlan:
        return None


def frontier_row(name, profile, cluster, G):
    topo = shipped_topology(cluster)
    gc.collect()
    t0 = time.perf_counter()
    f = plan_choice(profile, topo, G, LIMITS, objective="pareto")
    wall = time.perf_counter() - t0
    if not f.points:
        return {"model": name, "cluster": cluster, "G": G, "points": 0, "wall_s": wall}
    fast, least = f.points[0], min(f.points, key=peak)
    usable = topo.device_memory_bytes * (1 - LIMITS.memory_headroom)
    row = {
        "model": name,
        "cluster": cluster,
        "G": G,
        "points": len(f.points),
        "searches": f.searches,
        "wall_s": wall,
        "fastest_s": fast.estimate.iteration_s,
        "fastest_gib": peak(fast) / GIB,
        "least_memory_s": least.estimate.iteration_s,
        "least_memory_gib": peak(least) / GIB,
        "recomputing_points": sum(p.recomputes for p in f.points),
    }
    for share in (0.5, 0.25):
        budget = usable * share
        ours = within(profile, topo, G, budget)
        base_name, base = best_baseline(profile, topo, G, budget)
        row[f"at_{int(share * 100)}"] = {
            "budget_gib": budget / GIB,
            "ours_s": ours.estimate.iteration_s if ours else None,
            "ours_recomputes": bool(ours and ours.recomputes),
            "baseline": base_name,
            "baseline_s": base.iteration_s if base else None,
            "speedup": (base.iteration_s / ours.estimate.iteration_s) if ours and base else None,
        }
    return row


def device_rows(name, profile, cluster, G):
    topo = shipped_topology(cluster)
    out = []
    for n in range(topo.devices_per_node, topo.num_devices + 1, topo.devices_per_node):
        t0 = time.perf_counter()
        try:
            p = plan(profile, sub_cluster(topo, n), G, LIMITS)
        except NoFeasiblePlan:
            out.append({"model": name, "devices": n, "plan": None})
            continue
        out.append(
            {
                "model": name,
                "devices": n,
                "iteration_s": p.estimate.iteration_s,
                "device_s_per_sample": device_seconds_per_sample(p),
                "gib": peak(p) / GIB,
                "layout": f"{p.num_stages} stages {p.layout()}",
                "wall_s": time.perf_counter() - t0,
            }
        )
    return out


def _s(x):
    return "-" if x is None else f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="v100x16 only, no device frontier of GPT-2 XL")
    ap.add_argument("--out", default="pareto.json")
    args = ap.parse_args(argv)
    clusters = ["v100x16"] if args.quick else ["v100x16", "a100x64"]
    rows = []
    print(
        "| model | cluster | G | points (searches) | planning | fastest | its memory | least memory | its time "
        "| 50% budget: ours / best baseline | 25% budget: ours / best baseline |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for cluster in clusters:
        for label, file, pbs, scale in PROFILES:
            profile = load_profile(file, pbs, scale)
            for G in (128, 512):
                r = frontier_row(label, profile, cluster, G)
                rows.append(r)
                if not r["points"]:
                    print(f"| {label} | {cluster} | {G} | none fits | {r['wall_s']:.2f} s | | | | | | |")
                    continue
                cells = []
                for key in ("at_50", "at_25"):
                    b = r[key]
                    sp = f" ({b['speedup']:.2f}×)" if b["speedup"] else ""
                    rec = ", recomputes" if b["ours_recomputes"] else ""
                    cells.append(f"{_s(b['ours_s'])}{rec} / {_s(b['baseline_s'])} {b['baseline'] or ''}{sp}")
                print(
                    f"| {label} | {cluster} | {G} | {r['points']} ({r['searches']}) | {r['wall_s']:.2f} s "
                    f"| {_s(r['fastest_s'])} | {r['fastest_gib']:.2f} GiB | {r['least_memory_gib']:.2f} GiB "
                    f"| {_s(r['least_memory_s'])} | {cells[0]} | {cells[1]} |"
                )
    sixteen = [r["wall_s"] for r in rows if r["cluster"] == "v100x16"]
    print(f"\nobjective=pareto planning time on 16 devices: max {max(sixteen):.2f} s over {len(sixteen)} rows")
    devices = []
    models = [("bert-48", load_profile("bert-48-pbs-2.txt", 2, 1.0))]
    if not args.quick:
        topo = shipped_topology("a100x64")
        models.append(
            (
                "gpt2-xl",
                analytic_profile(build_model("gpt", "xl"), 2, topo.device_tflops, topo.name, precision="bf16-mixed"),
            )
        )
    print("\n| model | devices | iteration | device·s / sample | memory/device | layout |")
    print("|---|---|---|---|---|---|")
    for label, profile in models:
        for r in device_rows(label, profile, "a100x64", 512):
            devices.append(r)
            if r.get("plan", 1) is None:
                print(f"| {label} | {r['devices']} | none fits | | | |")
                continue
            print(
                f"| {label} | {r['devices']} | {_s(r['iteration_s'])} | {r['device_s_per_sample']:.4g} "
                f"| {r['gib']:.2f} GiB | {r['layout']} |"
            )
    Path(args.out).write_text(
        json.dumps({"frontier": rows, "devices": devices, "max_planning_s_16_devices": max(sixteen)}, indent=2)
    )
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
