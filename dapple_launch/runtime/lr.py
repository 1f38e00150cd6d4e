"""The learning-rate schedule: linear warm-up, then cosine decay to a tenth."""

from __future__ import annotations

import math


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """The multiple of trainer.lr at `step` (LambdaLR's factor)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps > warmup_steps:
        progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0
