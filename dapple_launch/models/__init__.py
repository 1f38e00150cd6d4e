"""The models the configs name. Each is a PipelineModel: an ordered list of layers plus a loss."""
from __future__ import annotations

from dataclasses import replace

from .contract import LayerSpec, PipelineModel, build_layer
from .transformer import BERT, BERT_PRESETS, GPT, GPT_PRESETS
from .vgg import VGG19, VGG_PRESETS

_FAMILIES = {"gpt": (GPT, GPT_PRESETS), "bert": (BERT, BERT_PRESETS), "vgg19": (VGG19, VGG_PRESETS)}
MODEL_NAMES = sorted(_FAMILIES)


def build_model(name: str, preset: str, **overrides) -> PipelineModel:
    """`overrides` are shape fields (num_layers, hidden, ...); None keeps the preset's value."""
    if name not in _FAMILIES:
        raise ValueError(f"unknown model {name!r}; valid models: {MODEL_NAMES} (or from_profile)")
    cls, presets = _FAMILIES[name]
    if preset not in presets:
        raise ValueError(f"model {name}: unknown preset {preset!r}; valid presets: {sorted(presets)}")
    shape = presets[preset]
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - set(shape.__dataclass_fields__))
    if unknown:
        raise ValueError(f"model {name}: unknown shape fields {unknown}; valid: {sorted(shape.__dataclass_fields__)}")
    return cls(replace(shape, **given), name=name)


__all__ = ["LayerSpec", "PipelineModel", "build_layer", "build_model", "MODEL_NAMES", "GPT", "BERT", "VGG19"]
