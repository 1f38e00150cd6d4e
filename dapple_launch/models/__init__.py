"""The models the configs name. Each is a PipelineModel: an ordered list of layers plus a loss."""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from pathlib import Path

from .contract import LayerSpec, PipelineModel, build_layer
from .llama import LLAMA_PRESETS, Llama
from .transformer import BERT, BERT_PRESETS, GPT, GPT_PRESETS
from .vgg import VGG19, VGG_PRESETS

_FAMILIES = {
    "gpt": (GPT, GPT_PRESETS),
    "bert": (BERT, BERT_PRESETS),
    "vgg19": (VGG19, VGG_PRESETS),
    "llama": (Llama, LLAMA_PRESETS),
}
MODEL_NAMES = sorted(_FAMILIES)


def build_model(name: str, preset: str, **overrides) -> PipelineModel:
    """`overrides` are shape fields (num_layers, hidden, ...); None keeps the preset's value."""
    if name not in _FAMILIES:
        raise ValueError(f"unknown model {name!r}; valid models: {MODEL_NAMES} (or from_profile, custom)")
    cls, presets = _FAMILIES[name]
    if preset not in presets:
        raise ValueError(f"model {name}: unknown preset {preset!r}; valid presets: {sorted(presets)}")
    shape = presets[preset]
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - set(shape.__dataclass_fields__))
    if unknown:
        raise ValueError(f"model {name}: unknown shape fields {unknown}; valid: {sorted(shape.__dataclass_fields__)}")
    return cls(replace(shape, **given), name=name)


def build_custom(target: str, args: dict | None = None) -> PipelineModel:
    """Call the factory `target` (PACKAGE.MODULE:CALLABLE, importable from the working directory or
    the Python path) with `args` as keyword arguments; it must return a PipelineModel."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"model.target={target!r} must name a factory as PACKAGE.MODULE:CALLABLE, e.g. model.target=my_model:build"
        )
    if "" not in sys.path and str(Path.cwd()) not in sys.path:  # `python -m` puts the working directory first
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"model.target={target}: cannot import {module_name} ({exc}); run from the directory that "
            f"holds it or add that directory to PYTHONPATH"
        ) from None
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
    if not callable(factory):
        raise ValueError(f"model.target={target}: {module_name} has no callable {attr!r}")
    args = dict(args or {})
    try:
        model = factory(**args)
    except TypeError as exc:
        raise ValueError(f"model.target={target} refused model.args={args}: {exc}") from None
    if not isinstance(model, PipelineModel):
        raise ValueError(
            f"model.target={target} returned {type(model).__name__}, not a "
            f"dapple_launch.models.PipelineModel (layers(), loss(), batch())"
        )
    if not model.layers():
        raise ValueError(f"model.target={target}: the model has no layers")
    model.factory = {"target": target, "args": args}  # identifies it in checkpoints beside describe()
    return model


def identity(model: PipelineModel) -> dict:
    """What a checkpoint records to refuse a resume into another model."""
    factory = getattr(model, "factory", None)
    return {**model.describe(), **({"factory": factory} if factory else {})}


__all__ = [
    "LayerSpec",
    "PipelineModel",
    "build_layer",
    "build_model",
    "build_custom",
    "identity",
    "MODEL_NAMES",
    "GPT",
    "BERT",
    "VGG19",
    "Llama",
]
