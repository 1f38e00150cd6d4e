"""Baselines a torchtitan user would configure by hand for each schedule torch.distributed.pipelining
ships: a pipeline degree P dividing the devices, D / P data-parallel replicas of every stage on
contiguous devices (torchtitan's mesh puts "pp" outermost), the model's layers split evenly *by
count* into P·v stages (v stages per rank for the interleaved schedules, two for ZB-V), and a
micro-batch count. Each is the best such hand configuration (over P, v and the micro-batch size)
under the same cost model as the planner, so the planner's speed-up over it is what choosing the
schedule with an uneven layout buys. Planned only by the benchmarks: sweeping every configuration
costs more than the planner's one-second budget allows.
"""

from __future__ import annotations

from dataclasses import replace

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .baselines import even_stops, even_uniform, fastest
from .chunked import chunked_layout, evaluate_chunked
from .cost import Costed
from .group_shapes import runs_micro_batches
from .limits import Limits
from .shapes import divisors

INTERLEAVED_CHUNKS = (2, 3, 4)  # stages per rank a user of the interleaved schedules would try


def torch_1f1b(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits) -> Costed | None:
    """Schedule1F1B: one stage per rank."""
    L, D = profile.num_layers, topology.num_devices
    layouts = [(even_uniform(L, D, P), P) for P in divisors(D) if 2 <= P <= L]
    return fastest(profile, topology, layouts, global_batch, replace(limits, schedule="1f1b", recompute="none"))


def _chunked(family: str, chunk_choices: tuple[int, ...]):
    def plan(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits) -> Costed | None:
        L, D = profile.num_layers, topology.num_devices
        best = None
        for P in divisors(D):
            for v in chunk_choices:
                if P < 2 or P * v > L:
                    continue
                r = D // P
                layout = chunked_layout(family, [r] * P, even_stops(L, P * v), None)
                for b in divisors(global_batch):
                    M = global_batch // b
                    # (interleaved: micro-batches in groups of the P ranks, as torch's Interleaved1F1B
                    # with its default group size; ZB-V: any count)
                    if not runs_micro_batches(family, (r,) * P, b, M):
                        continue
                    c = evaluate_chunked(
                        profile,
                        topology,
                        layout,
                        b,
                        M,
                        replace(limits, schedule=family, chunks=v, recompute="none"),
                        family,
                        v,
                    )
                    if c is not None and c.fits and (best is None or c.iteration_s < best.iteration_s * (1 - 1e-12)):
                        best = c
        return best

    plan.__doc__ = f"{family}: the best even-by-count uniform configuration."
    return plan


TORCH_STYLE = {
    "torch 1F1B": torch_1f1b,
    "torch interleaved 1F1B": _chunked("interleaved_1f1b", INTERLEAVED_CHUNKS),
    "torch interleaved ZB": _chunked("interleaved_zb", INTERLEAVED_CHUNKS),
    "torch ZB-V": _chunked("zbv", (2,)),
}


def torch_style_baselines(
    profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits
) -> dict[str, Costed | None]:
    return {name: fn(profile, topology, global_batch, limits) for name, fn in TORCH_STYLE.items()}
