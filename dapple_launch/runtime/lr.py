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


# GPT-3's learning rates by model size (Brown et al. 2020, table 2.1: parameters, Adam's peak rate),
# which later decoder-only models stay near; trainer.lr=null (the default) picks by this table
GPT3_LEARNING_RATES = (
    (125e6, 6.0e-4),
    (350e6, 3.0e-4),
    (760e6, 2.5e-4),
    (1.3e9, 2.0e-4),
    (2.7e9, 1.6e-4),
    (6.7e9, 1.2e-4),
    (13e9, 1.0e-4),
    (175e9, 0.6e-4),
)
# the most the default gives: a model of a few million parameters or fewer (the CPU presets) trains
# well at it, and a higher rate gains them little
SMALL_MODEL_LR = 3.0e-3


def default_lr(parameters: float) -> float:
    """Adam's peak learning rate for a model of `parameters` weights: GPT-3's table, interpolated in
    log-log between its sizes, its first slope carried below 125 M up to SMALL_MODEL_LR, its last
    rate above 175 B. (GPT-2 large, 774 M, at the old flat default of 3e-3 ended 6 steps on one H200
    at a loss of 21.07, twice where it started; this gives it 2.5e-4.)"""
    table = GPT3_LEARNING_RATES
    n = max(float(parameters), 1.0)
    for (n0, lr0), (n1, lr1) in zip(table, table[1:]):
        if n < n1:
            slope = math.log(lr1 / lr0) / math.log(n1 / n0)
            return min(SMALL_MODEL_LR, lr0 * (n / n0) ** slope)
    return table[-1][1]
