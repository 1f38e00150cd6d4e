"""Measured profile: run each layer of the real module forward and backward on this device.

Times are the median of a few repetitions after a warm-up; output and saved-for-backward bytes
are counted exactly. Results are cached on disk keyed by the model's description, the batch size
and the device, so a second plan of the same model costs nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import torch

from ..models.contract import PipelineModel, build_layer
from .model_profile import LayerProfile, ModelProfile, chain


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).replace(" ", "-")
    return f"cpu-{torch.get_num_threads()}t"


def cache_dir() -> Path:
    return Path(os.environ.get("DAPPLE_CACHE", Path.home() / ".cache" / "dapple_launch")) / "profiles"


def cache_key(model: PipelineModel, batch_size: int, device: str) -> str:
    ident = json.dumps({"model": model.describe(), "batch": batch_size, "device": device}, sort_keys=True)
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_profile(model: PipelineModel, batch_size: int, device: str | torch.device = "cpu",
                    repeats: int = 5, use_cache: bool = True, seed: int = 0) -> ModelProfile:
    dev = torch.device(device)
    name = device_name(dev)
    path = cache_dir() / f"{model.name}-b{batch_size}-{name}-{cache_key(model, batch_size, name)}.json"
    if use_cache and path.is_file():
        return ModelProfile.from_json(path.read_text())
    x, _ = model.batch(batch_size, torch.Generator().manual_seed(seed), device=dev)
    layers = []
    for i, spec in enumerate(model.layers()):
        layer = build_layer(spec, i, seed).to(dev)
        params = sum(p.numel() * p.element_size() for p in layer.parameters())
        fwd, bwd = [], []
        for rep in range(repeats + 1):
            x_in = x.detach().requires_grad_(x.is_floating_point())
            saved = []
            _sync(dev)
            t0 = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                          lambda t: t):
                y = layer(x_in)
            _sync(dev)
            t1 = time.perf_counter()
            y.backward(torch.ones_like(y))
            _sync(dev)
            t2 = time.perf_counter()
            if rep:  # the first run warms up kernels and allocator
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
        layers.append(LayerProfile(spec.name, statistics.median(fwd), statistics.median(bwd),
                                   float(y.numel() * y.element_size()), float(params), saved_bytes=float(sum(saved))))
        x = y.detach()
    profile = chain(model.name, layers, batch_size, source=f"measured:{name}", device=name)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(profile.to_json())
        tmp.replace(path)
    return profile
