"""Several gloo processes: stages of round-robin copies (1f1b_rr, zb_h1_rr) — loss and every gradient
equal a single-process reference, and each rank keeps the micro-batches in flight the simulator of
its rank order counts."""

from __future__ import annotations

import pytest

from dapple_launch.cluster import Topology
from dapple_launch.planner import Limits, fixed_plan
from dapple_launch.profile import analytic_profile
from dapple_launch.runtime.module import PipelineModule
from dapple_launch.schedule import StageCosts, simulate_ranks

from .multiproc import run_ranks
from .test_chunked_numerics import _many, model_of

pytestmark = pytest.mark.multiprocess


def rr_plan(model, replicas, copies, schedule, num_micro_batches, global_batch, depth=1):
    topo = Topology("test", 1, sum(replicas), 8e9, 0.05, 1e9, 1e9, device_kind="cpu")
    profile = analytic_profile(model, 2, topo.device_tflops, "cpu")
    return fixed_plan(
        profile,
        topo,
        global_batch,
        len(replicas),
        list(replicas),
        num_micro_batches,
        Limits(schedule=schedule, copies=tuple(copies)),
        warmup_depth=depth,
    )


# (model, replicas per stage, copies per stage, schedule, micro-batches, batch size): 2 to 4 ranks,
# copies of one device and of two, micro-batch counts that do not divide among the copies, a tied
# weight (gpt, skipnet) summed across copies, warm-ups deeper than the minimum
CASES = [
    ("gpt", (2, 1), (2, 1), "1f1b_rr", 4, 4, 1),
    ("gpt", (1, 2), (1, 2), "zb_h1_rr", 5, 10, 1),
    ("gpt-untied", (3, 1), (3, 1), "1f1b_rr", 7, 7, 2),
    ("gpt", (2, 2), (1, 2), "zb_h1_rr", 4, 8, 1),
    ("skipnet", (2, 1, 1), (2, 1, 1), "1f1b_rr", 6, 12, 1),
    ("gpt-untied", (2, 1, 1), (2, 1, 1), "zb_h1_rr", 6, 6, 3),
    ("gpt", (4,), (4,), "1f1b_rr", 6, 6, 1),
    ("gpt", (1, 3), (1, 3), "1f1b_rr", 8, 8, 2),
]


def test_stage_copies_equal_the_reference(tmp_path):
    plans = [
        rr_plan(model_of(name), reps, copies, schedule, m, m * max(r // c for r, c in zip(reps, copies)), depth)
        for name, reps, copies, schedule, m, n, depth in CASES
    ]
    by_world: dict[int, list[int]] = {}
    for i, case in enumerate(CASES):
        by_world.setdefault(sum(case[1]), []).append(i)
    for world, idx in by_world.items():
        per_rank = run_ranks(world, _many, ([(CASES[i][0], plans[i].to_json(), CASES[i][5]) for i in idx],), tmp_path)
        for j, i in enumerate(idx):
            case, plan = CASES[i], plans[i]
            assert plan.schedule == case[3] and [s.copies for s in plan.stages] == list(case[2])
            schedule = plan.build_schedule()
            sim = simulate_ranks(schedule, [StageCosts(1.0, 2.0) for _ in range(plan.num_stages)], record=False)
            everything = {
                n for n, _ in PipelineModule(model_of(case[0])).materialize().named_parameters(remove_duplicate=False)
            }
            names = set()
            for res in per_rank:
                r = res[j]
                assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5), case
                assert r["worst_grad_rel"] < 1e-4, case
                assert r["saved_peak"] == sim.peak_in_flight[r["group"]], case
                names |= set(r["names"])
            assert names == everything, case
