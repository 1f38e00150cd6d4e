"""Token slices of a causal model's sequence (TeraPipe): what a layer sees while one slice runs.

The runtime runs a stage's layers on slice i = tokens [start, stop) of a micro-batch inside
`running(TokenSlice(...))`; a layer reads it with `current()` (None: the whole sequence at once):

- positions are absolute: the embedding adds position start + t, not t;
- attention uses `TokenSlice.attend(module, q, k, v)`: queries of the slice against the keys and
  values of every earlier slice of this micro-batch (kept in a per-stage, per-micro-batch cache) and
  its own, causally masked. Earlier slices' keys and values enter as detached leaves, so the
  gradient a later slice sends into them accumulates there; the runtime adds it to slice i's own
  backward (`cache_gradients`), which then runs once, after every later slice's.

A model supports slicing when it defines `slice_loss(output, target, start, stop)` (models/contract.py)
and its attention layers call `attend` when a slice is running (models/transformer.py's GPT does).
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("token_slice", default=None)


@dataclass
class KVCache:
    """One micro-batch's keys and values on one stage: per attention module, one entry per slice
    run so far: (keys, values) as computed (attached to the slice's graph) and the detached leaves
    later slices attend to."""

    entries: dict = field(default_factory=dict)

    def cache_gradients(self, index: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(tensors, gradients): slice `index`'s keys and values with what later slices sent into them."""
        roots, grads = [], []
        for per_slice in self.entries.values():
            if index < len(per_slice):
                k, v, k_leaf, v_leaf = per_slice[index]
                for t, leaf in ((k, k_leaf), (v, v_leaf)):
                    if leaf.grad is not None and t.requires_grad:
                        roots.append(t)
                        grads.append(leaf.grad)
        return roots, grads

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for per in self.entries.values() for e in per for t in e[:2])


@dataclass
class TokenSlice:
    index: int
    start: int
    stop: int
    cache: KVCache

    def attend(self, module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
        """Causal attention of this slice's queries [n, heads, l, d] over the cached keys and values
        of the slices before it and its own."""
        per_slice = self.cache.entries.setdefault(module, [])
        if len(per_slice) != self.index:
            raise RuntimeError(
                f"token slice {self.index} runs after {len(per_slice)} slices of this micro-batch on "
                f"this stage: slices run forward in token order"
            )
        k_leaf = k.detach().requires_grad_(k.requires_grad)
        v_leaf = v.detach().requires_grad_(v.requires_grad)
        keys = torch.cat([e[2] for e in per_slice] + [k], dim=2) if per_slice else k
        values = torch.cat([e[3] for e in per_slice] + [v], dim=2) if per_slice else v
        per_slice.append((k, v, k_leaf, v_leaf))
        length, context = q.shape[2], self.start
        if context == 0:
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, dropout_p=dropout_p)
        mask = torch.ones(length, context + length, dtype=torch.bool, device=q.device).tril(diagonal=context)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout_p)


def current() -> TokenSlice | None:
    return _CURRENT.get()


@contextmanager
def running(piece: TokenSlice | None):
    token = _CURRENT.set(piece)
    try:
        yield piece
    finally:
        _CURRENT.reset(token)


def supports_slicing(model) -> bool:
    return callable(getattr(model, "slice_loss", None)) and getattr(model, "token_slicing", True)
