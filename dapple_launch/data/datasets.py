"""Datasets the configs name, and the data module the trainer reads.

Every rank loads the whole global batch and takes its own slice of each micro-batch: stages
with different replica counts then agree on which samples they see without any extra
communication, and Lightning's distributed sampler is not used (it would split by world rank,
which is wrong for a pipeline). The batch sampler is resumable: a mid-epoch checkpoint records
how many batches the epoch had consumed, and the resumed run continues with the next one.
"""
from __future__ import annotations

from typing import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..models.contract import PipelineModel
from .corpus import encode, generate_text, mask_tokens


class TextWindows(Dataset):
    """Fixed windows of a character corpus: (ids, next ids) for GPT, (masked ids, targets) for BERT."""

    def __init__(self, num_samples: int, seq_len: int, seed: int, masked: bool):
        self.seq_len, self.seed, self.masked, self.n = seq_len, seed, masked, num_samples
        self.stride = max(1, seq_len // 2)
        self.ids = encode(generate_text(num_samples * self.stride + seq_len + 2, seed))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        w = self.ids[i * self.stride: i * self.stride + self.seq_len + 1]
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

    def __init__(self, owner: "GlobalBatchSampler"):
        self.owner = owner

    def set_epoch(self, epoch: int) -> None:
        self.owner.set_epoch(epoch)


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields global batches of indices, reshuffled per epoch from the seed; can start mid-epoch."""

    def __init__(self, n: int, batch_size: int, seed: int, shuffle: bool, drop_last: bool = True):
        self.n, self.batch_size, self.seed, self.shuffle, self.drop_last = n, batch_size, seed, shuffle, drop_last
        self.epoch = 0
        self.resume: tuple[int, int] | None = None  # (epoch, batches already consumed)
        self.sampler = _EpochForwarder(self)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        order = (torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
                 if self.shuffle else list(range(self.n)))
        skip = 0
        if self.resume is not None and self.resume[0] == self.epoch:
            skip = self.resume[1]
            self.resume = None
        for b in range(skip, len(self)):
            yield order[b * self.batch_size:(b + 1) * self.batch_size]


class PipelineData(L.LightningDataModule):
    def __init__(self, model: PipelineModel, kind: str, global_batch_size: int, num_train: int,
                 num_val: int, seed: int, num_workers: int = 0):
        super().__init__()
        self.model, self.kind, self.global_batch_size = model, kind, global_batch_size
        self.num_train, self.num_val, self.seed, self.num_workers = num_train, num_val, seed, num_workers
        self._resume: tuple[int, int] | None = None

    def _dataset(self, n: int, seed: int) -> Dataset:
        if self.kind in ("text", "masked_text"):
            return TextWindows(n, self.model.shape.seq_len, seed, masked=self.kind == "masked_text")
        if self.kind == "model_samples":
            return ModelSamples(self.model, n, seed)
        raise ValueError(f"unknown data kind {self.kind!r}; valid: text, masked_text, model_samples")

    def train_dataloader(self) -> DataLoader:
        sampler = GlobalBatchSampler(self.num_train, self.global_batch_size, self.seed, shuffle=True)
        sampler.resume, self._resume = self._resume, None
        return DataLoader(self._dataset(self.num_train, self.seed), batch_sampler=sampler,
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        sampler = GlobalBatchSampler(self.num_val, self.global_batch_size, self.seed, shuffle=False, drop_last=False)
        return DataLoader(self._dataset(self.num_val, self.seed + 7919), batch_sampler=sampler,
                          num_workers=self.num_workers)

    # Lightning saves these with every checkpoint and restores them before building the loaders.
    def state_dict(self) -> dict:
        trainer = self.trainer
        return {"epoch": trainer.current_epoch,
                "batches_done": trainer.fit_loop.epoch_loop.batch_progress.current.processed}

    def load_state_dict(self, state: dict) -> None:
        self._resume = (int(state["epoch"]), int(state["batches_done"]))
