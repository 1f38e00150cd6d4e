"""Planner benchmark: the shipped DAPPLE profiles × clusters × global batch sizes.

For each row: the chosen plan, its estimated iteration time, speed-up over data parallel and
over every baseline (planned under the same cost model; the t-* columns: what a torchtitan user
would configure by hand for each torch schedule, planner/torch_style.py), the estimate against the full simulator
(communication actions and all) for the chosen plan, whether the search proved optimality, and
the planning wall time. Over the 16-device rows at G=128, the geometric-mean share of the compute
bound, and the most any plan could reach by the searches' proven lower bounds (1F1B and ZB-H1
exactly; the chunked families' bound is their busiest group's). Then the scaling
case: a 96-layer BERT (analytic profile) on 512 and 1024 devices (64 and 128 nodes × 8), and
model=gpt model.preset=medium on 64, 512 and 1024 A100s (G 1024).

    python benchmarks/planner.py [--quick] [--out planner_bench.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dapple_launch.models import build_model  # noqa: E402
from dapple_launch.plan_config import DEFAULT_SCHEDULES, PROFILE_BATCH, shipped_topology, with_ties  # noqa: E402
from dapple_launch.planner.cost import speed_ratio  # noqa: E402
from dapple_launch.planner.explain import human_gap  # noqa: E402
from dapple_launch.planner.limits import Limits  # noqa: E402
from dapple_launch.planner.score import simulate_costed  # noqa: E402
from dapple_launch.planner.search import search  # noqa: E402
from dapple_launch.planner.torch_style import torch_style_baselines  # noqa: E402
from dapple_launch.profile import analytic_profile, read_profile_file  # noqa: E402

PROFILES = [
    ("bert-48", "bert-48-pbs-2.txt", 2, 1.0),
    ("vgg-19", "vgg-19-pbs-32.txt", 32, 1.048576),
    ("amoeba-36", "amoeba-36-pbs-1.txt", 1, 1.0),
    ("gnmt-32", "gnmt-32-pbs-64-simplified.txt", 64, 1.0),
]
CLUSTERS = ["v100x16", "v100-16x1", "v100-16x1-10g", "a100x64"]
BATCHES = [64, 128, 256, 1024]
SHORT = {
    "data parallel": "DP",
    "GPipe even split": "GPipe",
    "PipeDream planner": "PipeDream",
    "DAPPLE P:Q two-stage": "P:Q",
    "DAPPLE straight": "straight",
    "torch 1F1B": "t-1F1B",
    "torch interleaved 1F1B": "t-I1F1B",
    "torch interleaved ZB": "t-IZB",
    "torch ZB-V": "t-ZBV",
}
COLUMNS = ("DP", "GPipe", "PipeDream", "P:Q", "straight", "t-1F1B", "t-I1F1B", "t-IZB", "t-ZBV")


def topology(name: str):
    return shipped_topology(name)  # at the precision trainer.precision=auto picks there


def load_profile(file: str, pbs: int, scale: float):
    p = read_profile_file(ROOT / "dapple_launch" / "profiles" / file, pbs, device_tflops=125.0)
    if scale != 1.0:
        p = replace(p, layers=tuple(replace(x, parameter_bytes=x.parameter_bytes * scale) for x in p.layers))
    return p


def row(name, profile, topo, G, limits):
    gc.collect()  # each row from a collected heap, as a fresh `python -m dapple_launch` plans
    t0 = time.perf_counter()
    best, _, baselines, stats = search(profile, topo, G, limits)  # layout and schedule family together
    wall = time.perf_counter() - t0
    one_f_one_b = search(profile, topo, G, replace(limits, schedules=("1f1b",)))[0] if limits.schedules else best
    if best is None:
        return {"model": name, "cluster": topo.name, "G": G, "plan": "none fits", "wall_s": wall}
    # the exact families alone (1F1B, ZB-H1): their search's proven lower bound is what no plan of
    # theirs can beat under the cost model, whatever the budget (outside the timing)
    if set(limits.schedules) == {"1f1b", "zb_h1"}:
        exact, exact_stats = best, stats
    else:
        exact, _, _, exact_stats = search(
            profile, topo, G, replace(limits, schedules=("1f1b", "zb_h1")), with_baselines=False
        )
    # what a torchtitan user would configure by hand for each torch schedule (planned outside the timing)
    baselines = {**baselines, **torch_style_baselines(profile, topo, G, limits)}
    sim = simulate_costed(best).iteration_s
    # the compute bound: every layer's forward and backward over the global batch, shared by every
    # device, no communication and no bubble
    bound = (
        sum(x.forward_s + x.backward_s for x in profile.layers)
        * speed_ratio(profile, topo)
        * G
        / profile.batch_size
        / topo.num_devices
    )
    return {
        "model": name,
        "cluster": topo.name,
        "G": G,
        "plan": best.summary(),
        "iteration_s": best.iteration_s,
        "schedule": best.schedule,
        "speedup_over_1f1b": one_f_one_b.iteration_s / best.iteration_s,
        "compute_bound_share": bound / best.iteration_s,
        "compute_bound_share_1f1b": bound / one_f_one_b.iteration_s,
        "speedup": {SHORT[k]: (v.iteration_s / best.iteration_s if v else None) for k, v in baselines.items()},
        "sim_error": best.iteration_s / sim - 1,
        "proven": stats.proven_optimal,
        "proven_gap": stats.proven_gap,
        # over 1F1B and ZB-H1 (exact search), when interleaved 1F1B, ZB-V and Chimera were searched too (their bound is weaker)
        "proven_gap_exact": stats.gap_without_chunked if stats.gap_without_chunked is not None else stats.proven_gap,
        "nodes": stats.nodes,
        "wall_s": wall,
        # lower bounds proven by the searches: over all the families (the chunked ones' and copies' bounds are weaker)
        # and over 1F1B and ZB-H1 alone; a share of the compute bound above bound / these is out of reach
        "compute_bound_s": bound,
        "lower_bound_s": best.iteration_s * (1 - stats.proven_gap),
        "lower_bound_exact_s": exact.iteration_s * (1 - exact_stats.proven_gap) if exact else None,
    }


def proven(r: dict) -> str:
    """'optimal', or the gap to the optimum the search proved before its budget ended: over 1F1B and
    ZB-H1, then (where searched) over all the default families."""
    exact, gap = r.get("proven_gap_exact", r.get("proven_gap")), r.get("proven_gap")
    text = "optimal" if exact == 0 else f"within {human_gap(exact)}"
    if gap != exact:
        text += f"; all {len(DEFAULT_SCHEDULES)} families: {'optimal' if gap == 0 else 'within ' + human_gap(gap)}"
    return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="v100x16 and a100x64, G 128 only")
    ap.add_argument("--out", default="planner_bench.json")
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument(
        "--long-budget",
        type=int,
        default=1_000_000,
        help="re-plan the rows the default budget did not prove with this many candidates (0: skip)",
    )
    args = ap.parse_args()
    limits = Limits(schedules=DEFAULT_SCHEDULES)  # strategy=auto's default families
    rows = []
    clusters = ["v100x16", "a100x64"] if args.quick else CLUSTERS
    batches = [128] if args.quick else BATCHES
    print(
        "| model | cluster | G | chosen plan | iter ms | × 1F1B only | share of compute bound | "
        + " | ".join(f"× {k}" for k in COLUMNS)
        + " | sim err | proven | plan s |"
    )
    print("|---" * (10 + len(COLUMNS)) + "|")
    for name, file, pbs, scale in PROFILES:
        profile = load_profile(file, pbs, scale)
        for c in clusters:
            topo = topology(c)
            for G in batches:
                r = row(name, profile, topo, G, limits)
                rows.append(r)
                if "iteration_s" not in r:
                    print(f"| {name} | {c} | {G} | none fits |" + " |" * (5 + len(COLUMNS)) + f" {r['wall_s']:.2f} |")
                    continue
                sp = " | ".join(f"{r['speedup'][k]:.2f}" if r["speedup"].get(k) else "n/a" for k in COLUMNS)
                print(
                    f"| {name} | {c} | {G} | {r['plan']} | {r['iteration_s'] * 1e3:.1f} | {r['speedup_over_1f1b']:.3f} | "
                    f"{r['compute_bound_share']:.3f} | {sp} | "
                    f"{r['sim_error']:+.1%} | {proven(r)} | {r['wall_s']:.2f} |",
                    flush=True,
                )
                r["profile"], r["cluster_conf"] = (file, pbs, scale), c
                Path(args.out).write_text(json.dumps(rows, indent=2))
    sixteen = [
        r for r in rows if r["G"] == 128 and "iteration_s" in r and topology(r["cluster_conf"]).num_devices == 16
    ]
    if sixteen:
        geo = {
            k: math.exp(sum(math.log(r[k]) for r in sixteen) / len(sixteen))
            for k in ("compute_bound_share", "compute_bound_share_1f1b")
        }
        print(
            f"\n16-device rows at G=128 ({len(sixteen)}): geometric-mean share of the compute bound "
            f"{geo['compute_bound_share']:.3f} (1F1B alone {geo['compute_bound_share_1f1b']:.3f})"
        )
        summary = {"summary": "16-device rows at G=128", **geo}
        rows.append(summary)
    open_rows = [r for r in rows if r.get("proven_gap_exact")]
    if args.long_budget and open_rows:
        print(
            f"\nrows the default budget ({limits.search_nodes} candidates) did not prove over 1F1B and ZB-H1, "
            f"re-planned over those (the exact search) with {args.long_budget}:\n"
        )
        print(
            "| model | cluster | G | default plan | iter ms | proven | long-budget plan | iter ms | change | proven | plan s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in open_rows:
            long = row(
                r["model"],
                load_profile(*r["profile"]),
                topology(r["cluster_conf"]),
                r["G"],
                replace(limits, search_nodes=args.long_budget, schedules=("1f1b", "zb_h1")),
            )
            r["long_budget"] = long
            if long.get("lower_bound_exact_s"):  # both bounds hold: the higher is the tighter
                r["lower_bound_exact_s"] = max(r["lower_bound_exact_s"] or 0.0, long["lower_bound_exact_s"])
            print(
                f"| {r['model']} | {r['cluster']} | {r['G']} | {r['plan']} | {r['iteration_s'] * 1e3:.1f} | "
                f"{proven(r)} | {long['plan']} | {long['iteration_s'] * 1e3:.1f} | "
                f"{long['iteration_s'] / r['iteration_s'] - 1:+.1%} | {proven(long)} | {long['wall_s']:.1f} |",
                flush=True,
            )
            Path(args.out).write_text(json.dumps(rows, indent=2))
    if sixteen and all(r.get("lower_bound_exact_s") for r in sixteen):
        ceiling = {
            k: math.exp(sum(math.log(r["compute_bound_s"] / r[k]) for r in sixteen) / len(sixteen))
            for k in ("lower_bound_exact_s", "lower_bound_s")
        }
        print(
            f"\nthe most a plan could reach on those rows, by the searches' proven lower bounds: a geometric-mean "
            f"share of {ceiling['lower_bound_exact_s']:.3f} for any 1F1B or ZB-H1 plan, "
            f"{ceiling['lower_bound_s']:.3f} for any plan of the {len(DEFAULT_SCHEDULES)} families (interleaved 1F1B, "
            f"ZB-V and Chimera are bounded by their busiest device group, stages of copies by the compute bound at "
            f"their micro-batch size: 1.000 says no more than it)"
        )
        summary.update(ceiling_exact=ceiling["lower_bound_exact_s"], ceiling_all=ceiling["lower_bound_s"])
        Path(args.out).write_text(json.dumps(rows, indent=2))
    if not args.skip_scaling:
        # each analytic profile with its model's tied embedding, as the CLI plans it (plan_config.with_ties)
        model = build_model("bert", "large", num_layers=94)  # embed + 94 blocks + head = 96 layers
        profile = with_ties(analytic_profile(model, PROFILE_BATCH, 312.0, "a100"), model)
        from dapple_launch.cluster import Topology

        for nodes in (64, 128):  # 512 and 1024 A100s
            big = Topology(f"a100x{nodes * 8}", nodes, 8, 80 * 2**30, 312.0, 300e9, 25e9, 3e-6, 8e-6)
            r = row("bert-96 (analytic)", profile, big, 2048, limits)
            rows.append(r)
            print(
                f"\nscaling: 96 layers on {nodes * 8} devices, G 2048: {r['plan']}, "
                f"{r.get('iteration_s', 0) * 1e3:.1f} ms, planned in {r['wall_s']:.1f} s, {r.get('nodes')} nodes, "
                f"proven: {proven(r)}"
            )
            Path(args.out).write_text(json.dumps(rows, indent=2))
        # model=gpt model.preset=medium (24 x 1024) on the shipped A100 nodes: 64, 512 and 1024 devices
        a100 = topology("a100x64")
        model = build_model("gpt", "medium")
        gpt = with_ties(
            analytic_profile(model, PROFILE_BATCH, a100.device_tflops, "a100", precision="bf16-mixed"), model
        )
        for nodes in (8, 64, 128):
            cluster = replace(a100, name=f"a100x{nodes * 8}", nodes=nodes)
            r = row("gpt-medium (analytic)", gpt, cluster, 1024, limits)
            rows.append(r)
            print(
                f"\nscaling: gpt medium on {nodes * 8} devices, G 1024: {r['plan']}, "
                f"{r.get('iteration_s', 0) * 1e3:.1f} ms, planned in {r['wall_s']:.1f} s, {r.get('nodes')} nodes, "
                f"proven: {proven(r)}"
            )
            Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
