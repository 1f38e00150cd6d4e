"""Analytic profile: FLOPs, bytes and saved activations per layer, from the model's shapes.

Each layer is built on the meta device (no memory, no compute) and run forward and backward
under torch's FLOP counter; saved-for-backward tensors are counted exactly with autograd's
saved-tensor hooks. Times = FLOPs / (device TFLOPS × efficiency), so `model=bert
cluster=v100x16` plans on a laptop.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..models.contract import PipelineModel
from .model_profile import LayerProfile, ModelProfile, chain


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def trace_layers(model: PipelineModel, batch_size: int):
    """Yield (name, fwd flops, bwd flops, out bytes, saved bytes, param bytes) per layer on meta."""
    x, _ = model.batch(batch_size, torch.Generator().manual_seed(0))
    x = x.to("meta")
    for spec in model.layers():
        with torch.device("meta"):
            layer = spec.build()
        params = sum(_nbytes(p) for p in layer.parameters())
        x_in = x.detach().requires_grad_(x.is_floating_point())
        saved = []
        counter = FlopCounterMode(display=False)
        with counter, torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(_nbytes(t)) or t, lambda t: t):
            y = layer(x_in)
        fwd = counter.get_total_flops()
        counter = FlopCounterMode(display=False)
        with counter:
            y.backward(torch.ones_like(y))
        bwd = counter.get_total_flops()
        yield spec.name, fwd, bwd, _nbytes(y), sum(saved), params
        x = y.detach()


def analytic_profile(model: PipelineModel, batch_size: int, device_tflops: float, device: str,
                     efficiency: float = 0.4) -> ModelProfile:
    if device_tflops <= 0:
        raise ValueError(f"analytic profile needs the device speed: device_tflops={device_tflops} must be > 0")
    rate = device_tflops * 1e12 * efficiency
    layers = []
    for name, fwd, bwd, out, saved, params in trace_layers(model, batch_size):
        # A layer that saves nothing still keeps its input alive for its successor's backward.
        layers.append(LayerProfile(name, fwd / rate, bwd / rate, float(out), float(params), saved_bytes=float(saved)))
    return chain(model.name, layers, batch_size, source="analytic", device=device, device_tflops=device_tflops)
