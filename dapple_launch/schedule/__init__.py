"""Schedules as per-stage action lists, their validator and their simulator."""

from __future__ import annotations

from .actions import Action, Kind, Schedule
from .gpipe import forward_only, gpipe
from .one_f_one_b import one_f_one_b
from .terapipe import terapipe
from .zero_bubble import zb_h1

SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe, "zb_h1": zb_h1}
WARMUP_SCHEDULES = ("1f1b", "zb_h1")  # those whose warm-up may be deeper than the minimum


def build_schedule(
    name: str, num_stages: int, num_micro_batches: int, warmup: tuple[int, ...] = (), token_slices: tuple[int, ...] = ()
) -> Schedule:
    """`warmup` (1F1B and ZB-H1): forwards each stage runs before its first backward; () = the minimum.
    `token_slices` (terapipe): the slice lengths of each sequence; num_micro_batches counts sequences."""
    if name == "terapipe":
        if not token_slices or warmup:
            raise ValueError("schedule terapipe needs token_slices (the slice lengths) and takes no warm-up")
        return terapipe(num_stages, num_micro_batches, tuple(token_slices))
    if token_slices:
        raise ValueError(f"token slices run under schedule terapipe, not {name!r}")
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; valid schedules: {sorted(SCHEDULES)}")
    if warmup:
        if name not in WARMUP_SCHEDULES:
            raise ValueError(
                f"a warm-up depth is a setting of {sorted(WARMUP_SCHEDULES)}; schedule {name!r} takes none"
            )
        return SCHEDULES[name](num_stages, num_micro_batches, tuple(warmup))
    return SCHEDULES[name](num_stages, num_micro_batches)


__all__ = [
    "Action",
    "Kind",
    "Schedule",
    "SCHEDULES",
    "build_schedule",
    "forward_only",
    "gpipe",
    "one_f_one_b",
    "terapipe",
    "zb_h1",
]

from .simulate import Simulation, StageCosts, simulate  # noqa: E402
from .validate import ScheduleError  # noqa: E402
from .validate import validate as validate_stages  # noqa: E402

__all__ += ["Simulation", "StageCosts", "simulate", "ScheduleError", "validate"]

# ranks holding several stages (chunks): one order per rank, steps naming their stage
from .chimera import chimera  # noqa: E402
from .interleaved import interleaved_1f1b  # noqa: E402
from .rank_simulate import busiest_rank_s, simulate_ranks  # noqa: E402
from .rank_validate import validate_ranks  # noqa: E402
from .ranks import RankSchedule, Step, from_stages  # noqa: E402
from .zbv import zbv  # noqa: E402


def validate(schedule: Schedule | RankSchedule) -> None:
    """Raise ScheduleError (the grid, the failing step marked) if `schedule` cannot run to the end: a
    per-stage Schedule by validate.validate, a RankSchedule (ranks holding several stages) by
    rank_validate.validate_ranks."""
    if isinstance(schedule, RankSchedule):
        validate_ranks(schedule)
    else:
        validate_stages(schedule)


def build_rank_schedule(name: str, num_groups: int, num_micro_batches: int, chunks: int = 1):
    """A RankSchedule for any family: interleaved_1f1b and interleaved_zb (`chunks` per group), zbv, chimera, or a
    stage-per-group one (GPipe, 1F1B, ZB-H1) lifted to rank orders."""
    if name == "interleaved_1f1b":
        return interleaved_1f1b(num_groups, num_micro_batches, chunks)
    if name == "interleaved_zb":  # interleaved 1F1B's F and I order at one warm-up forward per hop (torch's ZB1P),
        from .weights_fill import fill_with_weights  # W's filling its waits

        return fill_with_weights(
            interleaved_1f1b(num_groups, num_micro_batches, chunks, hop_warmup=1), "interleaved_zb"
        )
    if name == "zbv":
        return zbv(num_groups, num_micro_batches)
    if name == "chimera":
        return chimera(num_groups, num_micro_batches)
    return from_stages(build_schedule(name, num_groups, num_micro_batches))


CHUNKED_SCHEDULES = ("interleaved_1f1b", "interleaved_zb", "zbv", "chimera")  # several stages per device group
# run by rank orders (runtime/rank_executor.py): the chunked families and stages of round-robin copies
RANK_ORDER_SCHEDULES = CHUNKED_SCHEDULES + ("1f1b_rr", "zb_h1_rr")
SPLIT_BACKWARD = ("zb_h1", "interleaved_zb", "zbv", "zb_h1_rr")  # the backward split into I and W (no recomputation)


def num_groups(name: str, num_stages: int, chunks: int) -> int:
    """Device groups (orders) a chunked schedule runs on: Chimera's D stages sit on D groups (two
    copies each), interleaved's v·P and ZB-V's 2P stages on P."""
    if name == "chimera":
        return num_stages
    return num_stages // (2 if name == "zbv" else chunks)


__all__ += [
    "CHUNKED_SCHEDULES",
    "RANK_ORDER_SCHEDULES",
    "num_groups",
    "RankSchedule",
    "Step",
    "build_rank_schedule",
    "chimera",
    "from_stages",
    "interleaved_1f1b",
    "simulate_ranks",
    "busiest_rank_s",
    "validate_ranks",
    "zbv",
]
