"""A Plan from a stated layout (strategy=fixed): the user's cuts, replicas, devices and micro-batches,
checked by the rules the planner keeps and costed by the same score."""

from __future__ import annotations

from dataclasses import replace

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import build_schedule, validate
from ..schedule.round_robin import RR_FAMILIES
from .baselines import balanced_boundaries, data_parallel
from .build import to_plan
from .chunked import (
    CHUNKED,
    check_chunked,
    chunked_layout,
    chunks_of,
    evaluate_chunked,
    group_of,
    group_replicas,
)
from .cost import StageSpec, evaluate
from .explain import human_bytes
from .limits import Limits
from .plan import Plan
from .round_robin import RR, canonical_copies, check_copies, evaluate_rr
from .shapes import MIN_MICRO_BATCHES


def check_micro_batches(schedule: str, num_stages: int, num_micro_batches: int) -> None:
    if schedule not in MIN_MICRO_BATCHES:
        raise ValueError(f"unknown schedule {schedule!r}; valid schedules: {sorted(MIN_MICRO_BATCHES)}")
    least = MIN_MICRO_BATCHES[schedule](num_stages)
    if num_micro_batches < least:
        raise ValueError(
            f"schedule {schedule} with {num_stages} stages needs at least {least} micro-batches to fill the "
            f"pipeline, got strategy.num_micro_batches={num_micro_batches}; set strategy.num_micro_batches>={least}"
            + (" or use strategy.schedule=gpipe" if schedule == "1f1b" else "")
        )


def stated_cuts(boundaries: list[int], num_stages: int, num_layers: int) -> list[int]:
    """strategy.boundaries, sorted, or a ValueError naming the rule."""
    cuts = sorted(boundaries)
    if len(cuts) != num_stages - 1 or cuts[0] <= 0 or cuts[-1] >= num_layers or len(set(cuts)) != len(cuts):
        raise ValueError(
            f"strategy.boundaries={boundaries} must be {num_stages - 1} distinct cut positions "
            f"strictly between 0 and {num_layers} (the model's layer count)"
        )
    return cuts


def fixed_plan(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    num_stages: int,
    replicas: list[int],
    num_micro_batches: int,
    limits: Limits,
    boundaries: list[int] | None = None,
    devices: list[list[int]] | None = None,
    warmup_depth: int = 1,
) -> Plan:
    """Build and validate a Plan from a stated layout, through the checks the planner uses."""
    L, D = profile.num_layers, topology.num_devices
    if limits.schedule in CHUNKED:  # device groups holding several stages
        return fixed_chunked_plan(
            profile, topology, global_batch, num_stages, replicas, num_micro_batches, limits, boundaries, devices
        )
    if num_stages < 1:
        raise ValueError(f"strategy.stages must be >= 1, got {num_stages}")
    if num_stages > L:
        raise ValueError(
            f"strategy.stages={num_stages} but model {profile.name} has only {L} layers; use at most {L} stages"
        )
    if len(replicas) == 1:
        replicas = replicas * num_stages
    if len(replicas) != num_stages or min(replicas) < 1:
        raise ValueError(
            f"strategy.replicas={replicas} must give one count >= 1 per stage ({num_stages} stages), "
            f"or one count for all"
        )
    world = sum(replicas)
    if world != D:
        raise ValueError(
            f"the layout {num_stages} stage(s) with replicas {':'.join(map(str, replicas))} uses {world} devices but "
            f"cluster {topology.name} has {D} ({topology.nodes} node(s) × {topology.devices_per_node}); every device "
            f"must hold a replica: change strategy.replicas or cluster.devices_per_node/cluster.nodes so they match"
        )
    if boundaries:
        cuts = stated_cuts(boundaries, num_stages, L)
    else:
        cuts = balanced_boundaries(profile, num_stages, replicas)
    if global_batch % num_micro_batches:
        lo = global_batch // num_micro_batches * num_micro_batches
        raise ValueError(
            f"global_batch_size={global_batch} is not divisible by strategy.num_micro_batches={num_micro_batches}; "
            f"pick a divisor of {global_batch} or set global_batch_size={lo or num_micro_batches}"
        )
    b = global_batch // num_micro_batches
    rr = limits.schedule in RR
    copies = (
        tuple(limits.copies)
        if rr and limits.copies
        else tuple(canonical_copies(r, b) for r in replicas)
        if rr
        else (1,) * num_stages
    )
    if rr and len(copies) == 1:
        copies = copies * num_stages
    if limits.copies and not rr:
        raise ValueError(
            f"strategy.copies={list(limits.copies)} is a setting of schedules {list(RR)} (stages of "
            f"round-robin copies); schedule {limits.schedule} splits every micro-batch across a stage's "
            f"replicas: drop strategy.copies or use strategy.schedule=1f1b_rr"
        )
    if rr:  # (the copies' own rules first: they set how many samples a micro-batch must have)
        why = check_copies(tuple(StageSpec(0, 0, tuple(range(r))) for r in replicas), copies, num_micro_batches)
        if why:
            raise ValueError(why)
    widest = max(r // c for r, c in zip(replicas, copies))
    if b < widest:
        raise ValueError(
            f"a micro-batch of {b} samples (global_batch_size {global_batch} / {num_micro_batches} micro-batches) "
            f"cannot be split across {widest} replicas; need micro_batch_size >= {widest}: lower "
            f"strategy.num_micro_batches to <= {global_batch // widest} or raise global_batch_size"
            + (" (or use more copies: strategy.copies)" if rr else "")
        )
    check_micro_batches("terapipe" if limits.token_slices else limits.schedule, num_stages, num_micro_batches)
    if devices:
        if [len(d) for d in devices] != replicas:
            raise ValueError(f"strategy.devices={devices} must list {replicas} devices per stage")
        flat = [d for ds in devices for d in ds]
        if len(set(flat)) != len(flat) or min(flat) < 0 or max(flat) >= D:
            raise ValueError(
                f"strategy.devices={devices}: each of the cluster's devices 0..{D - 1} may hold "
                f"one replica of one stage"
            )
    else:
        it = iter(range(D))
        devices = [[next(it) for _ in range(r)] for r in replicas]
    starts, stops = [0, *cuts], [*cuts, L]
    layout = tuple(StageSpec(a, z, tuple(ds)) for a, z, ds in zip(starts, stops, devices))
    if warmup_depth < 1 or (warmup_depth > 1 and limits.schedule not in ("1f1b", "zb_h1", *RR)):
        raise ValueError(
            f"strategy.warmup_depth={warmup_depth}: must be >= 1 (1 = the minimal warm-up, k = k times "
            f"as many micro-batches in flight per stage), and deeper than 1 only with strategy.schedule=1f1b "
            f"or zb_h1"
        )
    if rr:  # stages of round-robin copies: the simulator of their rank orders
        c = evaluate_rr(profile, topology, layout, copies, b, num_micro_batches, limits, limits.schedule, warmup_depth)
    elif limits.token_slices:  # TeraPipe on the stated layout, with the stated slices
        from .terapipe import evaluate_sliced

        c = evaluate_sliced(profile, topology, layout, b, num_micro_batches, limits.token_slices, limits)
    else:
        c = evaluate(profile, topology, layout, b, num_micro_batches, limits, warmup_depth=warmup_depth)
        if limits.auto_token_slices and limits.seq_len and profile.slices_tokens:
            from .terapipe import best_slicing

            sliced = best_slicing(profile, topology, layout, b, num_micro_batches, limits.seq_len, limits)
            if sliced is not None and len(sliced.extra["token_slices"]) > 1 and sliced.iteration_s < c.iteration_s:
                c = sliced
    assert c is not None  # (costed without a cutoff: always simulated)
    if rr:
        from ..schedule import validate_ranks
        from ..schedule.round_robin import round_robin

        validate_ranks(round_robin(c.schedule, copies, num_micro_batches, c.warmup))
    else:
        validate(build_schedule(c.schedule, num_stages, num_micro_batches, c.warmup, c.extra.get("token_slices", ())))
    if not c.fits:
        worst = max(range(num_stages), key=lambda s: c.memory_bytes[s])
        raise ValueError(
            f"the fixed layout does not fit device memory: stage {worst} needs {human_bytes(c.memory_bytes[worst])} "
            f"per device but {human_bytes(c.capacity_bytes)} is usable ({human_bytes(topology.device_memory_bytes)} "
            f"less {limits.memory_headroom:.0%} headroom); use more stages, more micro-batches (smaller ones), or "
            f"strategy=auto"
        )
    # the baseline on its own layout: a per-stage recomputation list means nothing there
    base = replace(limits, schedule=RR_FAMILIES[limits.schedule], copies=()) if rr else limits  # (its stage order)
    dp = data_parallel(
        profile, topology, global_batch, replace(base, recompute="auto") if base.recompute == "selective" else base
    )
    return to_plan(c, profile, topology, global_batch, "fixed", data_parallel_s=dp.iteration_s if dp else None)


def fixed_chunked_plan(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    num_stages: int,
    replicas: list[int],
    num_micro_batches: int,
    limits: Limits,
    boundaries: list[int] | None = None,
    devices: list[list[int]] | None = None,
):
    """build.fixed_plan for interleaved_1f1b, zbv and chimera: `num_stages` stages (the model's chunks),
    `replicas` per device group (or per stage, equal within a group), `devices` per group."""
    schedule, L, D = limits.schedule, profile.num_layers, topology.num_devices
    v = chunks_of(schedule, limits.chunks)
    if num_stages > L:
        raise ValueError(
            f"strategy.stages={num_stages} but model {profile.name} has only {L} layers; use at most "
            f"{L if schedule == 'chimera' else L // v * v} stages"
        )
    check_chunked(schedule, num_stages, limits.chunks, num_micro_batches)
    if limits.token_slices:
        raise ValueError(
            f"schedule {schedule} runs without token slices; use strategy.schedule=1f1b or gpipe with "
            f"strategy.token_slices"
        )
    groups = group_replicas(schedule, num_stages, v, list(replicas))
    P = len(groups)
    if sum(groups) != D:
        raise ValueError(
            f"the layout's {P} device groups with replicas {':'.join(map(str, groups))} use {sum(groups)} "
            f"devices but cluster {topology.name} has {D}; every device must hold a replica: change "
            f"strategy.replicas (one count per device group) or the cluster"
        )
    if global_batch % num_micro_batches:
        raise ValueError(
            f"global_batch_size={global_batch} is not divisible by strategy.num_micro_batches="
            f"{num_micro_batches}; pick a divisor of {global_batch}"
        )
    b = global_batch // num_micro_batches
    if b < max(groups):
        raise ValueError(
            f"a micro-batch of {b} samples cannot be split across {max(groups)} replicas; lower "
            f"strategy.num_micro_batches to <= {global_batch // max(groups)}"
        )
    if boundaries:
        cuts = stated_cuts(boundaries, num_stages, L)
    else:
        cuts = balanced_boundaries(profile, num_stages, [groups[group_of(schedule, s, P)] for s in range(num_stages)])
    if devices:
        flat = [d for ds in devices for d in ds]
        if [len(d) for d in devices] != groups or len(set(flat)) != len(flat) or min(flat) < 0 or max(flat) >= D:
            raise ValueError(
                f"strategy.devices={devices} must list {groups} distinct devices of 0..{D - 1}, one "
                f"list per device group"
            )
    layout = chunked_layout(schedule, groups, [*cuts, L], devices)
    c = evaluate_chunked(profile, topology, layout, b, num_micro_batches, limits, schedule, v)
    assert c is not None  # (no cutoff: always simulated)
    if not c.fits:
        worst = max(range(num_stages), key=lambda s: c.memory_bytes[s])
        raise ValueError(
            f"the fixed layout does not fit device memory: device group {group_of(schedule, worst, P)} needs "
            f"{human_bytes(c.memory_bytes[worst])} per device but {human_bytes(c.capacity_bytes)} is usable; use more "
            f"stages, smaller micro-batches, or strategy=auto"
        )
    dp = data_parallel(profile, topology, global_batch, replace(limits, schedule="1f1b", chunks=1))
    return to_plan(c, profile, topology, global_batch, "fixed", data_parallel_s=dp.iteration_s if dp else None)
