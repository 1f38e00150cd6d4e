"""Which rows of a global batch a rank reads, from the plan alone (data/rank_batch.py loads them).

A stage cuts a global batch of n samples into its schedule's micro-batches and each micro-batch into
equal contiguous shares, one per replica (`share`, the executor's own arithmetic). The first stage
reads its shares of the inputs, the last its shares of the targets; a rank holding several stages
(interleaved, ZB-V, Chimera, round-robin copies) reads, per stage it holds, the micro-batches its own
order runs there. Known before the first step, so the loader reads nothing a rank does not use.
"""

from __future__ import annotations

from ..data.rank_batch import Reads
from ..schedule import Kind
from ..schedule.gpipe import forward_only
from ..schedule.ranks import RankSchedule, forward_only_orders
from .grid import group_ranks, split_bounds


def replica_rows(micro: tuple[int, int], replicas: int, replica: int) -> tuple[int, int]:
    """Rows [a, b) of the global batch that `replica` of a stage with `replicas` takes of the
    micro-batch holding rows `micro` (the executor slices with this too)."""
    a, b = split_bounds(micro[1] - micro[0], replicas)[replica]
    return micro[0] + a, micro[0] + b


def share(n_total: int, sequences: int, seq: int, replicas: int, replica: int) -> tuple[int, int]:
    """replica_rows of micro-batch `seq` of `sequences` over n_total samples."""
    return replica_rows(split_bounds(n_total, sequences)[seq], replicas, replica)


def eval_micro_batches(num_micro_batches: int, n_total: int, widest: int) -> int:
    """Micro-batches of an evaluation batch of n_total samples: the plan's, or fewer when the batch
    is too small for its widest stage to split each one."""
    return min(num_micro_batches, max(1, n_total // widest))


def eval_schedule(train_schedule, num_stages: int, micro: int):
    """The forward-only schedule evaluation runs (the strategy's and this module's one definition)."""
    if isinstance(train_schedule, RankSchedule):
        return forward_only_orders(train_schedule.placement, train_schedule.num_ranks, micro)
    return forward_only(num_stages, micro)


def rank_reads(grid, schedule, rank: int, n_total: int) -> Reads:
    """The rows `rank` reads of a batch of n_total samples under `schedule` (a stage-level Schedule,
    or a RankSchedule whose device groups hold several stages)."""
    last = grid.num_stages - 1
    parts: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    if isinstance(schedule, RankSchedule):
        groups = [group_ranks(grid, schedule, g) for g in range(schedule.num_ranks)]
        group = next(g for g, ranks in enumerate(groups) if rank in ranks)
        replica = groups[group].index(rank)
        routed = any(len(p) > 1 for p in schedule.placement)
        for step in schedule.orders[group]:
            if step.kind is not Kind.FORWARD or step.stage not in (0, last):
                continue
            s = step.stage
            replicas = len(groups[schedule.route_table[s][0]]) if routed else grid.replicas[s]
            rows = share(n_total, schedule.num_micro_batches, step.micro_batch, replicas, replica)
            for part in ((0,) if s == 0 else ()) + ((1,) if s == last else ()):
                parts[part].append(rows)
    else:
        stage, replica = grid.position(rank)
        sequences = schedule.sequences
        for part, holds in ((0, stage == 0), (1, stage == last)):
            if holds:
                parts[part] = [share(n_total, sequences, q, grid.replicas[stage], replica) for q in range(sequences)]
    if rank == grid.stage_ranks(0)[0] and not parts[0]:
        parts[0].append((0, 1))  # the row the layouts of what stage 0 sends are learnt from
    return Reads(*(tuple(sorted(set(parts[p]))) for p in (0, 1)))


def read_table(grid, train_schedule, rank: int, train_sizes, eval_sizes, num_micro_batches: int) -> tuple[dict, dict]:
    """({n: Reads} for training batches of the sizes given, the same for evaluation batches)."""
    train = {n: rank_reads(grid, train_schedule, rank, n) for n in train_sizes}
    widest = max(grid.replicas)
    evaluation = {
        n: rank_reads(
            grid,
            eval_schedule(train_schedule, grid.num_stages, eval_micro_batches(num_micro_batches, n, widest)),
            rank,
            n,
        )
        for n in eval_sizes
    }
    return train, evaluation
