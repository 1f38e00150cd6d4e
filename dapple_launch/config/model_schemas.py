"""Typed config schemas of the model section (Hydra structured configs): one per family, so a key
that belongs to another family fails with its full path (schemas.py holds the other sections')."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import MISSING

from .choices import BERTPreset, GPTPreset, HFInit, LlamaPreset, ModelName, VGGPreset, _need, _positive


# ---- model: one schema per family ---------------------------------------------------------------
@dataclass
class ModelConfig:
    name: ModelName = MISSING


@dataclass
class TransformerModelConfig(ModelConfig):
    # shape fields: None keeps the preset's value
    num_layers: Optional[int] = None
    hidden: Optional[int] = None
    heads: Optional[int] = None
    seq_len: Optional[int] = None
    vocab_size: Optional[int] = None
    ffn_mult: Optional[int] = None
    dropout: Optional[float] = None
    tie_embeddings: bool = True  # the token embedding and the output projection are one weight (GPT-2)

    def __post_init__(self) -> None:
        _positive(
            "model",
            num_layers=self.num_layers,
            hidden=self.hidden,
            heads=self.heads,
            seq_len=self.seq_len,
            vocab_size=self.vocab_size,
            ffn_mult=self.ffn_mult,
        )
        if self.dropout is not None:
            _need(0 <= self.dropout < 1, "model.dropout", self.dropout, "must be in [0, 1)")


@dataclass
class GPTModelConfig(TransformerModelConfig):
    name: ModelName = ModelName["gpt"]
    preset: GPTPreset = GPTPreset["tiny"]


@dataclass
class BERTModelConfig(TransformerModelConfig):
    name: ModelName = ModelName["bert"]
    preset: BERTPreset = BERTPreset["large"]


@dataclass
class LlamaModelConfig(ModelConfig):
    """A Llama-family decoder (models/llama.py): RMSNorm, rotary embeddings, SwiGLU, grouped-query
    attention. Shape fields: None keeps the preset's value."""

    name: ModelName = ModelName["llama"]
    preset: LlamaPreset = LlamaPreset["tiny"]
    num_layers: Optional[int] = None
    hidden: Optional[int] = None
    heads: Optional[int] = None
    kv_heads: Optional[int] = None  # grouped-query attention: key/value heads (heads divisible by it)
    ffn_hidden: Optional[int] = None  # SwiGLU's inner width
    seq_len: Optional[int] = None
    vocab_size: Optional[int] = None
    rope_theta: Optional[float] = None
    tie_embeddings: Optional[bool] = None

    def __post_init__(self) -> None:
        _positive(
            "model",
            num_layers=self.num_layers,
            hidden=self.hidden,
            heads=self.heads,
            kv_heads=self.kv_heads,
            ffn_hidden=self.ffn_hidden,
            seq_len=self.seq_len,
            vocab_size=self.vocab_size,
        )


@dataclass
class VGGModelConfig(ModelConfig):
    name: ModelName = ModelName["vgg19"]
    preset: VGGPreset = VGGPreset["imagenet"]
    image_size: Optional[int] = None
    num_classes: Optional[int] = None
    width_divisor: Optional[int] = None
    fc_width: Optional[int] = None

    def __post_init__(self) -> None:
        _positive(
            "model",
            image_size=self.image_size,
            num_classes=self.num_classes,
            width_divisor=self.width_divisor,
            fc_width=self.fc_width,
        )


@dataclass
class FromProfileModelConfig(ModelConfig):
    """A PipeDream/DAPPLE graph text profile, planned only (no layers to train)."""

    name: ModelName = ModelName["from_profile"]
    profile: Optional[str] = None  # a path, or a bundled profile's name (bert-48-pbs-2)
    profile_batch_size: Optional[int] = None  # None: a bundled profile's own, or the file name's "-pbs-N"
    parameter_scale: Optional[float] = None  # corrects a profile's parameter unit; None: a bundled profile's own
    profile_device_tflops: Optional[float] = None  # the device the profile was measured on

    def __post_init__(self) -> None:
        _positive("model", profile_batch_size=self.profile_batch_size)
        for key in ("parameter_scale", "profile_device_tflops"):
            value = getattr(self, key)
            if value is not None:
                _need(value > 0, f"model.{key}", value, "must be > 0")


@dataclass
class CustomModelConfig(ModelConfig):
    """Your own PipelineModel: `target` names a factory PACKAGE.MODULE:CALLABLE, called with `args`."""

    name: ModelName = ModelName["custom"]
    target: str = MISSING
    args: Any = None  # a mapping of keyword arguments (model.args={hidden:128} or +model.args.hidden=128)


@dataclass
class HFModelConfig(ModelConfig):
    """Any Hugging Face causal LM from a local directory (models/hf.py): model.path=DIR holds config.json
    and safetensors weights (save_pretrained's layout, sharded or not); or model.config=DIR (a config.json
    only) with init=random, the family's own initialisation."""

    name: ModelName = ModelName["hf"]
    path: Optional[str] = None
    config: Optional[str] = None
    init: HFInit = HFInit["pretrained"]
    seq_len: int = 128  # tokens per sample (the data's windows)

    def __post_init__(self) -> None:
        _positive("model", seq_len=self.seq_len)


MODEL_SCHEMAS = {
    "gpt": GPTModelConfig,
    "bert": BERTModelConfig,
    "vgg19": VGGModelConfig,
    "from_profile": FromProfileModelConfig,
    "custom": CustomModelConfig,
    "hf": HFModelConfig,
    "llama": LlamaModelConfig,
}
