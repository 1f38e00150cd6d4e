"""The pipeline timeline: what each rank did and when, measured, next to the simulator's prediction.

Every rank's executor records (action, start, end) wall times for a few iterations; rank 0
gathers them and writes `timeline.json` (the numbers) and `timeline.svg` (the picture: one row per
rank, measured above and predicted below on the same time axis) next to plan.json. The
prediction is the discrete-event simulator run on the plan's schedule with the plan's own
per-stage costs, so the picture shows where the cost model and the machine disagree.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..planner.plan import Plan
from ..schedule import StageCosts, simulate, simulate_ranks
from ..schedule.ranks import RankSchedule
from .grid import ProcessGrid

COLOURS = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "input": "#E45756",
    "weight": "#EECA3B",
    "send": "#54A24B",
    "wait": "#D9D9D9",
    "allreduce": "#B279A2",
}
KIND_OF = {
    "F": "forward",
    "B": "backward",
    "I": "input",
    "W": "weight",
    "SA": "send",
    "SG": "send",
    "RA": "wait",
    "RG": "wait",
    "AR": "allreduce",
}
LEGEND = [
    ("forward", "forward"),
    ("backward", "backward (whole)"),
    ("input", "input gradient (I)"),
    ("weight", "weight gradient (W)"),
    ("send", "send posted / link busy"),
    ("wait", "waiting for a receive"),
    ("allreduce", "gradient all-reduce"),
]


def _kind(label: str) -> str:
    return KIND_OF[label.split("·")[0].rstrip("0123456789.")]  # F3, with token slices F1.2, with chunks F3·s5


def _chunk(label: str, stages: tuple[int, ...]) -> int:
    """Which of the rank's stages an event belongs to (0 where a rank holds one): F3·s5 -> 5's place."""
    if "·s" not in label:
        return 0
    return stages.index(int(label.rsplit("·s", 1)[1]))


def _row(grid: ProcessGrid, rank: int) -> dict:
    stage, replica = grid.position(rank)
    return {
        "rank": rank,
        "stage": stage,
        "stages": list(grid.stages_at(rank)),
        "replica": replica,
        "device": grid.device_of(rank),
    }


def measured_iteration(step: int, per_rank: list[list[tuple[str, float, float]]], grid: ProcessGrid) -> dict:
    """One iteration: times relative to the earliest start over all ranks."""
    t0 = min(e[1] for events in per_rank for e in events)
    ranks = []
    for rank, events in enumerate(per_rank):
        row = _row(grid, rank)
        ranks.append(
            {
                **row,
                "events": [
                    {
                        "label": lab,
                        "kind": _kind(lab),
                        "chunk": _chunk(lab, tuple(row["stages"])),
                        "start": s - t0,
                        "end": e - t0,
                    }
                    for lab, s, e in events
                ],
            }
        )
    end = max(ev["end"] for r in ranks for ev in r["events"])
    return {"step": step, "iteration_s": end, "ranks": ranks}


def predicted(plan: Plan) -> dict | None:
    """The simulator's timeline for the plan's schedule and the plan's per-stage costs (per replica row)."""
    if not plan.estimate.stage_costs:
        return None
    costs = [StageCosts(**c) for c in plan.estimate.stage_costs]
    schedule = plan.build_schedule()
    scale = None
    if plan.token_slices and plan.estimate.slice_shares:  # each slice's cost: schedule/terapipe.py
        from ..schedule.terapipe import slice_scale, unit_scales

        scale = [
            unit_scales(slice_scale(plan.token_slices, **sh), plan.num_micro_batches)
            for sh in plan.estimate.slice_shares
        ]
    grid = ProcessGrid.from_plan(plan)
    if isinstance(schedule, RankSchedule):  # device groups holding several stages: the rank orders' simulator
        sim = simulate_ranks(schedule, costs)
        assert sim is not None  # (no budget given: it always simulates)
        row_of = {
            r: next(g for g in range(schedule.num_ranks) if schedule.stages_of(g) == grid.stages_at(r))
            for r in range(grid.world_size)
        }
    else:
        sim = simulate(schedule, costs, scale=scale)
        row_of = {r: grid.position(r)[0] for r in range(grid.world_size)}
    ranks = []
    for rank in range(grid.world_size):
        row = _row(grid, rank)
        ranks.append(
            {
                **row,
                "events": [
                    {
                        "label": ev.label,
                        "kind": ev.kind,
                        "chunk": _chunk(ev.label, tuple(row["stages"])),
                        "start": ev.start,
                        "end": ev.end,
                    }
                    for ev in sim.timeline
                    if ev.stage == row_of[rank]
                ],
            }
        )
    return {"iteration_s": sim.iteration_s, "ranks": ranks}


def write_timeline(run_dir: Path, plan: Plan, iterations: list[dict]) -> tuple[Path, Path]:
    """timeline.json (all recorded iterations, the prediction, the error) and timeline.svg (the
    median iteration against the prediction)."""
    median_s = statistics.median(it["iteration_s"] for it in iterations)
    shown = min(iterations, key=lambda it: abs(it["iteration_s"] - median_s))
    pred = predicted(plan)
    data = {
        "plan": {
            "layout": plan.layout(),
            "schedule": plan.schedule,
            "num_micro_batches": plan.num_micro_batches,
            "estimate_iteration_s": plan.estimate.iteration_s,
        },
        "measured_median_iteration_s": median_s,
        "shown_step": shown["step"],
        "measured": iterations,
        "predicted": pred,
        "predicted_error": (pred["iteration_s"] - median_s) / median_s if pred and median_s else None,
    }
    # the same file is a Chrome trace (Perfetto, chrome://tracing read traceEvents, ignore the rest)
    data.update(chrome_trace(shown, pred))
    run_dir = Path(run_dir)
    json_path, svg_path = run_dir / "timeline.json", run_dir / "timeline.svg"
    json_path.write_text(json.dumps(data, indent=1))
    svg_path.write_text(render_svg(plan, shown, pred))
    return json_path, svg_path


# ---- the Chrome trace --------------------------------------------------------------------------
STREAMS = {"forward": 0, "backward": 0, "input": 0, "weight": 0, "send": 1, "wait": 2, "allreduce": 3}
STREAM_NAMES = {0: "compute", 1: "send", 2: "receive (waiting)", 3: "gradient all-reduce"}
ESTIMATE_PID = 10_000  # the estimate's processes: rank r is ESTIMATE_PID + r, listed after the measured ones


def chrome_trace(measured: dict, pred: dict | None) -> dict:
    """traceEvents: one process per rank (measured: pid = rank; the simulator's estimate beside it:
    pid = ESTIMATE_PID + rank), one thread per stream (compute, send, receive, all-reduce); one
    complete event ("X") per action, in microseconds."""
    events: list[dict] = []

    def add(ranks: list[dict], base: int, what: str, order: int) -> None:
        for r in ranks:
            pid = base + r["rank"]
            name = f"rank {r['rank']} (stage {r['stage']}, replica {r['replica']}) {what}"
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            events.append(
                {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": pid,
                    "tid": 0,
                    "args": {"sort_index": order * ESTIMATE_PID + r["rank"]},
                }
            )
            for tid, stream in STREAM_NAMES.items():
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
            for ev in r["events"]:
                events.append(
                    {
                        "ph": "X",
                        "name": ev["label"],
                        "cat": ev["kind"],
                        "pid": pid,
                        "tid": STREAMS.get(ev["kind"], 0),
                        "ts": ev["start"] * 1e6,
                        "dur": max(ev["end"] - ev["start"], 0.0) * 1e6,
                    }
                )

    add(measured["ranks"], 0, f"measured (step {measured['step']})", 0)
    if pred:
        add(pred["ranks"], ESTIMATE_PID, "estimated", 1)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


# ---- the picture -----------------------------------------------------------------------------
ROW, GAP, LEFT, WIDTH, TOP = 22, 4, 190, 900, 64


def _ticks(span: float) -> tuple[float, str]:
    for step in (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50):
        if span / step <= 10:
            return step, ("ms" if step < 1 else "s")
    return 100.0, "s"


def _panel(out: list[str], title: str, ranks: list[dict], y0: float, scale: float, width: float) -> float:
    out.append(f'<text x="{LEFT}" y="{y0 - 8}" class="panel">{title}</text>')
    for i, r in enumerate(ranks):
        y = y0 + i * (ROW + GAP)
        shade = "#F7F7F7" if r["stage"] % 2 == 0 else "#FFFFFF"
        out.append(f'<rect x="{LEFT}" y="{y}" width="{width:.0f}" height="{ROW}" fill="{shade}"/>')
        stages = r.get("stages") or [r["stage"]]
        where = f"stage {stages[0]}" if len(stages) == 1 else f"stages {','.join(map(str, stages))}"
        out.append(
            f'<text x="{LEFT - 8}" y="{y + ROW * 0.7}" class="row">rank {r["rank"]} · {where}'
            f".{r['replica']} · dev {r['device']}</text>"
        )
        for ev in sorted(r["events"], key=lambda e: e["kind"] == "allreduce"):
            x, w = LEFT + ev["start"] * scale, max((ev["end"] - ev["start"]) * scale, 0.6)
            inset = 5 if ev["kind"] in ("send", "wait", "allreduce") else 1
            tip = f"{ev['label']}: {ev['start'] * 1e3:.2f}–{ev['end'] * 1e3:.2f} ms"
            # a rank's later chunks (stages) lighter, so a V or an interleaving reads at a glance
            shade = 1.0 - 0.35 * min(ev.get("chunk", 0), 2)
            out.append(
                f'<rect x="{x:.2f}" y="{y + inset}" width="{w:.2f}" height="{ROW - 2 * inset}" rx="2" '
                f'fill="{COLOURS[ev["kind"]]}" fill-opacity="{shade:g}"><title>{tip}</title></rect>'
            )
            text = ev["label"].split("·")[0][1:]  # the micro-batch (and slice) number; the stage is in the tip
            if ev["kind"] in ("forward", "backward", "input", "weight") and w > 6 + 6 * len(text):
                out.append(f'<text x="{x + w / 2:.2f}" y="{y + ROW * 0.7}" class="mb">{text}</text>')
    return y0 + len(ranks) * (ROW + GAP)


def render_svg(plan: Plan, measured: dict, pred: dict | None) -> str:
    span = max(measured["iteration_s"], pred["iteration_s"] if pred else 0.0) or 1e-3
    # wide enough that a two-digit micro-batch number fits the average compute box of the busiest row
    # (16 micro-batches of ZB-V are 96 boxes a rank): a wide picture scrolls, a cramped one says nothing
    busiest = max(
        sum(1 for e in r["events"] if e["kind"] in ("forward", "backward", "input", "weight"))
        for it in (measured, pred)
        if it
        for r in it["ranks"]
    )
    width = max(WIDTH, 20 * busiest)
    scale = width / span
    out = [
        "<style>.title{font-size:15px;font-weight:bold}.panel{font-size:13px;font-weight:bold}"
        ".row{font-size:11px;text-anchor:end}.mb{font-size:10px;fill:white;text-anchor:middle}"
        ".tick{font-size:10px;fill:#555;text-anchor:middle}.legend{font-size:11px}</style>",
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="12" y="24" class="title">{plan.model} · {plan.num_stages} stages {plan.layout()} · '
        f"{plan.schedule} · {plan.num_micro_batches} micro-batches of {plan.micro_batch_size}</text>",
    ]
    err = f" ({(pred['iteration_s'] - measured['iteration_s']) / measured['iteration_s']:+.1%})" if pred else ""
    out.append(
        f'<text x="12" y="44" class="legend">measured iteration (step {measured["step"]}): '
        f"{measured['iteration_s'] * 1e3:.1f} ms"
        + (f" · predicted: {pred['iteration_s'] * 1e3:.1f} ms{err}" if pred else "")
        + "</text>"
    )
    y = _panel(out, "measured", measured["ranks"], TOP + 20, scale, width)
    if pred:
        y = _panel(out, "predicted (simulator, the plan's per-stage costs)", pred["ranks"], y + 40, scale, width)
    step, unit = _ticks(span)
    k = 0
    while k * step <= span * 1.0001:
        x = LEFT + k * step * scale
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{y}" stroke="#CCC" stroke-dasharray="2,3"/>')
        value = k * step * (1e3 if unit == "ms" else 1)
        out.append(f'<text x="{x:.1f}" y="{y + 14}" class="tick">{value:g} {unit}</text>')
        k += 1
    lx = LEFT
    for kind, text in LEGEND:
        out.append(f'<rect x="{lx}" y="{y + 30}" width="12" height="12" fill="{COLOURS[kind]}"/>')
        out.append(f'<text x="{lx + 16}" y="{y + 40}" class="legend">{text}</text>')
        lx += 24 + 7 * len(text)
    note = "numbers in the boxes: micro-batch (.slice); hover for times" + (
        "; a lighter shade is the rank's later stage (chunk), named in the hover text" if plan.chunks > 1 else ""
    )
    out.append(f'<text x="{LEFT}" y="{y + 60}" class="legend">{note}</text>')
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + width + 30:.0f}" height="{y + 76:.0f}" '
        f'font-family="Helvetica, Arial, sans-serif">'
    )
    return "\n".join([head, *out, "</svg>"])
