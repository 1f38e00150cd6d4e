"""The analytic profile kept on disk (cache.py), for the next launch of the same model.

Tracing a model's layers on fake tensors loads torch._dynamo (3 s of a launch on this machine) and
runs each kind of layer forward and backward at two batch sizes; a launch of the same model with the
same shapes, batch, precision and device reads the figures back instead.

The figures follow from the model's code as much as from its shapes, and an edited model keeps its
name and arguments. So an entry records every source file the trace had loaded outside the standard
library and the installed packages (the user's model modules, and this package's own wherever it is
installed), each with a hash of its text, and is read back only while every one of them is
unchanged; torch's and transformers' versions stand for the installed code, in the key. A file
added to the model's imports changes the file that imports it, so it is never missed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from importlib import metadata

from ..cache import cache_dir, read_cached, write_cached
from .model_profile import ModelProfile

# what the entry holds: bump when the trace's figures change meaning (as measure.cache_key's fields)
FORMAT = "analytic-1"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def _layers(model) -> list:
    """Each layer's name, class and parameters' and buffers' shapes, built on the meta device, for a
    model made in code: two that describe themselves alike (by their name alone) still differ here
    unless they are built alike. A shipped model's description holds its whole shape, and a
    factory's model is named by the factory and its arguments (models.identity): neither needs it
    (Llama 70B's 82 layers take 3 s to build on the meta device)."""
    from ..models.contract import on_meta

    if getattr(model, "factory", None) or type(model).__module__.startswith("dapple_launch.models"):
        return []
    out = []
    with on_meta():
        for spec in model.layers():
            layer = spec.build()
            kind = f"{type(layer).__module__}.{type(layer).__qualname__}"
            tensors = [
                (n, tuple(t.shape), str(t.dtype)) for n, t in (*layer.named_parameters(), *layer.named_buffers())
            ]
            out.append((spec.name, kind, tensors))
    return out


def _key(model, batch_size: int, device_tflops: float, device: str, efficiency: float, precision: str) -> str:
    from ..models import identity
    from ..models.contract import as_tuple

    real, target = model.batch(batch_size)  # shapes and dtypes: what the trace starts from
    ident = json.dumps(
        {
            "format": FORMAT,
            "model": identity(model),
            "class": f"{type(model).__module__}.{type(model).__qualname__}",
            "layers": _layers(model),
            "inputs": [(tuple(t.shape), str(t.dtype)) for t in (*as_tuple(real), *as_tuple(target))],
            "batch": batch_size,
            "device": device,
            "tflops": device_tflops,
            "efficiency": efficiency,
            "precision": precision,
            "torch": _version("torch"),
            "transformers": _version("transformers"),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def loaded_sources() -> dict[str, str]:
    """{path: hash} of every module's source this process has loaded that is not the standard
    library's or an installed package's (this package's own always)."""
    paths = sysconfig.get_paths()
    installed = tuple(paths[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    out = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path or not os.path.isabs(path) or not path.endswith(".py"):
            continue
        if path.startswith(installed) and not name.startswith("dapple_launch"):
            continue
        digest = _digest(path)
        if digest is not None:
            out[path] = digest
    return out


def _read(text: str) -> tuple[dict, ModelProfile]:
    entry = json.loads(text)
    return entry["sources"], ModelProfile.from_json(entry["profile"])


def cached_analytic_profile(
    model,
    batch_size: int,
    device_tflops: float,
    device: str,
    efficiency: float = 0.4,
    precision: str = "32",
) -> ModelProfile:
    """analytic_profile's answer, read back from the cache while the model's code is unchanged,
    else traced and kept."""
    key = _key(model, batch_size, device_tflops, device, efficiency, precision)
    path = cache_dir() / f"analytic-{model.name}-b{batch_size}-{key}.json"
    found = read_cached(path, _read)
    if found is not None:
        sources, profile = found
        if all(_digest(p) == h for p, h in sources.items()):
            return profile
    from .analytic import analytic_profile

    profile = analytic_profile(model, batch_size, device_tflops, device, efficiency, precision)
    try:
        write_cached(path, json.dumps({"sources": loaded_sources(), "profile": profile.to_json()}))
    except OSError:
        pass  # a cache that cannot be written (a read-only or full home) only means tracing again next time
    return profile
