"""Fuzz of plan(): random and extreme profiles × clusters × global batches × schedule sets.

Each seed draws a profile (1 to 60 layers; times, activations and weights over orders of
magnitude; some layers that take no time or hold no weights, one giant layer, split-backward
shares measured or not, a quarter of them with the first and last layers sharing a weight), a cluster (1 to 8 nodes of 1 to 8 devices, a fifth of them 3 or 6 nodes or devices a node; fast or
slow links, roomy or tight memory), a global batch and a set of schedule families, and plans it on a small budget.
Each must end one of two ways:

- a plan: its proof's gap in [0, 1); every device's estimated peak within its memory; plan.json's
  `orders` accepted by the rank validator (NCCL's rules) and, re-simulated from plan.json's stage
  costs alone, the plan's own simulated time, and no device holding more (its stages' weights and
  the most activations the orders keep at once) than the plan's memory says; for one stage a
  device (1F1B, GPipe, ZB-H1), those stage costs and that memory the layout's own with the
  recomputation it lists, costed afresh; the same plan again from the same inputs (every tenth
  seed);
- a refusal: a ValueError of one line (the rule, the numbers, the fix), never another exception.

    python benchmarks/fuzz_plan.py [--seeds 1200] [--out benchmarks/results/fuzz_plan.json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dapple_launch.cluster import Topology  # noqa: E402
from dapple_launch.plan_config import DEFAULT_SCHEDULES  # noqa: E402
from dapple_launch.planner.chunked import CHUNKED, evaluate_chunked  # noqa: E402
from dapple_launch.planner.cost import StageSpec, memory_per_device, recomputed_costs, stage_costs  # noqa: E402
from dapple_launch.planner.limits import Limits  # noqa: E402
from dapple_launch.planner.search import plan  # noqa: E402
from dapple_launch.profile import LayerProfile, chain  # noqa: E402
from dapple_launch.schedule import StageCosts  # noqa: E402
from dapple_launch.schedule.rank_simulate import simulate_ranks  # noqa: E402
from dapple_launch.schedule.rank_validate import validate_ranks  # noqa: E402
from dapple_launch.schedule.ranks import RankSchedule, steps_from_json  # noqa: E402

FAMILIES = DEFAULT_SCHEDULES + ("gpipe",)
BUDGET = 2_000  # strategy.search_nodes per seed: every pass runs, on a small budget


def draw_profile(rng: random.Random):
    layers = rng.choice([1, 2, 3, 5, 8, 12, 20, 33, 60])
    scale = 10 ** rng.uniform(-5, -1)  # a layer's forward: 10 µs .. 100 ms
    measured = rng.random() < 0.5
    giant = rng.randrange(layers) if rng.random() < 0.2 else -1
    heavy = 9.5 if rng.random() < 0.15 else 8.0  # (the heaviest: a layer no device holds, some seeds)
    out = []
    for i in range(layers):
        f = scale * rng.uniform(0.2, 3.0) * (50 if i == giant else 1)
        f = 0.0 if rng.random() < 0.05 else f
        b = f * rng.uniform(1.0, 3.0)
        fixed = rng.choice([0.0, 0.0, 0.3, 0.9])
        out.append(
            LayerProfile(
                f"l{i}",
                f,
                b,
                10 ** rng.uniform(3, 9),  # activation bytes
                0.0 if rng.random() < 0.2 else 10 ** rng.uniform(2, heavy),  # weights
                forward_fixed_s=f * fixed,
                backward_fixed_s=b * fixed,
                weight_grad_s=b * rng.uniform(0.2, 0.8) if measured else None,
            )
        )
    if all(x.forward_s == 0 and x.backward_s == 0 for x in out):  # (refused: a profile must take time)
        out[0] = LayerProfile("l0", scale, 2 * scale, 1e6, 1e6)
    return chain(f"fuzz{layers}", out, batch_size=rng.choice([1, 2, 4, 8, 32]))


def draw_cluster(rng: random.Random) -> Topology:
    nodes, per_node = rng.choice([1, 1, 2, 4, 8]), rng.choice([1, 2, 4, 8])
    return Topology(
        "fuzz",
        nodes,
        per_node,
        10 ** rng.uniform(9, 11),  # device memory: 1 GB .. 100 GB
        rng.choice([15.0, 125.0]),
        10 ** rng.uniform(9, 11.5),
        10 ** rng.uniform(8, 10.5),
    )


def check(profile, topology: Topology, G: int, limits: Limits) -> tuple[str, str]:
    """("planned", family) or ("refused", the message); raises AssertionError on a broken plan."""
    try:
        p = plan(profile, topology, G, limits)
    except ValueError as e:
        message = str(e)
        assert message and "\n" not in message, f"a refusal of more than one line: {message!r}"
        return "refused", message
    assert p.proof is not None and 0.0 <= p.proof["gap"] < 1.0, p.proof
    capacity = topology.device_memory_bytes
    assert all(x <= capacity * (1 + 1e-9) for x in p.estimate.peak_memory_bytes), (
        p.estimate.peak_memory_bytes,
        capacity,
    )
    d = json.loads(p.to_json())
    orders = [steps_from_json(o["actions"]) for o in d["orders"]]
    placement = tuple(
        tuple(g for g, o in enumerate(orders) if any(a.stage == s for a in o)) for s in range(len(d["stages"]))
    )
    ranks = RankSchedule("plan.json", len(d["stages"]), d["num_micro_batches"], tuple(orders), placement)
    validate_ranks(ranks)
    if not d["estimate"]["slice_shares"]:  # (token slices: their costs scale per slice; tests cover them)
        costs = [StageCosts(**c) for c in d["estimate"]["stage_costs"]]
        sim = simulate_ranks(ranks, costs)
        want = d["estimate"]["simulated_iteration_s"]
        assert math.isclose(sim.iteration_s, want, rel_tol=1e-9), (sim.iteration_s, want)
        # what each device holds when plan.json's orders run: its stages' weights and optimizer
        # state, and the most activations the simulated orders keep at once; the plan's memory is
        # no less (it is what fits was judged on)
        held = [
            sum(profile.span(*p.stages[s].layers)[3] for s in range(len(p.stages)) if g in placement[s])
            * limits.optimizer_factor
            + peak
            for g, peak in enumerate(sim.peak_activation_bytes)
        ]
        for s, stated in enumerate(p.estimate.peak_memory_bytes):
            most = max(held[g] for g in placement[s])
            assert stated >= most * (1 - 1e-9), ("memory under what the orders hold", s, stated, most)
    if p.schedule in FRESH and not p.token_slices:
        costed_afresh(profile, topology, p, limits)
    if p.schedule in CHUNKED:
        groups_afresh(profile, topology, p, limits)
    return "planned", p.schedule


FRESH = ("1f1b", "gpipe", "zb_h1")  # one stage a device: their costs come from the layout alone


def costed_afresh(profile, topology: Topology, p, limits: Limits) -> None:
    """The plan's stage costs and memory are its layout's with the recomputation it lists, costed
    afresh: what the runtime will run is what was costed (a plan started from a recomputing one once
    kept its savings and listed none)."""
    layout = tuple(StageSpec(st.layers[0], st.layers[1], tuple(st.devices)) for st in p.stages)
    sets = tuple(tuple(st.recompute_layers) for st in p.stages)
    fresh = stage_costs(profile, topology, layout, p.micro_batch_size)
    if any(sets):
        fresh = recomputed_costs(profile, topology, layout, fresh, p.micro_batch_size, sets)
    for s, (stated, costed) in enumerate(zip(p.estimate.stage_costs, fresh)):
        # (auto recomputation sums a stage's kept bytes in another order: equal to rounding)
        pairs = {k: (v, getattr(costed, k)) for k, v in stated.items()}
        wrong = {k: vw for k, vw in pairs.items() if vw[0] != vw[1] and not math.isclose(*vw, rel_tol=1e-9)}
        assert not wrong, ("stage costs", s, p.schedule, sets[s], wrong)
    family = replace(limits, schedule=p.schedule, recompute="none")
    memory = memory_per_device(profile, layout, fresh, p.num_micro_batches, family, p.warmup)
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(memory, p.estimate.peak_memory_bytes)), (
        "memory",
        memory,
        p.estimate.peak_memory_bytes,
    )


def groups_afresh(profile, topology: Topology, p, limits: Limits) -> None:
    """A device-group plan's stage costs and memory are its layout's, costed afresh by the one path
    that costs them (chunked.evaluate_chunked) with the recomputation it lists (strategy.recompute=auto's
    fit: each stage's first layers, group_recompute.py; full: every layer; or none), as the layer
    positions strategy.recompute=selective takes."""
    layout = tuple(StageSpec(st.layers[0], st.layers[1], tuple(st.devices)) for st in p.stages)
    marks = tuple(i for st in p.stages for i in st.recompute_layers)
    for st in p.stages:  # (auto recomputes a stage's first layers: one segment at its start)
        assert tuple(st.recompute_layers) == tuple(range(st.layers[0], st.layers[0] + len(st.recompute_layers)))
    # (the Limits of that plan alone: its family, its recomputation, no token slices)
    alone = replace(
        limits,
        schedule=p.schedule,
        schedules=(p.schedule,),
        recompute="selective" if marks else "none",
        recompute_layers=marks,
        recompute_counts=(),
        token_slices=(),
        auto_token_slices=False,
    )
    c = evaluate_chunked(
        profile, topology, layout, p.micro_batch_size, p.num_micro_batches, alone, p.schedule, p.chunks
    )
    assert c is not None
    for s, (stated, costed) in enumerate(zip(p.estimate.stage_costs, c.costs)):
        pairs = {k: (v, getattr(costed, k)) for k, v in stated.items()}
        wrong = {k: vw for k, vw in pairs.items() if vw[0] != vw[1] and not math.isclose(*vw, rel_tol=1e-9)}
        assert not wrong, ("stage costs", s, p.schedule, wrong)
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(c.memory_bytes, p.estimate.peak_memory_bytes)), (
        "memory",
        c.memory_bytes,
        p.estimate.peak_memory_bytes,
    )


def run_seed(seed: int) -> tuple[str, str]:
    """One seed's draw, planned and checked (check); every tenth planned twice more, compared."""
    rng = random.Random(seed)
    profile, topology = draw_profile(rng), draw_cluster(rng)
    # a quarter of the profiles share a weight between the first and last layers (a tied embedding),
    # drawn apart so every seed's other draws stay what they were
    L, tie = profile.num_layers, random.Random(10**6 + seed)
    if L > 1 and tie.random() < 0.25:
        profile = replace(profile, tied=(((0, L - 1), 10 ** tie.uniform(4, 9)),))
    # a fifth of the clusters have nodes of 3 or 6 devices, or 3 or 6 nodes (no power of two: a
    # node's replica counts and the stages' fresh-node starts then fall elsewhere), drawn apart too
    odd = random.Random(2 * 10**6 + seed)
    if odd.random() < 0.2:
        nodes, per_node = odd.choice([(3, 1), (3, 2), (6, 1), (1, 3), (1, 6), (2, 3), (2, 6), (3, 6), (6, 3)])
        topology = replace(topology, nodes=nodes, devices_per_node=per_node)
    G = rng.choice([1, 2, 3, 8, 16, 24, 64, 128, 256]) * rng.choice([1, topology.num_devices])
    families = tuple(sorted(rng.sample(FAMILIES, rng.randint(1, 4)))) if rng.random() < 0.6 else DEFAULT_SCHEDULES
    limits = Limits(schedules=families, search_nodes=BUDGET, recompute=rng.choice(["none", "none", "auto"]))
    outcome, what = check(profile, topology, G, limits)
    if seed % 10 == 0 and outcome == "planned":
        again, first = plan(profile, topology, G, limits), plan(profile, topology, G, limits)
        assert again == first, "not the same plan from the same inputs"
    return outcome, what


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=1200)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fuzz_plan.json"))
    args = ap.parse_args()
    planned: dict[str, int] = {}
    refused: dict[str, int] = {}
    failures, slowest = [], (0.0, -1)
    started = time.perf_counter()
    for seed in range(args.first, args.first + args.seeds):
        t = time.perf_counter()
        try:
            outcome, what = run_seed(seed)
            tally = planned if outcome == "planned" else refused
            key = what if outcome == "planned" else re.sub(r"[\d.,]+", "N", what)[:48]  # (the rule, not its numbers)
            tally[key] = tally.get(key, 0) + 1
        except Exception as e:  # (a broken plan or a traceback: what this fuzz is for)
            failures.append(
                {"seed": seed, "error": f"{type(e).__name__}: {e}"[:400], "where": traceback.format_exc()[-800:]}
            )
            print(f"seed {seed}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        slowest = max(slowest, (time.perf_counter() - t, seed))
    out = {
        "seeds": args.seeds,
        "first": args.first,
        "search_nodes": BUDGET,
        "planned": sum(planned.values()),
        "refused": sum(refused.values()),
        "failures": failures,
        "plans_by_family": dict(sorted(planned.items())),
        "refusals_by_rule": dict(sorted(refused.items(), key=lambda kv: -kv[1])),
        "slowest_s": round(slowest[0], 2),
        "slowest_seed": slowest[1],
        "wall_s": round(time.perf_counter() - started, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"| seeds | planned | refused (one line) | failures | slowest s | wall s |\n|---|---|---|---|---|---|\n"
        f"| {args.seeds} | {out['planned']} | {out['refused']} | {len(failures)} | {out['slowest_s']} | {out['wall_s']} |"
    )
    print("plans by family:", out["plans_by_family"])
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
