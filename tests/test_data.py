"""One process: the data every stage reads, epoch by epoch, and where a resumed run continues."""
from __future__ import annotations

from lightning.fabric.utilities.data import _set_sampler_epoch
from torch.utils.data import DataLoader

from dapple_launch.data.datasets import GlobalBatchSampler


def loader(sampler):
    return DataLoader(list(range(64)), batch_sampler=sampler)


def test_lightning_reshuffles_every_epoch():
    s = GlobalBatchSampler(64, 8, seed=3, shuffle=True)
    dl = loader(s)
    _set_sampler_epoch(dl, 0)  # what Lightning's fit loop calls at each epoch start
    first = list(s)
    _set_sampler_epoch(dl, 1)
    second = list(s)
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(64))


def test_resume_mid_epoch_continues_with_the_next_batch():
    s = GlobalBatchSampler(64, 8, seed=3, shuffle=True)
    _set_sampler_epoch(loader(s), 2)
    full = list(s)
    r = GlobalBatchSampler(64, 8, seed=3, shuffle=True)
    r.resume = (2, 3)
    _set_sampler_epoch(loader(r), 2)
    assert list(r) == full[3:]
    assert len(r) == len(s)  # Lightning's epoch length stays the full epoch
