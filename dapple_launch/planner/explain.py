"""Plan.explain(): a two-line headline (layout, schedule, estimate, proven gap, the runner-up it beat),
the layout as a table with memory per stage, the runners-up; with `full`, how it was chosen."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} TiB"


def human_gap(fraction: float) -> str:
    """A proven gap as a percentage, with enough digits never to read as 0% when it is not."""
    return f"{fraction:.1%}" if fraction >= 0.001 else f"{fraction * 100:.2g}%"


def human_seconds(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.3f} s"


def _devices(devs: tuple[int, ...]) -> str:
    if len(devs) > 2 and list(devs) == list(range(devs[0], devs[0] + len(devs))):
        return f"{devs[0]}-{devs[-1]}"
    return ",".join(map(str, devs))


def _names(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} … {names[-1]}"


def recomputed_per_stage(plan) -> str:
    """A plan's recomputation in one word: "none", "full" (every layer of every stage), or each
    stage's count of recomputed layers ("1+2+0+1"): what the frontier's table and picture show."""
    counts = [len(s.recompute_layers) for s in plan.stages]
    if not any(counts):
        return "none"
    if all(n == s.layers[1] - s.layers[0] for n, s in zip(counts, plan.stages)):
        return "full"
    return "+".join(map(str, counts))


def _recomputed(stage) -> str:
    marks = stage.recompute_layers
    if not marks:
        return "none"
    if len(marks) == stage.layers[1] - stage.layers[0]:
        return "all (full)"
    return f"{len(marks)}: " + _spans(marks)


def _spans(marks) -> str:
    runs, out = [], []
    for i in sorted(marks):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    for a, z in runs:
        out.append(str(a) if a == z else f"{a}-{z}")
    return ",".join(out)


def _layout_words(plan) -> str:
    """The layout and schedule in a few words (with what is particular to the family)."""
    words = f"{plan.num_stages} stage(s) {plan.layout()}, {plan.schedule}"
    if plan.chunks > 1:
        words += f" ({plan.num_stages // plan.chunks} device groups × {plan.chunks} stages)"
    if any(s.copies > 1 for s in plan.stages):
        words += f" (copies {':'.join(str(s.copies) for s in plan.stages)})"
    if plan.warmup:
        words += f" (warm-ups {list(plan.warmup)})"
    if plan.token_slices:
        words += f", {len(plan.token_slices)} token slices"
    return words + f", {plan.num_micro_batches} micro-batches × {plan.micro_batch_size}"


def headline(plan) -> str:
    """Two lines: the layout, schedule and estimate; how good it is proven to be and the runner-up it beat."""
    e = plan.estimate
    first = (
        f"Plan for {plan.model} on {plan.cluster}: {_layout_words(plan)}; estimated {human_seconds(e.iteration_s)} "
        f"per iteration ({e.samples_per_s:.1f} samples/s)"
    )
    p = plan.proof
    families = f"{len(p['families'])} famil{'y' if len(p['families']) == 1 else 'ies'}" if p else ""
    if p and plan.token_slices:  # (the bounds cover the families searched, not token slices)
        proven = (
            f"faster than any plan of the {families} searched can be"
            if p["gap"] == 0
            else f"within {human_gap(p['gap'])} of the optimum of the {families} searched"
        )
        second = f"  {proven}; token slices are not bounded ({p['candidates']} candidates, {p['seconds']:.1f} s)"
    elif p:
        proven = (
            "optimal under the cost model"
            if p["gap"] == 0
            else f"within {human_gap(p['gap'])} of the optimum under the cost model"
        )
        second = f"  {proven} over {families} ({p['candidates']} candidates, {p['seconds']:.1f} s)"
    else:
        second = f"  {plan.planner.split(':')[0]} layout, not searched (strategy=auto plans one)"
    beaten = [r for r in plan.runners_up if r.iteration_s > e.iteration_s]
    if beaten:
        r = min(beaten, key=lambda r: r.iteration_s)
        second += f"; runner-up {r.summary} {r.iteration_s / e.iteration_s - 1:+.1%}"
    return first + "\n" + second


def explain(plan, full: bool = False) -> str:
    e = plan.estimate
    header = headline(plan) + (f"\nhow it was chosen: {plan.planner}" if full else "")
    rows = [
        ("stage", "layers", "names", "replicas", "devices", "memory/device")
        + (("recomputed",) if plan.recomputes else ())
    ]
    for i, (s, mem) in enumerate(zip(plan.stages, e.peak_memory_bytes)):
        rows.append(
            (
                str(i),
                f"{s.layers[0]}-{s.layers[1] - 1}",
                _names(s.layer_names),
                str(s.replicas),
                _devices(s.devices),
                human_bytes(mem),
            )
            + ((_recomputed(s),) if plan.recomputes else ())
        )
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = [header]
    for j, r in enumerate(rows):
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if j == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    est = f"estimated iteration {human_seconds(e.iteration_s)}, {e.samples_per_s:.1f} samples/s"
    if e.simulated_iteration_s is not None:
        est += f" (simulator: {human_seconds(e.simulated_iteration_s)})"
    if e.speedup_over_data_parallel is not None:
        est += f", {e.speedup_over_data_parallel:.2f}× data parallel"
    if plan.device_memory_bytes:
        est += f"; device memory {human_bytes(plan.device_memory_bytes)}"
    lines.append(est)
    if plan.runners_up:
        lines.append("runners-up:")
        for r in plan.runners_up:
            lines.append(
                f"  {r.summary:<40} {human_seconds(r.iteration_s):>11}  peak {human_bytes(r.peak_memory_bytes)}"
                + (f"  ({r.note})" if r.note else "")
            )
    return "\n".join(lines)
