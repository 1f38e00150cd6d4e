"""Each rank reads only its stages' rows and tensors of a global batch (data/rank_batch.py,
runtime/rank_rows.py): over every family's layouts the first stage's ranks read every input row
exactly once between them, the last stage's every target row, a rank holding neither reads nothing;
the loader's view loads no other sample, pins and moves what it read, and works in workers. (That the
executor runs on exactly these rows is shown by the numerics tests, which all run on them.)"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader

from dapple_launch.data.datasets import GlobalBatchSampler
from dapple_launch.data.rank_batch import INPUTS, TARGETS, RankBatch, RankView, Reads, batch_bytes, keep_batch
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.rank_rows import eval_micro_batches, eval_schedule, rank_reads

from .test_chunked_numerics import chunked_plan, model_of
from .test_pipeline_numerics import make_plan, tiny_model
from .test_round_robin_numerics import rr_plan

LAYOUTS = {
    "1f1b 1 stage": lambda: make_plan(tiny_model(), (2,), "1f1b", 3, 6),
    "1f1b 2x2": lambda: make_plan(tiny_model(), (2, 2), "1f1b", 2, 4),
    "zb_h1 3:1": lambda: make_plan(tiny_model(), (3, 1), "zb_h1", 2, 6),
    "gpipe 2:1:1 slices": lambda: make_plan(tiny_model(), (2, 1, 1), "gpipe", 2, 4, token_slices=(2, 6)),
    "interleaved 3:1": lambda: chunked_plan(model_of("gpt"), (3, 1), "interleaved_1f1b", 4, 4, 12),
    "zbv 1:2:1": lambda: chunked_plan(model_of("gpt"), (1, 2, 1), "zbv", 6, 4, 8),
    "chimera 2x2": lambda: chunked_plan(model_of("gpt"), (2, 2), "chimera", 2, 4, 8),
    "copies 2:1 1f1b_rr": lambda: rr_plan(model_of("gpt"), (2, 1), (2, 1), "1f1b_rr", 4, 4),
    "copies 2x2 zb_h1_rr": lambda: rr_plan(model_of("gpt"), (2, 2), (1, 2), "zb_h1_rr", 4, 8),
}


@pytest.fixture(scope="module")
def plans():
    return {name: make() for name, make in LAYOUTS.items()}


def _counts(reads: list[Reads], part: int) -> Counter:
    return Counter(i for r in reads for a, b in r.of(part) for i in range(a, b))


@pytest.mark.slow  # (the plans' analytic profiles: about a second each)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_row_is_read_once_by_the_stage_that_uses_it(plans, name):
    plan = plans[name]
    grid = ProcessGrid.from_plan(plan)
    world, last = grid.world_size, grid.num_stages - 1
    train = plan.build_schedule()
    for n in (plan.global_batch_size, plan.global_batch_size + 3):
        micro = eval_micro_batches(plan.num_micro_batches, n, max(grid.replicas))
        for schedule in (train, eval_schedule(train, grid.num_stages, micro)):
            reads = [rank_reads(grid, schedule, r, n) for r in range(world)]
            probe = grid.stage_ranks(0)[0]  # also reads one input row to learn the layouts, if no other
            for part, stage in ((INPUTS, 0), (TARGETS, last)):
                holders = set(grid.stage_ranks(stage))
                counts = _counts([reads[r] for r in holders], part)
                extra = counts - Counter(range(n))
                assert extra in (Counter(), Counter({0: 1})) and sum(counts.values()) - sum(extra.values()) == n
                assert not extra or reads[probe].inputs == ((0, 1),), (name, n)
                assert not _counts([reads[r] for r in range(world) if r not in holders], part), (name, part)


@pytest.mark.slow
def test_a_middle_stage_reads_nothing_and_the_first_only_inputs(plans):
    plan = plans["zb_h1 3:1"]  # stages 0 (ranks 0-2) and 1 (rank 3)
    plan3 = make_plan(tiny_model(), (1, 1, 1), "1f1b", 3, 6)
    grid = ProcessGrid.from_plan(plan3)
    middle = rank_reads(grid, plan3.build_schedule(), grid.stage_ranks(1)[0], 6)
    assert middle == Reads((), ())
    grid = ProcessGrid.from_plan(plan)
    first = rank_reads(grid, plan.build_schedule(), 1, 6)
    assert first.targets == () and first.inputs == ((1, 2), (4, 5))  # replica 1 of 3, micro-batches of 3


class Counted:
    """A dataset that counts which samples were loaded."""

    def __init__(self, n: int):
        self.n, self.loaded = n, Counter()
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randint(0, 40, (n, 8), generator=g), torch.randint(0, 40, (n, 8), generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.loaded[i] += 1
        return self.x[i], self.y[i]


def test_the_view_loads_only_the_rows_read_and_keeps_only_their_part():
    data = Counted(12)
    reads = Reads(inputs=((0, 2), (6, 8)), targets=())
    view = RankView(data, {4: Reads(inputs=((0, 2),)), 8: reads})
    indices = [9, 3, 5, 11]  # the sampler's global batch: positions 0..3
    batch = view.__getitems__(indices)
    assert isinstance(batch, RankBatch) and batch.targets is None
    assert set(data.loaded) == {9, 3}  # positions 0 and 1 only
    wide = view.__getitems__(list(range(8)))
    assert torch.equal(wide.take(INPUTS, 6, 8), data.x[6:8]) and torch.equal(wide.take(INPUTS, 0, 2), data.x[0:2])
    with pytest.raises(KeyError, match=r"rows \[2, 4\) of the batch's inputs were not read"):
        wide.take(INPUTS, 2, 4)
    assert batch_bytes(wide) == 4 * 8 * 8  # four rows of int64 inputs, no targets
    whole = view.__getitems__(list(range(6)))  # a size nobody planned for: read whole, as before
    assert torch.equal(whole[1], data.y[:6])
    moved = wide.to(torch.float32)
    assert moved.inputs.dtype == torch.float32 and moved.reads == wide.reads


def test_the_view_runs_in_loader_workers_with_a_resumable_sampler():
    data = Counted(16)
    reads = Reads(inputs=((0, 2),), targets=((2, 4),))
    sampler = GlobalBatchSampler(16, 4, seed=3, shuffle=True)
    loader = DataLoader(
        RankView(data, {4: reads}), batch_sampler=sampler, num_workers=2, collate_fn=keep_batch, persistent_workers=True
    )
    got = list(loader)
    order = list(GlobalBatchSampler(16, 4, seed=3, shuffle=True))
    assert len(got) == 4
    for batch, idx in zip(got, order):
        assert torch.equal(batch.take(INPUTS, 0, 2), data.x[idx[0:2]])
        assert torch.equal(batch.take(TARGETS, 2, 4), data.y[idx[2:4]])
