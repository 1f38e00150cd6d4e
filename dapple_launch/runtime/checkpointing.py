"""When checkpoints are taken, which are kept, and what `last.ckpt` points at.

Every `trainer.checkpoint_every_n_steps` steps and at the end of training (and when the ranks stop
on a signal, runtime/signals.py) the ranks save `stepNNNNNN.ckpt` together. Rotation counts what
is on disk, so the checkpoint a run resumed from is counted like any other: the newest
`trainer.keep_checkpoints` complete ones stay. `last.ckpt` is a link replaced atomically to point
at the newest complete checkpoint after every save.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from . import checkpoint as ckpt


class Checkpointing(Callback):
    def __init__(self, dirpath: str | Path, every_n_steps: int, keep: int):
        self.dirpath, self.every, self.keep = Path(dirpath), every_n_steps, keep
        self.saved_step = -1

    def path_for(self, step: int) -> Path:
        return self.dirpath / f"step{step:06d}.ckpt"

    def save(self, trainer) -> Path | None:
        """Save this step (all ranks together), unless it is saved already; rotate; relink last. None:
        not saved, a weight or optimizer value being non-finite on some rank."""
        step = trainer.global_step
        path = self.path_for(step)
        if self.saved_step == step:
            return path
        try:
            trainer.save_checkpoint(str(path))
        except ckpt.NonFiniteState as exc:  # nothing written, nothing rotated: the finite ones stay
            if trainer.is_global_zero:
                from ..log import get_logger

                get_logger().warning(f"step {step} not saved: {exc}")
            return None
        self.saved_step = step
        if trainer.is_global_zero:
            self._rotate_and_link()
        return path

    def _rotate_and_link(self) -> None:
        found = [p for p in ckpt.find_checkpoints(self.dirpath) if p.parent == self.dirpath]
        for old in found[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        newest = found[-1]
        link, tmp = self.dirpath / "last.ckpt", self.dirpath / f".last.ckpt.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(newest.name)
        os.replace(tmp, link)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every == 0:
            self.save(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_step > 0:
            self.save(trainer)  # the final weights, whatever the interval
