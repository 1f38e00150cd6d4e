"""The batch a rank's loader hands its executor (data/rank_batch.py): only its stages' rows and
tensors, read through the loader's own RankView. The numerics tests run every family on these, so a
selection that disagrees with the executor's schedule fails there (RankBatch.take refuses)."""

from __future__ import annotations

from dapple_launch.data.rank_batch import RankView
from dapple_launch.models.contract import carry_map
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.rank_rows import rank_reads


class Rows:
    """A whole batch as a dataset of its rows."""

    def __init__(self, batch):
        self.batch = batch

    def __len__(self) -> int:
        return len(self.batch[1])

    def __getitem__(self, i: int):
        return tuple(carry_map(lambda t: t[i], part) for part in self.batch)


def rank_batch(plan, rank: int, batch, schedule=None):
    """What `rank` reads of `batch` under `schedule` (default: the plan's training schedule)."""
    grid = ProcessGrid.from_plan(plan)
    n = len(batch[1])
    reads = rank_reads(grid, schedule or plan.build_schedule(), rank, n)
    return RankView(Rows(batch), {n: reads}).__getitems__(list(range(n)))
