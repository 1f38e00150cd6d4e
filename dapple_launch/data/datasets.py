"""The synthetic data sets, the datasets of every data kind, and the data module the trainer reads.

Every rank draws the same global batches of indices and reads of each only the rows and tensors
its stages use (data/rank_batch.py): stages with different replica counts then agree on which
samples they see without any extra communication, and Lightning's distributed sampler is not used
(it would split by world rank, which is wrong for a pipeline). The batch sampler is resumable: a mid-epoch checkpoint records
how many batches the epoch had consumed, and the resumed run continues with the next one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..log import get_logger
from ..models.contract import PipelineModel
from ..models.transformer import mask_tokens
from .corpus import encode, generate_text
from .rank_batch import RankView, Samples, describe_reads, keep_batch


class TextWindows(Dataset):
    """Fixed windows of a character corpus: (ids, next ids) for GPT, (masked ids, targets) for BERT."""

    def __init__(self, num_samples: int, seq_len: int, seed: int, masked: bool):
        self.seq_len, self.seed, self.masked, self.n = seq_len, seed, masked, num_samples
        self.stride = max(1, seq_len // 2)
        self.ids = encode(generate_text(num_samples * self.stride + seq_len + 2, seed))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        w = self.ids[i * self.stride : i * self.stride + self.seq_len + 1]
        if not self.masked:
            return w[:-1], w[1:]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x, y = mask_tokens(w[None, :-1], generator=g)
        return x[0], y[0]


class ModelSamples(Dataset):
    """Samples drawn from the model's own `batch()` with a per-index seed (images for VGG)."""

    def __init__(self, model: PipelineModel, num_samples: int, seed: int):
        self.model, self.n, self.seed = model, num_samples, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x, y = self.model.batch(1, torch.Generator().manual_seed(self.seed * 1_000_003 + i))
        return x[0], y[0]


class _EpochForwarder:
    """Lightning calls set_epoch on `batch_sampler.sampler`, never on the batch sampler itself."""

    def __init__(self, owner: GlobalBatchSampler):
        self.owner = owner

    def set_epoch(self, epoch: int) -> None:
        self.owner.set_epoch(epoch)


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields global batches of indices, reshuffled per epoch from the seed; can start mid-epoch.
    Without drop_last, a last partial batch is kept if it has at least `min_last` samples (a
    stage splits each micro-batch among its replicas, so fewer could not be split)."""

    def __init__(self, n: int, batch_size: int, seed: int, shuffle: bool, drop_last: bool = True, min_last: int = 1):
        self.n, self.batch_size, self.seed, self.shuffle, self.drop_last = n, batch_size, seed, shuffle, drop_last
        self.min_last = min_last
        self.epoch = 0
        self.resume: tuple[int, int] | None = None  # (epoch, batches already consumed)
        self.sampler = _EpochForwarder(self)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        full, rest = divmod(self.n, self.batch_size)
        return full + (1 if not self.drop_last and rest >= self.min_last else 0)

    def __iter__(self) -> Iterator[list[int]]:
        order = (
            torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
            if self.shuffle
            else list(range(self.n))
        )
        skip = 0
        if self.resume is not None and self.resume[0] == self.epoch:
            skip = self.resume[1]
            self.resume = None
        for b in range(skip, len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size]


SYNTHETIC = {"gpt": "text", "bert": "masked_text"}  # the others (vgg19, custom) draw from their own batch()


def synthetic(model: PipelineModel, model_name: str, n: int, seed: int) -> Samples:
    kind = SYNTHETIC.get(model_name)
    if kind is not None:
        assert model.seq_len is not None, f"model {model_name} makes text but states no seq_len"
        return TextWindows(n, model.seq_len, seed, masked=kind == "masked_text")
    return ModelSamples(model, n, seed)


def build_datasets(data_cfg, model: PipelineModel, model_name: str, seed: int) -> tuple[Samples, Samples]:
    """(train, validation) for any data kind of the config."""
    if data_cfg.kind == "synthetic":
        return (
            synthetic(model, model_name, data_cfg.num_train, seed),
            synthetic(model, model_name, data_cfg.num_val, seed + 7919),
        )
    from .files import datasets

    return datasets(data_cfg, model, seed)


class PipelineData(L.LightningDataModule):
    """Global batches: every rank draws the same ones, and reads its part (see the module docstring). `min_val_batch`:
    the fewest samples a validation batch may have (the most replicas a stage has)."""

    def __init__(
        self,
        train: Samples,
        val: Samples,
        global_batch_size: int,
        seed: int,
        num_workers: int = 0,
        min_val_batch: int = 1,
        pin_memory: bool = False,
    ):
        super().__init__()
        self.train_set, self.val_set, self.global_batch_size = train, val, global_batch_size
        self.seed, self.num_workers, self.min_val_batch = seed, num_workers, min_val_batch
        self.pin_memory = pin_memory
        self._resume: tuple[int, int] | None = None
        self._views_made: tuple[Samples, Samples, bool] | None = None  # (train and validation share one)

    def _views(self) -> tuple[Samples, Samples, bool]:
        """(train, validation) as this rank reads them, and whether they are rank views: under a
        pipeline strategy only its stages' rows and tensors (data/rank_batch.py); else whole. Made
        once: the train and validation loaders both ask."""
        if self._views_made is None:
            self._views_made = self._make_views()
        return self._views_made

    def _make_views(self) -> tuple[Samples, Samples, bool]:
        trainer = getattr(self, "trainer", None)
        reads = getattr(trainer.strategy, "batch_reads", None) if trainer is not None else None
        if reads is None:
            return self.train_set, self.val_set, False
        n_val, g = len(self.val_set), self.global_batch_size
        eval_sizes = {g} | ({n_val % g} if n_val % g >= self.min_val_batch else set())
        train, evaluation = reads([g], sorted(eval_sizes))
        get_logger().info(describe_reads(train[g], g))  # (this rank's log; rank 0's in the terminal)
        return RankView(self.train_set, train), RankView(self.val_set, evaluation), True

    def _loader(self, dataset: Samples, sampler: GlobalBatchSampler, view: bool) -> DataLoader:
        return DataLoader(
            cast(Dataset, dataset),  # (map-style: torch reads it by index and length alone)
            batch_sampler=sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            collate_fn=keep_batch if view else None,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        sampler = GlobalBatchSampler(len(self.train_set), self.global_batch_size, self.seed, shuffle=True)
        sampler.resume, self._resume = self._resume, None
        train, _, view = self._views()
        return self._loader(train, sampler, view)

    def val_dataloader(self) -> DataLoader:
        sampler = GlobalBatchSampler(
            len(self.val_set),
            self.global_batch_size,
            self.seed,
            shuffle=False,
            drop_last=False,
            min_last=self.min_val_batch,
        )
        _, val, view = self._views()
        return self._loader(val, sampler, view)

    # Lightning saves these with every checkpoint and restores them before building the loaders.
    def state_dict(self) -> dict:
        trainer = self.trainer
        assert trainer is not None  # (Lightning calls this while fitting)
        batches = cast(Any, trainer.fit_loop.epoch_loop.batch_progress.current)  # (a processed-tracking one)
        return {"epoch": trainer.current_epoch, "batches_done": batches.processed}

    def load_state_dict(self, state: dict) -> None:
        self._resume = (int(state["epoch"]), int(state["batches_done"]))
