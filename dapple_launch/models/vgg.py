"""VGG-19 as a layer list: each convolution (with its ReLU), each pooling, each classifier layer."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .contract import LayerSpec, PipelineModel

_CFG19 = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]


@dataclass(frozen=True)
class VGGShape:
    image_size: int
    num_classes: int
    width_divisor: int = 1  # 1 = the real VGG-19; 8 = a CPU-sized one
    fc_width: int = 4096


VGG_PRESETS = {
    "imagenet": VGGShape(224, 1000, 1, 4096),
    "tiny": VGGShape(32, 10, 8, 128),
}


def _conv(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU())


class VGG19(PipelineModel):
    def __init__(self, shape: VGGShape, name: str = "vgg19"):
        if shape.image_size % 32:
            raise ValueError(f"model {name}: image_size {shape.image_size} must be a multiple of 32 (5 poolings)")
        self.shape, self.name = shape, name

    def layers(self) -> list[LayerSpec]:
        s = self.shape
        specs, cin, block, conv = [], 3, 1, 1
        for item in _CFG19:
            if item == "M":
                specs.append(LayerSpec(f"pool{block}", lambda: nn.MaxPool2d(2)))
                block, conv = block + 1, 1
            else:
                cout = item // s.width_divisor
                specs.append(LayerSpec(f"conv{block}_{conv}", lambda a=cin, b=cout: _conv(a, b)))
                cin, conv = cout, conv + 1
        flat = cin * (s.image_size // 32) ** 2
        specs.append(LayerSpec("fc1", lambda: nn.Sequential(nn.Flatten(), nn.Linear(flat, s.fc_width), nn.ReLU())))
        specs.append(LayerSpec("fc2", lambda: nn.Sequential(nn.Linear(s.fc_width, s.fc_width), nn.ReLU())))
        specs.append(LayerSpec("prediction", lambda: nn.Linear(s.fc_width, s.num_classes)))
        return specs

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target, reduction="none")

    def batch(self, n, generator=None, device="cpu"):
        x, y = pattern_images(n, self.shape.image_size, self.shape.num_classes, generator)
        return x.to(device), y.to(device)

    def describe(self) -> dict:
        return {"name": self.name, "kind": "VGG19", **self.shape.__dict__}


def pattern_images(
    n: int, size: int, num_classes: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic images whose class is where a bright square sits: learnable, not noise."""
    labels = torch.randint(0, num_classes, (n,), generator=generator)
    x = 0.3 * torch.randn(n, 3, size, size, generator=generator)
    grid = math.ceil(math.sqrt(num_classes))
    cell = size // grid
    for i, c in enumerate(labels.tolist()):
        r, q = divmod(c, grid)
        x[i, c % 3, r * cell : (r + 1) * cell, q * cell : (q + 1) * cell] += 1.5
    return x, labels
