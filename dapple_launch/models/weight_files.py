"""A model directory's safetensors weights, read tensor by tensor: a rank reads its own stage's
tensors only (models/hf.py), never the whole checkpoint."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch


class WeightFiles:
    """The safetensors of a model directory, read tensor by tensor (a rank reads its stage's only)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            self.where = {k: self.path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
        else:
            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise ValueError(
                    f"{self.path}: no *.safetensors weights (model.init=random starts from the family's "
                    f"own initialisation instead)"
                )
            from safetensors import safe_open

            self.where = {}
            for f in files:
                with safe_open(str(f), framework="pt") as h:
                    self.where.update({k: f for k in h.keys()})  # noqa: SIM118 - a safetensors handle, not a dict

    def shapes(self) -> dict[str, tuple]:
        from safetensors import safe_open

        out = {}
        for f in sorted(set(self.where.values())):
            with safe_open(str(f), framework="pt") as h:
                out.update({k: tuple(h.get_slice(k).get_shape()) for k in h.keys()})  # noqa: SIM118 - (as above)
        return out

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self.where[name]), framework="pt") as h:
            return h.get_tensor(name)


@lru_cache(maxsize=4)
def weight_files(path: str) -> WeightFiles:
    """The directory's WeightFiles, indexed once a process (every stage's layers read from it)."""
    return WeightFiles(path)
