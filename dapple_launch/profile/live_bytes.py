"""The bytes of tensor storage alive at once, counted exactly as operators create and free them.

A dispatch mode sees every tensor an operator returns (forward, backward, optimizer) and follows
its storage until the storage is freed; views and in-place results share a storage and count once.
It counts on any device, fake tensors included (their storages have sizes and no memory), so the
profile's memory figures mean the same measured on a CPU, on a GPU, or traced without memory:
a layer's transient peak (what its forward and backward hold beyond the tensors it saves, such as
the loss's log-softmax and its gradient over a vocabulary) as exactly as its saved tensors.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """`with LiveBytes() as live: ...`: `live.peak`, the most bytes alive at once of the storages
    created inside; `live.now`, those still alive."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, int] = {}
        self.now = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t.untyped_storage())
        return out

    def _track(self, storage) -> None:
        key, size = storage._cdata, storage.nbytes()
        if not size or key in self._live:
            return
        self._live[key] = size
        self.now += size
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.now -= self._live.pop(key, 0)
