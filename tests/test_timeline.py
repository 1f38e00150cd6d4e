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
    return fixed_plan(
        analytic_profile(model, 2, topo.device_tflops, "cpu"), topo, 8, 2, [2, 1], 4, Limits(schedule=schedule)
    )


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


def test_a_chunked_timeline_shows_each_ranks_stages_and_stays_readable_at_16_micro_batches(tmp_path):
    """ZB-V on 2 device groups (stages 0,3 and 1,2), 16 micro-batches: one row per rank naming its
    stages, every F, I and W of both chunks drawn (the later chunk lighter), and a number only in
    boxes wide enough for it."""
    model = build_model("gpt", "tiny", num_layers=4, hidden=32, heads=2, seq_len=8, vocab_size=40)
    topo = Topology("t", 1, 2, 8e9, 0.05, 1e9, 1e9, device_kind="cpu")
    plan = fixed_plan(
        analytic_profile(model, 2, topo.device_tflops, "cpu"), topo, 16, 4, [1], 16, Limits(schedule="zbv")
    )
    grid = ProcessGrid.from_plan(plan)
    schedule = plan.build_schedule()
    per_rank = []
    for rank in range(grid.world_size):  # as the rank executor records: "F3·s2" per compute step
        t = 1000.0
        per_rank.append(
            [
                (f"{a.kind.value}{a.micro_batch}·s{a.stage}", t + 0.01 * k, t + 0.01 * (k + 1))
                for k, a in enumerate(schedule.orders[rank])
            ]
        )
    its = [measured_iteration(step, per_rank, grid) for step in (1, 2, 3)]
    assert [r["stages"] for r in its[0]["ranks"]] == [[0, 3], [1, 2]]
    pred = predicted(plan)
    assert abs(pred["iteration_s"] - plan.estimate.simulated_iteration_s) < 1e-12
    _, svg_path = write_timeline(tmp_path, plan, its)
    root = ET.parse(svg_path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    rects = list(root.iter(f"{ns}rect"))
    for kind in ("forward", "input", "weight"):
        drawn = sum(1 for it in (its[0], pred) for r in it["ranks"] for e in r["events"] if e["kind"] == kind)
        assert drawn == 2 * 2 * 2 * 16  # 2 ranks × 2 stages × 16 micro-batches, measured and predicted
        shades = [r.get("fill-opacity") for r in rects if r.get("fill") == COLOURS[kind] and r.get("fill-opacity")]
        assert shades.count("1") == shades.count("0.65") == drawn // 2  # the rank's first and later stage
    assert "stages 0,3" in ET.tostring(root, encoding="unicode")
    boxes = {
        round(float(r.get("x")) + float(r.get("width")) / 2, 2): float(r.get("width"))
        for r in rects
        if r.get("fill-opacity")
    }
    labels = [t for t in root.iter(f"{ns}text") if t.get("class") == "mb"]
    assert labels and all(boxes[float(t.get("x"))] >= 6 + 6 * len(t.text) for t in labels)
