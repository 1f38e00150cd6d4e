"""What one rank of a pipeline reads of a global batch: only the rows its stages use, and of each
row only the tensor they use: the inputs where it holds the first stage, the targets where it holds
the last. A rank holding neither reads nothing.

The rows are named by position in the global batch, in the ranges the executor asks for (a replica's
share of a micro-batch, runtime/rank_rows.py). Every rank still draws the same global batch of
indices from the sampler, so stages with different replica counts agree on which samples they see
without communicating; they just skip the samples they do not use. The loader reads through
`RankView.__getitems__` (a whole batch per call: the sampler's one list), so the selection happens
before collation, before pinning and before the copy to the device, in the loader's workers when
there are any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils.data import Dataset, default_collate

from ..models.contract import Carry, as_tuple, carry_map

INPUTS, TARGETS = 0, 1


class Samples(Protocol):
    """What the data module reads: a map-style dataset whose length is known."""

    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> Any: ...


Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Reads:
    """The ranges [a, b) of global-batch rows a rank reads: per part (inputs, targets)."""

    inputs: Ranges = ()
    targets: Ranges = ()

    def of(self, part: int) -> Ranges:
        return self.inputs if part == INPUTS else self.targets

    @property
    def rows(self) -> list[int]:
        """Every position read, each once, in order."""
        return sorted({i for a, b in (*self.inputs, *self.targets) for i in range(a, b)})


@dataclass
class RankBatch:
    """This rank's part of one global batch of `n_total` samples: per part, the rows of its ranges
    concatenated in order (None where the rank reads no such part)."""

    n_total: int
    reads: Reads
    inputs: Carry | None = None
    targets: Carry | None = None
    _offsets: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for part in (INPUTS, TARGETS):
            at = 0
            for a, b in self.reads.of(part):
                self._offsets[(part, a, b)] = at
                at += b - a

    def take(self, part: int, a: int, b: int) -> Carry:
        """Rows [a, b) of the global batch's inputs or targets; a range the reads did not name is
        a bug in the selection (the executor and runtime/rank_rows.py disagree), never silent."""
        at = self._offsets.get((part, a, b))
        if at is None:
            held = self.reads.of(part)
            raise KeyError(
                f"rows [{a}, {b}) of the batch's {'inputs' if part == INPUTS else 'targets'} were not read by this "
                f"rank (it read {list(held)}): the rank's reads and its executor's schedule disagree"
            )
        carry = self.inputs if part == INPUTS else self.targets
        assert carry is not None  # (a part with ranges read was loaded)
        return carry_map(lambda t: t[at : at + b - a], carry)

    def first_row(self) -> Carry:
        """One row of inputs (learning the layouts of what a first stage sends)."""
        assert self.inputs is not None, "this rank read no inputs"
        return carry_map(lambda t: t[0:1], self.inputs)

    # the loader's pinning thread and Lightning's transfer to the device call these
    def pin_memory(self) -> RankBatch:
        return self._map(lambda t: t.pin_memory())

    def to(self, *args, **kwargs) -> RankBatch:
        return self._map(lambda t: t.to(*args, **kwargs))

    def _map(self, fn) -> RankBatch:
        def each(c):
            return None if c is None else carry_map(fn, c)

        return RankBatch(self.n_total, self.reads, each(self.inputs), each(self.targets))


class WholeBatch:
    """A global batch loaded whole (the single-process reference, tests, a size nobody planned for),
    behind the same interface as RankBatch."""

    def __init__(self, batch):
        self.batch = batch
        self.n_total = as_tuple(batch[0])[0].shape[0]

    def take(self, part: int, a: int, b: int) -> Carry:
        return carry_map(lambda t: t[a:b], self.batch[part])

    def first_row(self) -> Carry:
        return carry_map(lambda t: t[0:1], self.batch[0])


def rows_of(batch) -> RankBatch | WholeBatch:
    """The executor's view of whatever the loader or a test handed it."""
    return batch if isinstance(batch, (RankBatch, WholeBatch)) else WholeBatch(batch)


def global_size(batch) -> int:
    """Samples in the global batch, however much of it this rank read."""
    return rows_of(batch).n_total


def describe_reads(reads: Reads, n: int) -> str:
    """One line: what this rank reads of each global batch of n samples."""
    parts = [
        f"the {name} of {sum(b - a for a, b in reads.of(part))}"
        for part, name in ((INPUTS, "inputs"), (TARGETS, "targets"))
        if reads.of(part)
    ]
    if not parts:
        return f"data: this rank reads nothing of each global batch of {n} samples (it holds neither the first nor the last stage)"
    return f"data: this rank reads {' and '.join(parts)} of each global batch's {n} samples"


def keep_batch(batch):
    """The loader's collate function for a RankView: the view already built the batch (a module-level
    function, so loader workers can pickle it)."""
    return batch


class RankView(Dataset):
    """A dataset as one rank reads it: `reads[n]` says which rows of a global batch of n samples this
    rank reads (runtime/rank_rows.py; the train batch's size, the validation's full and last sizes).
    A batch of a size it has no entry for is read whole, as before."""

    def __init__(self, dataset: Samples, reads: dict[int, Reads]):
        self.dataset, self.reads = dataset, reads

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        return self.dataset[i]

    def __getitems__(self, indices: list[int]):
        n = len(indices)
        reads = self.reads.get(n)
        if reads is None:
            return default_collate([self.dataset[i] for i in indices])
        samples = {p: self.dataset[indices[p]] for p in reads.rows}
        parts = []
        for part in (INPUTS, TARGETS):
            rows = [samples[p][part] for a, b in reads.of(part) for p in range(a, b)]
            parts.append(default_collate(rows) if rows else None)
        return RankBatch(n, reads, parts[0], parts[1])


def _tensor_bytes(c: Carry | None) -> int:
    return 0 if c is None else sum(t.numel() * t.element_size() for t in as_tuple(c) if isinstance(t, torch.Tensor))


def batch_bytes(batch) -> int:
    """Bytes of tensors this rank holds of the batch (the data-loading benchmark and tests)."""
    if isinstance(batch, RankBatch):
        return _tensor_bytes(batch.inputs) + _tensor_bytes(batch.targets)
    return sum(_tensor_bytes(c) for c in batch)
