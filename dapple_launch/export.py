"""`python -m dapple_launch.export RUN_DIR_OR_CKPT OUT_DIR`: a checkpoint of `model=hf` or `model=llama` as a Hugging
Face directory (config.json + model.safetensors, a tied weight stored once, as save_pretrained
writes it), whatever layout it was trained on: the checkpoint's shards are per layer range, and every
parameter maps one to one onto its Hugging Face name (models/hf.py, models/llama.py). `AutoModelForCausalLM.
from_pretrained(OUT_DIR)` then gives the trained pipeline's logits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf


def checkpoint_and_run(path: Path) -> tuple[Path, Path]:
    from .runtime.checkpoint import newest_intact

    path = path.expanduser()
    if (path / "checkpoints").is_dir():
        found = newest_intact(path / "checkpoints")
        if found is None:
            raise ValueError(f"{path}/checkpoints holds no checkpoint to export")
        return found, path
    if path.is_dir() and path.parent.name == "checkpoints":
        return path, path.parent.parent
    raise ValueError(
        f"{path} is neither a run directory (with checkpoints/) nor a checkpoint (RUN/checkpoints/stepNNNNNN.ckpt)"
    )


def export(source: Path, out: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    from .models.contract import HFNamed
    from .plan_config import model_from_config
    from .runtime.checkpoint import read_shards

    ckpt, run = checkpoint_and_run(source)
    cfg = OmegaConf.load(run / "config.yaml")
    model = model_from_config(cfg.model)
    if not isinstance(model, HFNamed):
        raise ValueError(
            f"{run} trained model={cfg.model.name}; export writes Hugging Face directories of model=hf "
            f"and model=llama checkpoints"
        )
    state, _ = read_shards(ckpt)
    tensors = {}
    for key, value in state.items():
        _, position, name = key.split(".", 2)
        tensors[model.hf_name(int(position), name)] = value.detach().to(torch.float32).contiguous().clone()
    expected = model.hf_expected()
    missing = sorted(expected - set(tensors))
    if missing:
        raise ValueError(
            f"{ckpt} lacks {len(missing)} of the model's tensors (first: {missing[0]}); it is not a whole "
            f"checkpoint of this model"
        )
    extra = sorted(set(tensors) - expected)
    for name in extra:  # a tied head stored once: under the embedding's name, as Hugging Face stores it
        del tensors[name]
    out.mkdir(parents=True, exist_ok=True)
    config = model.hf_config()
    config.torch_dtype = torch.float32
    config.save_pretrained(out)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return ckpt


def main(argv: list[str] | None = None) -> int:
    from .log import get_logger, setup

    setup()
    parser = argparse.ArgumentParser(
        prog="python -m dapple_launch.export", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("source", type=Path, help="a run directory (its newest checkpoint) or one checkpoint")
    parser.add_argument("out", type=Path, help="the Hugging Face directory to write")
    args = parser.parse_args(argv)
    try:
        ckpt = export(args.source, args.out)
    except ValueError as exc:
        get_logger().error(str(exc))
        return 2
    get_logger().info(f"exported {ckpt} to {args.out} (config.json, model.safetensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
