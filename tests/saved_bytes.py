"""An exact count of the bytes autograd keeps for backward (saved-tensor hooks), not RSS: used by the
memory tests and the benchmarks."""

from __future__ import annotations

import torch


class SavedBytes:
    """Bytes of tensors saved for backward that are alive right now, and the peak. `weights`: the
    parameters, which a layer saves as they are: counted once as weights, not here."""

    def __init__(self, weights=()):
        self.live = self.peak = 0
        self.weights = {p.untyped_storage().data_ptr() for p in weights}

    def pack(self, t):
        n = 0 if t.untyped_storage().data_ptr() in self.weights else t.numel() * t.element_size()
        self.live += n
        self.peak = max(self.peak, self.live)
        return _Handle(self, t.detach(), n)  # (not t: a saved output would hold its own node: a cycle)

    @staticmethod
    def unpack(h):
        return h.t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class _Handle:
    def __init__(self, owner, t, n):
        self.owner, self.t, self.n = owner, t, n

    def __del__(self):
        self.owner.live -= self.n


def saved_and_freed_at_input(forward, inputs, params, is_loss: bool) -> tuple[int, int]:
    """What one forward keeps for backward (`forward()` returns the stage's outputs, or with `is_loss`
    its scalar loss), and of that what a split backward's I frees (models/split_backward.py: what only
    the input gradient reads). `inputs`: the stage's inputs (those needing a gradient are I's)."""
    from dapple_launch.models.contract import as_tuple
    from dapple_launch.models.split_backward import backward_input

    params = list(params)
    counter = SavedBytes(params)
    with counter.hooks():
        kept = forward()
        saved = counter.live
    outputs = [kept] if is_loss else [t for t in as_tuple(kept) if t.requires_grad]
    grads = None if is_loss else [torch.ones_like(t) for t in outputs]
    want = [t for t in as_tuple(inputs) if t.is_floating_point() and t.requires_grad]
    _, pending = backward_input(outputs, grads, want, params)
    del kept, outputs, grads
    freed = saved - counter.live
    del pending
    return saved, freed
