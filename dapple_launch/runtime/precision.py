"""Mixed precision for a pipeline: autocast in every stage, the compute dtype on the wire, and one
loss scale shared by all stages.

Weights and optimizer state stay fp32 (the master copy); each stage's forward (and a recomputed
one) runs under autocast. A floating tensor leaving a stage is cast to the compute dtype inside the
autograd graph, so the bytes on the wire halve and the gradient coming back is in that dtype too;
the receiving stage casts it back to the dtype the sender had before going on.

`16-mixed` scales the loss (on the last stage) by one scale that every rank holds the same copy of:
the gradients of every stage are then scaled alike. After the backward, every rank checks its
gradients; one all-reduce over the world says whether any is inf or NaN, and if so every rank skips
the step and halves the scale; after `growth_interval` clean steps it doubles. The decisions are
made from the same all-reduced flag on every rank, so the scales never drift apart.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

COMPUTE = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


@dataclass(frozen=True)
class MixedPrecision:
    name: str = "32"  # 32 | bf16-mixed | 16-mixed (Lightning's names)
    device_type: str = "cpu"

    def __post_init__(self) -> None:
        if self.name not in COMPUTE:
            raise ValueError(f"trainer.precision={self.name}: valid are {', '.join(COMPUTE)}")

    @property
    def compute_dtype(self) -> torch.dtype | None:
        return COMPUTE[self.name]

    @property
    def scales_loss(self) -> bool:
        return self.name == "16-mixed"

    def autocast(self):
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.compute_dtype)

    def to_wire(self, t: torch.Tensor) -> torch.Tensor:
        """A floating tensor wider than the compute dtype crosses stages in it (differentiably)."""
        c = self.compute_dtype
        if c is not None and t.is_floating_point() and t.element_size() > c.itemsize:
            return t.to(c)
        return t


class LossScaler:
    """The dynamic loss scale of `16-mixed` (torch.amp.GradScaler's rule, shared by all ranks)."""

    def __init__(
        self,
        enabled: bool,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ):
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.clean_steps = 0
        self.skipped = 0

    def update(self, found_inf: bool) -> None:
        if not self.enabled:
            return
        if found_inf:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped += 1
            return
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.clean_steps = float(state["scale"]), int(state["clean_steps"])
        self.skipped = int(state.get("skipped", 0))


def grads_finite(params) -> bool:
    """No inf or NaN in any of these gradients."""
    return all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in params)


def grads_finite_everywhere(params, device) -> bool:
    """No rank of the process group has an inf or NaN gradient: one all-reduce, so every rank
    reaches the same decision (skip the step, or take it)."""
    import torch.distributed as dist

    bad = torch.tensor([0.0 if grads_finite(params) else 1.0], device=device)
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return bad.item() == 0
