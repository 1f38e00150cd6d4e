"""Turning a costed candidate into the Plan contract, and building a Plan from a fixed layout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .cost import Costed
from .plan import Estimate, Plan, RunnerUp, StagePlan
from .score import simulate_costed
from .terapipe import stage_shares


def to_plan(
    c: Costed,
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    planner: str,
    runners_up: Sequence[Costed] = (),
    data_parallel_s: float | None = None,
    proof: dict | None = None,
) -> Plan:
    sim = simulate_costed(c)
    sets = c.recompute or ((),) * len(c.layout)
    copies = c.extra.get("copies", (1,) * len(c.layout))
    stages = tuple(
        StagePlan(
            (s.start, s.stop),
            tuple(profile.layers[i].name for i in range(s.start, s.stop)),
            s.replicas,
            s.devices,
            tuple(marks),
            k,
        )
        for s, marks, k in zip(c.layout, sets, copies)
    )
    return Plan(
        model=profile.name,
        cluster=topology.name,
        global_batch_size=global_batch,
        micro_batch_size=c.micro_batch_size,
        num_micro_batches=c.num_micro_batches,
        schedule=c.schedule,
        stages=stages,
        estimate=Estimate(
            iteration_s=c.iteration_s,
            samples_per_s=global_batch / c.iteration_s,
            peak_memory_bytes=tuple(c.memory_bytes),
            speedup_over_data_parallel=(data_parallel_s / c.iteration_s) if data_parallel_s else None,
            simulated_iteration_s=sim.iteration_s,
            stage_costs=tuple(asdict(sc) for sc in c.costs),
            slice_shares=_slice_shares(c),
        ),
        device_memory_bytes=topology.device_memory_bytes,
        runners_up=tuple(
            RunnerUp(r.summary(), r.iteration_s, r.peak_memory_bytes, r.extra.get("note", "")) for r in runners_up
        ),
        planner=planner,
        devices_per_node=topology.devices_per_node,
        warmup=c.warmup,
        token_slices=tuple(c.extra.get("token_slices", ())),
        chunks=c.extra.get("chunks", 1),
        proof=proof,
    )


def _slice_shares(c: Costed) -> tuple[dict, ...]:
    if c.schedule != "terapipe":
        return ()
    return tuple(stage_shares(c.extra["profile"], c.extra["topology"], c.layout, c.costs, c.micro_batch_size))
