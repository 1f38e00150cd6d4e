"""The user's model contract: an ordered list of layers plus a loss.

- `layers()` returns LayerSpecs in execution order. Each layer maps one tensor to one tensor
  (the first layer gets the batch's inputs, the last one's output goes to the loss). A layer is
  built by its `build()` only on the ranks whose stage holds it, under a seed derived from its
  position, so its initial weights are the same whatever the layout.
- `loss(output, target)` returns one loss per sample (shape [n]). The runtime sums and divides
  by the global batch, so any split into micro-batches and replicas gives the same loss and
  gradients as one process.
- `batch(n, generator)` makes an example (inputs, targets) pair: for profiling and tests.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass(frozen=True)
class LayerSpec:
    name: str
    build: Callable[[], nn.Module]


class PipelineModel(abc.ABC):
    name: str = "model"

    @abc.abstractmethod
    def layers(self) -> list[LayerSpec]: ...

    @abc.abstractmethod
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def batch(self, n: int, generator: torch.Generator | None = None,
              device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]: ...

    def describe(self) -> dict:
        """Plain data identifying the architecture (checkpoint compatibility checks use it)."""
        return {"name": self.name}


def build_layer(spec: LayerSpec, index: int, seed: int) -> nn.Module:
    """Build layer `index` with its own seed, so weights do not depend on which layers a rank holds."""
    devices = [] if not torch.cuda.is_available() else [torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed * 100_003 + index)
        return spec.build()
