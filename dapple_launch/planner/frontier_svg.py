"""pareto.svg: the frontier drawn as iteration time against peak memory per device, one curve per
device count, the card's usable memory (and the budget) as vertical lines, the chosen plan ringed;
each point's hover text (<title>) names its layout. Plain SVG text: no plotting library."""

from __future__ import annotations

from html import escape

from .explain import human_bytes, human_seconds, recomputed_per_stage
from .frontier import Frontier, device_seconds_per_sample

W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 460, 80, 170, 30, 60
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo + (hi - lo) * k / (count - 1) for k in range(count)]


def frontier_svg(f: Frontier) -> str:
    pts = list(f.points)
    mems = [max(p.estimate.peak_memory_bytes) for p in pts]
    times = [p.estimate.iteration_s for p in pts]
    xs = mems + [f.usable_bytes] + ([f.budget_bytes] if f.budget_bytes else [])
    x_lo, x_hi = 0.0, max(xs) * 1.05
    y_lo, y_hi = 0.0, max(times) * 1.1 if times else 1.0

    def x(v: float) -> float:
        return LEFT + (v - x_lo) / (x_hi - x_lo) * (W - LEFT - RIGHT)

    def y(v: float) -> float:
        return H - BOTTOM - (v - y_lo) / (y_hi - y_lo) * (H - TOP - BOTTOM)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{LEFT}" y="18" font-size="13">plans: iteration time against peak memory per device '
        f"(lower left is better)</text>",
        f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" stroke="black"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" stroke="black"/>',
    ]
    for v in _ticks(x_lo, x_hi):
        out.append(f'<text x="{x(v):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{escape(human_bytes(v))}</text>')
    for v in _ticks(y_lo, y_hi):
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{escape(human_seconds(v))}</text>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 18}" text-anchor="middle">peak memory per device</text>')
    out.append(
        f'<text x="16" y="{(TOP + H - BOTTOM) / 2}" transform="rotate(-90 16 {(TOP + H - BOTTOM) / 2})" '
        f'text-anchor="middle">iteration time</text>'
    )
    for v, label, dash in [(f.usable_bytes, "device memory (usable)", "6,3")] + (
        [(f.budget_bytes, "memory budget", "2,3")] if f.budget_bytes else []
    ):
        out.append(
            f'<line x1="{x(v):.1f}" y1="{TOP}" x2="{x(v):.1f}" y2="{H - BOTTOM}" stroke="#555" '
            f'stroke-dasharray="{dash}"><title>{escape(label)}: {escape(human_bytes(v))}</title></line>'
        )
        out.append(f'<text x="{x(v) - 4:.1f}" y="{TOP + 10}" text-anchor="end" fill="#555">{escape(label)}</text>')
    counts = sorted({p.world_size for p in pts})
    for j, n in enumerate(counts):
        colour = COLOURS[j % len(COLOURS)]
        mine = sorted((k for k, p in enumerate(pts) if p.world_size == n), key=lambda k: mems[k])
        path = " ".join(f"{x(mems[k]):.1f},{y(times[k]):.1f}" for k in mine)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for k in mine:
            p = pts[k]
            rec = recomputed_per_stage(p)
            hover = (
                f"#{k}: {p.num_stages} stages {p.layout()}, {p.num_micro_batches}×{p.micro_batch_size}, "
                f"{p.schedule}{'' if rec == 'none' else ', recomputed layers per stage: ' + rec}; "
                f"{human_seconds(times[k])}, {human_bytes(mems[k])} per device, {n} devices, "
                f"{device_seconds_per_sample(p):.4g} device·s/sample"
            )
            out.append(
                f'<circle cx="{x(mems[k]):.1f}" cy="{y(times[k]):.1f}" r="4" fill="{colour}">'
                f"<title>{escape(hover)}</title></circle>"
            )
        out.append(f'<rect x="{W - RIGHT + 14}" y="{TOP + 14 * j}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{W - RIGHT + 28}" y="{TOP + 14 * j + 9}">{n} device{"s" if n > 1 else ""}</text>')
    if f.chosen is not None:
        k = f.chosen
        out.append(
            f'<circle cx="{x(mems[k]):.1f}" cy="{y(times[k]):.1f}" r="9" fill="none" stroke="black" '
            f'stroke-width="2"><title>chosen: #{k}</title></circle>'
        )
        out.append(f'<text x="{x(mems[k]) + 11:.1f}" y="{y(times[k]) - 8:.1f}">chosen #{k}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
