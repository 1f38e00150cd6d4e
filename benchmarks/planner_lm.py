"""Planner benchmark for the models users train: GPT and Llama presets, planned as the CLI plans them.

`python -m dapple_launch model=gpt model.preset=large cluster=... dry_run=true` runs planner.search.plan,
not only the search planner.py times: for a causal language model it also tries TeraPipe's token
slices on the best layouts found (strategy.token_slices=auto, the default). Each row composes the
job's config with Hydra, builds the model's analytic profile (not timed: a dry run's profile, built
once), and times plan() in process on one core: the planning seconds that plan.json's proof reports.

    python benchmarks/planner_lm.py [--out benchmarks/results/planner_lm.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dapple_launch import plan_config  # noqa: E402
from dapple_launch.cli import compose  # noqa: E402
from dapple_launch.planner import search as search_module  # noqa: E402
from dapple_launch.planner import terapipe  # noqa: E402

# (model, preset, cluster, global batch[, nodes]): presets from small to 70B, on the shipped clusters, at
# global batches from a few micro-batches per stage (where slices pay) to many
CASES = [
    ("gpt", "small", "v100x16", 16),
    ("gpt", "medium", "v100x16", 16),
    ("gpt", "medium", "h100x8", 8),
    ("gpt", "medium", "a100x64", 256),
    ("gpt", "large", "v100-16x1", 16),
    ("gpt", "large", "v100-16x1-10g", 64),
    ("gpt", "xl", "v100x16", 128),
    ("gpt", "xl", "v100-16x1-10g", 32),
    ("gpt", "xl", "a100x64", 64),
    ("llama", "1b", "h100x8", 8),
    ("llama", "1b", "a100x64", 128),
    ("llama", "8b", "h100x8", 64),
    ("llama", "8b", "a100x64", 256),
    # Llama 3 70B on 32 and 128 nodes of 8 A100s: memory decides which layouts and families fit
    ("llama", "70b", "a100x64", 256, 32),
    ("llama", "70b", "a100x64", 1024, 128),
]


def row(family: str, preset: str, cluster: str, G: int, nodes: int | None = None) -> dict:
    overrides = [f"model={family}", f"model.preset={preset}", f"cluster={cluster}", f"global_batch_size={G}"]
    cfg = compose(overrides + ([f"cluster.nodes={nodes}"] if nodes else []))
    precision = plan_config.run_precision(cfg)
    topology = plan_config.topology_from_config(cfg.cluster, precision)
    profile = plan_config.profile_from_config(cfg, topology)
    limits = plan_config.limits_from_config(cfg.strategy, plan_config.slicing_seq_len(cfg))
    spent = [0.0]
    improve = terapipe.improve_with_slices

    def timed(*args, **kwargs):  # (the token slices' share of the planning time)
        t0 = time.perf_counter()
        try:
            return improve(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    terapipe.improve_with_slices = timed
    try:
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        plan = search_module.plan(profile, topology, G, limits)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        terapipe.improve_with_slices = improve
    assert plan.proof is not None
    return {
        "model": f"{family} {preset}",
        "cluster": cluster if not nodes else f"{cluster}, {nodes} nodes",
        "devices": topology.num_devices,
        "G": G,
        "layers": profile.num_layers,
        "plan": f"{len(plan.stages)} stage{'s' if len(plan.stages) > 1 else ''}, {plan.num_micro_batches}×{plan.micro_batch_size}, {plan.schedule}",
        "token_slices": list(plan.token_slices),
        "iteration_s": plan.estimate.iteration_s,
        "proven_gap": plan.proof["gap"],
        "candidates": plan.proof["candidates"],
        "wall_s": wall,
        "cpu_s": cpu,
        "slices_s": spent[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="planner_lm.json")
    args = ap.parse_args()
    rows = []
    print("| model | cluster | G | plan | token slices | iter ms | proven gap | plan s (of it, slices) | candidates |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in CASES:
        r = row(*case)
        rows.append(r)
        slices = f"{len(r['token_slices'])}" if r["token_slices"] else "none"
        print(
            f"| {r['model']} | {r['cluster']} | {r['G']} | {r['plan']} | {slices} | {r['iteration_s'] * 1e3:.1f} | "
            f"{r['proven_gap']:.1%} | {r['wall_s']:.2f} ({r['slices_s']:.2f}) | {r['candidates']} |",
            flush=True,
        )
        Path(args.out).write_text(json.dumps(rows, indent=2))
    worst = max(rows, key=lambda r: r["wall_s"])
    print(f"\nlongest planning: {worst['model']} on {worst['cluster']}, G {worst['G']}: {worst['wall_s']:.2f} s")


if __name__ == "__main__":
    main()
