"""Layout-independent, atomic checkpoints.

A checkpoint is a directory `NAME.ckpt/`:
  meta.pt              Lightning's checkpoint (loops, schedulers, callbacks, data position) without
                       weights, plus the model description and the plan that wrote it
  stage-A-B.pt         layers [A, B): every parameter and optimizer state under its global name
  COMPLETE             written last
All ranks write into `NAME.ckpt.tmp/`; after a barrier rank 0 writes COMPLETE and renames the
directory into place, so a crash mid-save leaves only a `.tmp` directory that nothing loads.
Any layout loads it: each rank reads the shards and keeps the names of its own layers.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

COMPLETE = "COMPLETE"
_LAYER = re.compile(r"^layers\.(\d+)\.")


def layer_of(name: str) -> int:
    m = _LAYER.match(name)
    if not m:
        raise ValueError(f"parameter {name!r} is not under layers.<index>: the model contract keeps every "
                         f"weight inside a layer")
    return int(m.group(1))


def tmp_dir(path: str | Path) -> Path:
    return Path(str(path) + ".tmp")


def write_shard(path: str | Path, start: int, stop: int, state: dict, optimizer: dict) -> None:
    d = tmp_dir(path)
    d.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "optimizer": optimizer}, d / f"stage-{start:05d}-{stop:05d}.pt")


def write_meta_and_commit(path: str | Path, meta: dict) -> None:
    path, d = Path(path), tmp_dir(path)
    d.mkdir(parents=True, exist_ok=True)
    torch.save(meta, d / "meta.pt")
    (d / COMPLETE).write_text("ok\n")
    for f in d.iterdir():  # make the bytes durable before the rename makes them visible
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if path.exists() or path.is_symlink():
        old = Path(str(path) + ".old")
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
        d.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        d.rename(path)


def is_complete(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / COMPLETE).is_file() and (p / "meta.pt").is_file()


def read_meta(path: str | Path) -> dict:
    if not is_complete(path):
        raise ValueError(f"{path} is not a complete dapple checkpoint (no {COMPLETE} marker or meta.pt): it may "
                         f"be a save that was interrupted; pick another checkpoint")
    return torch.load(Path(path) / "meta.pt", map_location="cpu", weights_only=False)


def read_shards(path: str | Path, keep_layers: set[int] | None = None) -> tuple[dict, dict]:
    """(state_dict, optimizer state by name) for the kept layers (all if None)."""
    state, optim = {}, {"state": {}, "param_groups": None}
    for shard in sorted(Path(path).glob("stage-*.pt")):
        a, b = map(int, shard.stem.split("-")[1:])
        if keep_layers is not None and not keep_layers.intersection(range(a, b)):
            continue
        data = torch.load(shard, map_location="cpu", weights_only=False)
        for k, v in data["state_dict"].items():
            if keep_layers is None or layer_of(k) in keep_layers:
                state[k] = v
        opt = data["optimizer"]
        if opt:
            optim["param_groups"] = optim["param_groups"] or opt["param_groups"]
            for k, v in opt["state"].items():
                if keep_layers is None or layer_of(k) in keep_layers:
                    optim["state"][k] = v
    return state, optim


def optimizer_state_by_name(opt_state: dict, names: list[list[str]]) -> dict:
    """torch's index-keyed optimizer state -> keyed by global parameter name."""
    by_name, groups = {}, []
    for g, group in enumerate(opt_state["param_groups"]):
        for idx, name in zip(group["params"], names[g]):
            if idx in opt_state["state"]:
                by_name[name] = opt_state["state"][idx]
        groups.append({k: v for k, v in group.items() if k != "params"})
    return {"state": by_name, "param_groups": groups}


def optimizer_state_by_index(saved: dict, current: dict, names: list[list[str]]) -> dict:
    """Name-keyed state -> the index-keyed form the current (local) optimizer loads."""
    state, groups = {}, []
    for g, group in enumerate(current["param_groups"]):
        hyper = saved["param_groups"][g] if saved.get("param_groups") else {}
        groups.append({**group, **hyper, "params": group["params"]})
        for idx, name in zip(group["params"], names[g]):
            if name in saved["state"]:
                state[idx] = saved["state"][name]
    return {"state": state, "param_groups": groups}


def find_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints below root, oldest first by global step (then by mtime)."""
    found = [p for p in Path(root).rglob("*.ckpt") if not p.is_symlink() and is_complete(p)]

    def key(p: Path):
        try:
            step = int(read_meta(p).get("global_step", -1))
        except Exception:  # noqa: BLE001 - an unreadable meta ranks first and is never chosen as newest
            step = -1
        return step, p.stat().st_mtime
    return sorted(found, key=key)
