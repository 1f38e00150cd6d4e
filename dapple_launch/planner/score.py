"""The one score: a candidate (Costed) of any family run through the simulator of the schedule it
would execute — per-stage orders (GPipe, 1F1B, ZB-H1, token slices) or rank orders (device groups
holding several stages, round-robin copies). Time and per-device memory come from here and nowhere
else; the bounds (bounds.py, warmup.py) are proven at or below it."""

from __future__ import annotations

from functools import lru_cache

from ..schedule import Simulation, build_schedule, simulate
from ..schedule.simulate import program
from .chunked import simulate_chunked
from .cost import Costed
from .round_robin import simulate_rr
from .terapipe import stage_scales


@lru_cache(maxsize=32)
def _program(schedule: str, num_stages: int, num_micro_batches: int, warmup: tuple[int, ...]):
    """A shape's schedule and its validated program: shared by every plan of that shape (a frontier's
    points and a plan's runners-up share shapes; validating 16 stages × 128 micro-batches takes a second)."""
    sched = build_schedule(schedule, num_stages, num_micro_batches, warmup)
    return sched, program(sched, validated=True)  # a shipped generator's lists (validated when a plan is read)


def simulate_costed(c: Costed, record: bool = False) -> Simulation:
    """Run the discrete-event simulator on the schedule this candidate would execute (`record`: with
    its timeline, which a plan's check of its estimate does not need)."""
    if "copies" in c.extra:  # stages of round-robin copies: the rank orders' simulator
        sim = simulate_rr(c, record)
        assert sim is not None  # (no cutoff: always simulated)
        return sim
    if "chunks" in c.extra:  # device groups holding several stages: the rank orders' simulator
        sim = simulate_chunked(c, record)
        assert sim is not None
        return sim
    if c.schedule == "terapipe":  # its per-slice costs: planner/terapipe.py
        lengths = c.extra["token_slices"]
        sched = build_schedule("terapipe", len(c.layout), c.num_micro_batches, token_slices=lengths)
        return simulate(
            sched,
            c.costs,
            record,
            steps=program(sched, validated=True),
            scale=stage_scales(
                c.extra["profile"],
                c.extra["topology"],
                c.layout,
                c.costs,
                c.micro_batch_size,
                lengths,
                c.num_micro_batches,
            ),
        )
    sched, steps = _program(c.schedule, len(c.layout), c.num_micro_batches, tuple(c.warmup))
    return simulate(sched, c.costs, record, steps=steps)
