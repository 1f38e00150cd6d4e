"""Layout-independent, atomic, verified checkpoints.

A checkpoint is a directory `NAME.ckpt/`:
  stage-A-B.pt     layers [A, B): every parameter and optimizer state under its global name
  meta.pt          Lightning's checkpoint (loops, schedulers, callbacks, data position) without
                   weights, plus the model's identity and the plan that wrote it
  manifest.json    every file above with its size and SHA-256, and the step
  COMPLETE         written last
Every save writes into a fresh `NAME.ckpt.tmp-<nonce>/` (never a directory a crashed save left):
each rank writes its shard and a sidecar with the shard's size and digest (taken while writing);
after they agree that every shard is written, rank 0 writes meta.pt, the manifest and COMPLETE,
makes them durable and renames the directory into place. A crash mid-save leaves only a `.tmp-`
directory that nothing loads and the next start removes. Loading reads only the files the
manifest lists, after checking their sizes and digests: a flipped byte, a truncated or missing
shard, or a damaged meta.pt is refused with the file named. Any layout loads a checkpoint: each
rank reads the shards and keeps the names of its own layers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, cast

import torch

COMPLETE = "COMPLETE"
MANIFEST = "manifest.json"
_LAYER = re.compile(r"^layers\.(\d+)\.")
_STEP = re.compile(r"step(\d+)")
_CHUNK = 1 << 22


class CheckpointError(ValueError):
    """A checkpoint that must not be loaded: the file and the reason."""


class NonFiniteState(RuntimeError):
    """A save refused because a weight or optimizer value is inf or NaN on some rank: such a
    checkpoint would poison every resume, and its rotation would delete the finite ones."""


def all_finite(tensors) -> bool:
    """No inf or NaN in any floating tensor of `tensors` (one fused pass over them)."""
    import torch

    by_device: dict = {}  # Adam's `step` lives on the CPU beside GPU moments: one pass per device
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            by_device.setdefault(t.device, []).append(t)
    return all(
        bool(torch.isfinite(torch.stack([n.float() for n in torch._foreach_norm(ts)])).all())
        for ts in by_device.values()
    )


def layer_of(name: str) -> int:
    m = _LAYER.match(name)
    if not m:
        raise ValueError(
            f"parameter {name!r} is not under layers.<index>: the model contract keeps every weight inside a layer"
        )
    return int(m.group(1))


class _Hashing:
    """A file that digests what is written through it (torch.save writes through this). Writes go
    to the descriptor at once, in full or failing: a full disk raises OSError (ENOSPC) inside the
    write that hit it, not as a mismatch deep in torch's archive writer."""

    def __init__(self, fd: int):
        self.fd, self.digest, self.size = fd, hashlib.sha256(), 0
        self.error: OSError | None = None  # torch's writer turns it into "unexpected pos": keep the cause

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        self.digest.update(view)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            self.error = self.error or exc
            raise
        self.size += len(b)
        return len(b)

    def flush(self) -> None:
        pass


def _save(obj, path: Path) -> dict:
    """torch.save into `path`, made durable; its size and SHA-256."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    w = _Hashing(fd)
    try:
        torch.save(obj, cast(Any, w))  # (a file-like object: write and flush are all torch.save calls)
        os.fsync(fd)
    except RuntimeError:
        if w.error is not None:
            raise OSError(w.error.errno, w.error.strerror, str(path)) from None
        raise
    finally:
        os.close(fd)
    return {"size": w.size, "sha256": w.digest.hexdigest()}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fresh_tmp(path: str | Path, nonce: str) -> Path:
    return Path(f"{path}.tmp-{nonce}")


def write_shard(tmp: Path, start: int, stop: int, state: dict, optimizer: dict) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    name = f"stage-{start:05d}-{stop:05d}.pt"
    entry = _save({"state_dict": state, "optimizer": optimizer}, tmp / name)
    (tmp / f"{name}.sum").write_text(json.dumps(entry))


def commit(path: str | Path, tmp: Path, meta: dict, step: int) -> None:
    """Rank 0, once every shard is written: meta.pt, the manifest, COMPLETE; then into place."""
    path = Path(path)
    files = {}
    for s in sorted(tmp.glob("*.pt.sum")):
        files[s.name[:-4]] = json.loads(s.read_text())
        s.unlink()
    files["meta.pt"] = _save(meta, tmp / "meta.pt")
    (tmp / MANIFEST).write_text(json.dumps({"format": 1, "step": step, "files": files}, indent=1))
    (tmp / COMPLETE).write_text("ok\n")
    for name in (MANIFEST, COMPLETE):
        with open(tmp / name, "rb") as fh:
            os.fsync(fh.fileno())
    if path.exists() or path.is_symlink():  # a save of the same step replaces it whole
        old = Path(f"{tmp}.old")
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(path)
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_complete(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / COMPLETE).is_file()


def manifest(path: str | Path) -> dict:
    p = Path(path)
    try:
        m = json.loads((p / MANIFEST).read_text())
        if not isinstance(m.get("files"), dict):
            raise ValueError("no file list")
        return m
    except FileNotFoundError:
        raise CheckpointError(f"{p / MANIFEST} is missing: the checkpoint cannot be verified") from None
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{p / MANIFEST} is unreadable ({exc})") from None


def verify(path: str | Path) -> dict:
    """Check every file the manifest lists (size, then SHA-256); the manifest. Nothing is changed."""
    p = Path(path)
    if not is_complete(p):
        raise CheckpointError(f"{p} is not a complete checkpoint (no {COMPLETE} marker: a save that did not finish)")
    m = manifest(p)
    for name, entry in m["files"].items():
        f = p / name
        if not f.is_file():
            raise CheckpointError(f"{f} is missing (the manifest lists it)")
        size = f.stat().st_size
        if size != entry["size"]:
            raise CheckpointError(f"{f} has {size} bytes but was written with {entry['size']} (truncated or changed)")
        if sha256_of(f) != entry["sha256"]:
            raise CheckpointError(f"{f} does not match its checksum: its bytes changed after it was written")
    return m


def step_of(path: str | Path) -> int:
    """A checkpoint's step: its manifest's, else the one in its name (-1 if neither says)."""
    p = Path(path)
    try:
        return int(json.loads((p / MANIFEST).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        m = _STEP.search(p.name)
        return int(m.group(1)) if m else -1


def read_meta(path: str | Path) -> dict:
    p = Path(path)
    if not is_complete(p):
        raise CheckpointError(f"{p} is not a complete checkpoint (no {COMPLETE} marker: a save that did not finish)")
    try:
        return torch.load(p / "meta.pt", map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"{p / 'meta.pt'} cannot be read ({type(exc).__name__}: {str(exc)[:120]})") from None


def _shard_files(p: Path) -> list[Path]:
    """The shards to read: the ones the manifest lists (a stray file is never read)."""
    try:
        listed = manifest(p)["files"]
        return sorted(p / n for n in listed if n.startswith("stage-"))
    except CheckpointError:
        if (p / MANIFEST).exists():
            raise
        return sorted(p.glob("stage-*.pt"))  # written before manifests: every shard there


def read_shards(path: str | Path, keep_layers: set[int] | None = None) -> tuple[dict, dict]:
    """(state_dict, optimizer state by name) for the kept layers (all if None)."""
    state, optim = {}, {"state": {}, "param_groups": None}
    for shard in _shard_files(Path(path)):
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


def check_compatible(meta: dict, model: dict, path) -> None:
    """Refuse a checkpoint of another model (its identity, models.identity, differs)."""
    saved = meta.get("dapple", {}).get("model")
    if saved != model:
        diff = {
            k: (saved.get(k) if saved else None, model.get(k))
            for k in set(model) | set(saved or {})
            if (saved or {}).get(k) != model.get(k)
        }
        raise ValueError(
            f"checkpoint {path} was saved from another model: {diff} (saved, this run); resume it "
            f"with the same model config, or start fresh without ckpt_path"
        )


def find_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints below root (COMPLETE written), oldest first by step. Not verified:
    `newest_intact` checks the one a resume would use."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.rglob("*.ckpt") if not p.is_symlink() and is_complete(p)]
    return sorted(found, key=lambda p: (step_of(p), p.stat().st_mtime))


def newest_intact(root: str | Path) -> Path | None:
    """The newest checkpoint below root, verified. If it is damaged, refuse (never fall back to an
    older one silently): the message names the damage and the newest intact one to ask for."""
    found = find_checkpoints(root)
    if not found:
        return None
    try:
        verify(found[-1])
        return found[-1]
    except CheckpointError as damage:
        older = None
        for p in reversed(found[:-1]):
            try:
                verify(p)
                older = p
                break
            except CheckpointError:
                continue
        fix = (
            f"the newest intact one is {older} (step {step_of(older)}): resume from it with ckpt_path={older}"
            if older
            else "no older checkpoint is intact either: start fresh without ckpt_path"
        )
        raise CheckpointError(
            f"the newest checkpoint {found[-1].name} (step {step_of(found[-1])}) is damaged: "
            f"{damage}; {fix}. Nothing on disk was changed"
        ) from None


def crash_leftovers(root: str | Path) -> list[Path]:
    """Directories crashed saves left: `*.ckpt.tmp*` and `*.ckpt.tmp-*.old`."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and re.search(r"\.ckpt\.tmp", p.name))


def remove_leftovers(root: str | Path) -> list[Path]:
    gone = crash_leftovers(root)
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone
