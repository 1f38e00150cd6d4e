"""The model a config's `model` section describes, built as every rank and the profiling job build it."""

from __future__ import annotations

from functools import lru_cache

from omegaconf import DictConfig, OmegaConf

from . import PipelineModel, build_custom, build_model

_SHAPE_KEYS = {
    "gpt": ("num_layers", "hidden", "heads", "seq_len", "vocab_size", "ffn_mult", "dropout", "tie_embeddings"),
    "vgg19": ("image_size", "num_classes", "width_divisor", "fc_width"),
}
_SHAPE_KEYS["bert"] = _SHAPE_KEYS["gpt"]
_SHAPE_KEYS["llama"] = (
    "num_layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn_hidden",
    "seq_len",
    "vocab_size",
    "rope_theta",
    "tie_embeddings",
)


def model_from_config(m: DictConfig) -> PipelineModel:
    if m.name == "from_profile":
        raise ValueError(
            "model=from_profile describes a profile only, for planning (dry_run=true); it has no "
            "layers to train: pick model=gpt, bert, vgg19 or custom to train"
        )
    if m.name == "custom":
        args = OmegaConf.to_container(m.args, resolve=True) if isinstance(m.args, DictConfig) else m.args
        if args is not None and not isinstance(args, dict):
            raise ValueError(
                f"model.args={args!r} must be a mapping of keyword arguments, e.g. model.args={{hidden:128,layers:6}}"
            )
        return build_custom(m.target, args)
    if m.name == "hf":
        return _hf_model(m.path, m.config, str(m.init), int(m.seq_len))
    return build_model(str(m.name), str(m.preset), **{k: m[k] for k in _SHAPE_KEYS[str(m.name)]})


@lru_cache(maxsize=4)
def _hf_model(path, config, init: str, seq_len: int) -> PipelineModel:
    """Read once per process: the family's anatomy from its config, the weights' headers checked."""
    from .hf import HFCausalLM

    return HFCausalLM(path=path, config_dir=config, init=init, seq_len=seq_len)
