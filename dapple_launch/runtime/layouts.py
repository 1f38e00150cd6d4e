"""What crosses each stage boundary, known before the first step; and each rank's lowered program.

Layouts (per member: trailing shape, wire dtype, logical dtype) are learned once per boundary and
token-slice length, before the step that first needs them, by one forward of a single sample per
stage in stage order (torch.distributed.pipelining's shape inference, on real modules): the first
holder of stage s runs its layers, under no_grad, in eval mode and with the random state put back,
on the batch's first sample (stage 0) or on zeros of the previous boundary's layout, and broadcasts
what came out. Every rank decides the same way whether a pass is needed (the schedule and the batch
fix the keys), so the broadcasts line up. Inside the loop nothing is read on the host.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..data.rank_batch import rows_of
from ..models.contract import as_tuple, carry_map, run_layers
from ..models.token_slices import KVCache, TokenSlice, running
from ..schedule import validate
from ..schedule.nccl import check_lowered
from ..schedule.ranks import RankSchedule
from ..schedule.transfers import RankProgram, lower, rank_pairs
from .groups import communicators
from .heartbeat import BEAT


def output_layouts(ex, batch, inputs: dict, slice_lengths: tuple[int, ...]) -> dict:
    """variant -> the layout of what `ex`'s stage passes on: one sample through its layers, token
    slices in order (each sees the ones before it), from `batch` (first stage) or zeros of `inputs`
    (variant -> the previous boundary's layout)."""
    from ..schedule.terapipe import bounds

    tokens = bounds(slice_lengths) if slice_lengths else [None]
    modes = {m: m.training for layer in ex.layers for m in layer.modules()}
    device = ex.device
    out: dict = {}
    try:
        for layer in ex.layers:
            layer.eval()  # (dropout and batch statistics change no shape; running statistics stay as they were)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            cache = KVCache()
            for i, tok in enumerate(tokens):
                variant = None if tok is None else tok[1] - tok[0]
                if ex.is_first:
                    x = rows_of(batch).first_row()
                    if tok is not None:
                        lo, hi = tok
                        x = carry_map(lambda t: t[:, lo:hi], x)
                else:
                    x = tuple(
                        torch.zeros((1, *tail), dtype=logical, device=device) for tail, _, logical in inputs[variant]
                    )
                with ex.precision.autocast(), running(TokenSlice(i, *tok, cache) if tok else None):
                    members = as_tuple(run_layers(ex.layers, x))
                out.setdefault(
                    variant, tuple((tuple(t.shape[1:]), ex.precision.to_wire(t).dtype, t.dtype) for t in members)
                )
    finally:
        for m, training in modes.items():
            m.training = training
    return out


def ensure_layouts(comms, executors: dict, batch, slice_lengths: tuple[int, ...]) -> None:
    """Learn the layouts of every boundary for these slice lengths, if not known yet (all ranks)."""
    grid = comms.grid
    if len(slice_lengths) < 2:
        slice_lengths = ()  # one slice is the whole sequence: the executor runs it unsliced
    variants = sorted({b - a for a, b in _bounds(slice_lengths)}) if slice_lengths else [None]
    if all((b, v) in comms.layouts for b in range(grid.num_stages - 1) for v in variants):
        return
    BEAT.action("collective (layouts of what crosses stages)")
    for b in range(grid.num_stages - 1):
        src = grid.stage_ranks(b)[0]
        found: list = [None]
        if comms.rank == src:
            inputs = {v: comms.layouts[(b - 1, v)] for v in variants} if b > 0 else {}
            found = [output_layouts(executors[b], batch, inputs, slice_lengths)]
        dist.broadcast_object_list(found, src=src, device=comms.device if comms.device.type == "cuda" else None)
        for v, layout in found[0].items():
            comms.layouts[(b, v)] = layout


def _bounds(lengths):
    from ..schedule.terapipe import bounds

    return bounds(lengths)


def program(
    comms, x: RankSchedule, group_ranks: tuple[tuple[int, ...], ...], rows: tuple[int, ...], source=None
) -> RankProgram:
    """This rank's lowered program for schedule `x` over units of `rows` samples; on first sight the
    schedule it came from (`source`, else `x`) is validated, the whole run's programs are checked
    against the NCCL model and this rank's pair groups made. A schedule the validator refuses never
    runs: ranks handed different lists would otherwise match each other's transfers silently."""
    key = (id(x), group_ranks, rows)
    cache = comms.programs
    if key not in cache:
        validate(source if source is not None else x)  # raises ScheduleError with the grid, failing step marked
        programs = lower(x, group_ranks, rows)
        check_lowered(programs)  # proven before it runs: raises naming the ranks and transfers
        communicators().make_pairs(rank_pairs(programs))
        if len(cache) > 16:
            cache.clear()
        cache[key] = (x, programs[comms.rank])  # (x kept alive: its id stays its own)
    return cache[key][1]
