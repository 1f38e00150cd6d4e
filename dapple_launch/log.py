"""One rank-aware logger for the tool's own lines, and the third-party noise kept out of them.

The launcher's lines are plain; a rank's carry its place in the grid (`[rank 2 · stage 1 ·
replica 0]`) so a line in logs/rank-N.log, or a rank 0 line in the terminal, says who wrote it.
Warnings and errors go to stderr, the rest to stdout. Lightning's and wandb's banners (hardware
lines, distributed set-up, tips advertising other products) are below the level shown, and the
warnings known to be false for this tool are filtered out (each with the reason beside it).
"""

from __future__ import annotations

import logging
import re
import sys
import warnings

NAME = "dapple_launch"


class _Format(logging.Formatter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        head = (
            "warning: " if record.levelno == logging.WARNING else "error: " if record.levelno >= logging.ERROR else ""
        )
        return f"{self.prefix}{head}{record.getMessage()}"


class _Below(logging.Filter):
    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level


def get_logger() -> logging.Logger:
    return logging.getLogger(NAME)


def setup(prefix: str = "") -> logging.Logger:
    """Route the tool's logger to stdout (info) and stderr (warnings and errors); idempotent."""
    log = get_logger()
    log.handlers.clear()
    log.setLevel(logging.INFO)
    log.propagate = False
    out = logging.StreamHandler(sys.stdout)
    out.addFilter(_Below(logging.WARNING))
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    for h in (out, err):
        h.setFormatter(_Format(prefix))
        log.addHandler(h)
    return log


def rank_prefix(rank: int, stage: int | None = None, replica: int | None = None) -> str:
    where = f" · stage {stage} · replica {replica}" if stage is not None else ""
    return f"[rank {rank}{where}] "


# (message pattern, why it is false or noise here)
KNOWN_WARNINGS = [
    ("It is recommended to use `self.log", "the loss is broadcast from the last stage: every rank logs the same value"),
    ("Using ModelCheckpoint with manual optimization", "checkpoints are taken after the optimizer step on purpose"),
    ("`isinstance(treespec, LeafSpec)` is deprecated", "inside torch, not this tool"),
    ("The number of training batches", "a run is bounded by steps, not epochs"),
    ("your dataloader is not resumable", "the global batch sampler resumes exactly (data/datasets.py)"),
    (
        "The `srun` command is available on your system but is not used",
        "ranks are started by this tool's launcher, not by srun",
    ),
    ("does not have many workers", "every rank reads the same small global batch; workers only add processes"),
    (
        "Detected call of `lr_scheduler.step()` before `optimizer.step()`",
        "a 16-mixed step skipped for an inf/NaN gradient still advances the schedule, as torch.amp does",
    ),
    ("Found an `on_save_checkpoint` hook", "it is this tool's own"),
    ("The '.*_dataloader' does not have many workers", "see above"),
]


def quiet_third_party() -> None:
    """Lightning's and wandb's info banners below the level shown; the known-false warnings gone."""
    for name in (
        "lightning",
        "lightning.pytorch",
        "lightning.fabric",
        "pytorch_lightning",
        "wandb",
        "torch.distributed",
        "matplotlib",  # on a machine with it, something the ranks import builds its font cache once, at INFO
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    for text, _why in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=f".*{text if '.*' in text else re.escape(text)}.*")
