"""The timeline picture and numbers (pure): built from recorded events and the plan's own costs."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from dapple_launch.cluster import Topology
from dapple_launch.models import build_model
from dapple_launch.planner import Limits, fixed_plan
from dapple_launch.profile import analytic_profile
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.timeline import COLOURS, measured_iteration, predicted, write_timeline
from dapple_launch.schedule import build_schedule


def _plan(schedule="1f1b"):
    model = build_model("gpt", "tiny", num_layers=4, hidden=32, heads=2, seq_len=8, vocab_size=40)
    topo = Topology("t", 1, 3, 8e9, 0.05, 1e9, 1e9, device_kind="cpu")
    return fixed_plan(analytic_profile(model, 2, topo.device_tflops, "cpu"), topo, 8, 2, [2, 1], 4,
                      Limits(schedule=schedule))


def _recorded(plan, t0=1000.0, step_s=0.01):
    """Events as ranks record them: each action of the stage's list in order, step_s apart."""
    grid = ProcessGrid.from_plan(plan)
    schedule = build_schedule(plan.schedule, plan.num_stages, plan.num_micro_batches)
    per_rank = []
    for rank in range(grid.world_size):
        stage, _ = grid.position(rank)
        t, events = t0 + 0.001 * stage, []
        for a in schedule.stage_actions[stage]:
            events.append((str(a), t, t + step_s))
            t += step_s
        if grid.replicas[stage] > 1:
            events.append(("AR", t, t + step_s))
        per_rank.append(events)
    return per_rank


def test_timeline_numbers_and_picture(tmp_path):
    plan = _plan()
    assert len(plan.estimate.stage_costs) == 2  # the plan carries the costs its estimate was made from
    grid = ProcessGrid.from_plan(plan)
    its = [measured_iteration(step, _recorded(plan, step_s=0.01 * (1 + step)), grid) for step in (2, 3, 4)]
    assert its[0]["ranks"][0]["events"][0]["start"] == 0.0  # relative to the earliest start
    pred = predicted(plan)
    assert abs(pred["iteration_s"] - plan.estimate.simulated_iteration_s) < 1e-12
    json_path, svg_path = write_timeline(tmp_path, plan, its)
    import json
    data = json.loads(json_path.read_text())
    assert data["shown_step"] == 3 and data["measured_median_iteration_s"] == its[1]["iteration_s"]
    assert data["predicted_error"] == (pred["iteration_s"] - its[1]["iteration_s"]) / its[1]["iteration_s"]
    svg = ET.parse(svg_path).getroot()  # well-formed
    fills = [r.get("fill") for r in svg.iter("{http://www.w3.org/2000/svg}rect")]
    forwards = sum(1 for r in its[1]["ranks"] for e in r["events"] if e["kind"] == "forward")
    forwards += sum(1 for r in pred["ranks"] for e in r["events"] if e["kind"] == "forward")
    assert fills.count(COLOURS["forward"]) == forwards + 1  # + the legend's swatch
    assert fills.count(COLOURS["allreduce"]) >= 2  # measured and predicted all-reduce of the 2-replica stage


def test_a_zero_bubble_timeline_draws_input_and_weight_gradients_apart(tmp_path):
    """ZB-H1: every I and W, measured and predicted, in its own colour, with a legend entry each."""
    plan = _plan("zb_h1")
    grid = ProcessGrid.from_plan(plan)
    its = [measured_iteration(step, _recorded(plan), grid) for step in (2, 3, 4)]
    pred = predicted(plan)
    _, svg_path = write_timeline(tmp_path, plan, its)
    fills = [r.get("fill") for r in ET.parse(svg_path).getroot().iter("{http://www.w3.org/2000/svg}rect")]
    for kind in ("input", "weight"):
        drawn = sum(1 for it in (its[0], pred) for r in it["ranks"] for e in r["events"] if e["kind"] == kind)
        assert drawn >= 2 * plan.num_micro_batches  # (both stages, measured and predicted)
        assert fills.count(COLOURS[kind]) == drawn + 1  # + the legend's swatch
    assert fills.count(COLOURS["backward"]) == 1  # only the legend's: no whole backward in ZB-H1
