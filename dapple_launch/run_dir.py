"""The run directory: what a run leaves there, and the rules that keep saved work safe.

- One launch per run directory: a lock (flock on RUN_DIR/.lock, released when its holder exits,
  however it exits) refuses a second launch with the holder's pid and host.
- Each launch writes what its ranks read into its own snapshot directory
  (RUN_DIR/.dapple/launch-*/), never a file a later launch could replace; plan.json and config.yaml
  at the top are the user's copies of the newest launch.
- A resume verifies its checkpoint before any rank starts (runtime/checkpoint.py); crashed saves'
  leftovers are removed only once everything is checked.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import cast

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf._utils import get_omega_conf_dumper

from .log import get_logger
from .planner.plan import Plan
from .runtime import checkpoint as ckpt

LOCK = ".lock"


def storage_refusal(exc: OSError, path) -> ValueError:
    """A failed write as one line: the path and what the errno means."""
    what = os.strerror(exc.errno) if exc.errno else str(exc)
    fixes: dict[int | None, str] = {
        errno.EACCES: "choose a writable hydra.run.dir",
        errno.EROFS: "choose a hydra.run.dir on a writable disk",
        errno.ENOSPC: "free space there or choose another hydra.run.dir",
    }
    fix = fixes.get(exc.errno, "")
    return ValueError(f"cannot write {exc.filename or path}: {what}" + (f"; {fix}" if fix else ""))


class RunLock:
    """Held for a launch's lifetime; the kernel releases it when the holder exits."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise storage_refusal(exc, self.path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ValueError(
                f"run directory {self.path.parent} is in use by another launch ({holder}); wait for it "
                f"to end, stop it, or choose another hydra.run.dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(
            fd,
            json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
            ).encode(),
        )
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info.get('pid')} on {info.get('host')}, since {info.get('since')}"
    except (OSError, ValueError):
        return "its pid is not recorded yet"


def check_unlocked(run_dir: Path) -> None:
    """Refuse early (before Hydra writes anything there) if another launch holds the directory."""
    if (run_dir / LOCK).is_file():
        RunLock(run_dir).acquire().release()


def resolve_checkpoint(cfg: DictConfig, run_dir: Path, model_identity: dict) -> str | None:
    """The checkpoint to resume (None for a fresh run), verified before any process starts."""
    root = run_dir / "checkpoints"
    path = cfg.ckpt_path
    if path is None:
        existing = ckpt.find_checkpoints(root)
        if existing and not cfg.overwrite:
            raise ValueError(
                f"run directory {run_dir} already holds {len(existing)} checkpoint(s) (newest: {existing[-1].name}); "
                f"a new run would overwrite them. Resume with ckpt_path=last, pick another hydra.run.dir, or pass "
                f"overwrite=true to move them aside"
            )
        return None
    if path == "last":
        found = ckpt.newest_intact(root)
        if found is None:
            raise ValueError(
                f"ckpt_path=last but {root} holds no complete checkpoint; start without ckpt_path, or "
                f"point hydra.run.dir at the run to resume"
            )
        path = found
    else:
        p = Path(str(path)).expanduser()
        if not p.exists():
            raise ValueError(
                f"ckpt_path={path} does not exist; give a checkpoint directory (RUN/checkpoints/"
                f"stepNNNNNN.ckpt) or ckpt_path=last"
            )
        ckpt.verify(p)
        path = p
    meta = ckpt.read_meta(path)
    ckpt.check_compatible(meta, model_identity, path)
    warn_if_schedule_rebased(cfg, meta)
    return str(Path(path).resolve())


def warn_if_schedule_rebased(cfg: DictConfig, meta: dict) -> None:
    """A resume with a longer trainer.max_steps and no trainer.lr_decay_steps stretches the cosine
    schedule the checkpoint was following: say so, with the learning rate before and after."""
    saved = meta.get("lr_schedule")
    t = cfg.trainer
    if not saved or t.lr_decay_steps is not None:
        return
    old, new, step = int(saved["decay_steps"]), int(t.max_steps), int(meta.get("global_step", 0))
    if old == new:
        return
    from .runtime.lr import lr_factor

    before, after = (t.lr * lr_factor(step, int(saved["warmup_steps"]), d) for d in (old, new))
    get_logger().warning(
        f"trainer.max_steps={new} but the checkpoint's cosine schedule decays over {old} steps and "
        f"trainer.lr_decay_steps is not set: the schedule is re-based to {new} steps (at step {step} the learning "
        f"rate goes from {before:.3g} to {after:.3g}); set trainer.lr_decay_steps={old} to continue the saved one"
    )


def prepare(cfg: DictConfig, run_dir: Path) -> None:
    """Just before launching, once everything is checked: move replaced checkpoints aside
    (overwrite=true) and remove what crashed saves left."""
    log = get_logger()
    root = run_dir / "checkpoints"
    if cfg.ckpt_path is None and cfg.overwrite and ckpt.find_checkpoints(root):
        aside = run_dir / f"checkpoints.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        root.rename(aside)
        log.info(f"overwrite=true: moved the earlier checkpoints to {aside}")
    for gone in ckpt.remove_leftovers(root):
        log.info(f"removed {gone}: an unfinished save a crash left behind")


def write_run_files(cfg: DictConfig, plan: Plan, run_dir: Path) -> Path:
    """plan.json and config.yaml for the user, and this launch's snapshot for its ranks (returned)."""
    # The config resolved but for its plan, which goes in as plain data: resolving `${dapple_plan:}`
    # builds the plan's every action as a config node, and a config made of the whole took as long
    # again (GPT large on 16 V100s, 13 stages × 64 micro-batches: 3.8 of a dry run's 17 s). Dumped as
    # OmegaConf.to_yaml dumps, in the config's order: the same text.
    rest = cast(
        dict,
        OmegaConf.to_container(
            OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "plan"]), resolve=True, enum_to_str=True
        ),
    )
    data = {str(k): json.loads(plan.to_json()) if k == "plan" else rest[k] for k in cfg}
    text = yaml.dump(
        data, default_flow_style=False, allow_unicode=True, sort_keys=False, Dumper=get_omega_conf_dumper()
    )
    snapshot = run_dir / ".dapple" / f"launch-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        snapshot.mkdir(parents=True, exist_ok=True)
        for where in (run_dir, snapshot):
            plan.save(where / "plan.json")
            tmp = where / "config.yaml.tmp"
            tmp.write_text(text)
            tmp.replace(where / "config.yaml")
    except OSError as exc:
        raise storage_refusal(exc, run_dir) from None
    return snapshot
