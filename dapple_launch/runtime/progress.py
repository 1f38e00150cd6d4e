"""One progress bar over the run's steps, and the numbers the closing summary reports.

Lightning's bar restarts every epoch; a run here is bounded by steps, so rank 0 shows one bar from
the first step to `trainer.max_steps` (a resumed run starts where it left off), with the loss. When
its output is not a terminal (a log file, CI, Slurm), it prints a plain line every twentieth of
the run instead of carriage returns. At the end rank 0 writes RUN_DIR/summary.json: steps, final
train and validation loss, the measured seconds per iteration against the plan's estimate, the
whole training step, samples per second; the launcher prints it. Medians, the first two steps left
out as warm-up. The estimate describes the pipeline: the schedule's actions and the gradient
all-reduces (DappleStrategy.pipeline_s times that span); the whole step adds the optimizer step,
moving the batch and Lightning's hooks, which no plan changes. Comparing the estimate with the
whole step would blame the plan for them. On GPUs it adds each rank's peak of allocated device
memory (`torch.cuda.max_memory_allocated`) against the plan's estimate for that rank's stages.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any, cast

import torch
from lightning.pytorch.callbacks import Callback

from .clock import perf
from .heartbeat import BEAT


class Progress(Callback):
    def __init__(
        self,
        max_steps: int,
        global_batch: int,
        estimate_s: float,
        run_dir: str | Path,
        show: bool = True,
        estimated_peak_bytes: list[float] | None = None,
    ):
        self.max_steps, self.global_batch, self.estimate_s = max_steps, global_batch, estimate_s
        self.estimated_peak_bytes = estimated_peak_bytes  # per stage, the plan's
        self.run_dir, self.show = Path(run_dir), show
        self.step_s: list[float] = []
        self.train_loss: float | None = None
        self.first_train_loss: float | None = None  # this run's first step's (a resumed run's too)
        self.val_loss: float | None = None
        self.first_step = 0
        self._bar = None
        self._t0 = 0.0
        self._every = max(1, max_steps // 20)

    def on_train_start(self, trainer, pl_module) -> None:
        self.first_step = trainer.global_step
        if trainer.is_global_zero and self.show and sys.stdout.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.max_steps, initial=self.first_step, unit="step", dynamic_ncols=True, desc="training"
            )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        BEAT.step(trainer.global_step + 1)
        self._t0 = perf(pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.step_s.append(perf(pl_module.device) - self._t0)
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.train_loss = float(cast(Any, loss)) if loss is not None else self.train_loss
        if self.first_train_loss is None:
            self.first_train_loss = self.train_loss
        if not trainer.is_global_zero or not self.show:
            return
        step = trainer.global_step
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{self.train_loss:.4f}", refresh=False)
        elif step % self._every == 0 or step == self.max_steps:
            from ..log import get_logger

            get_logger().info(
                f"step {step}/{self.max_steps}  loss {self.train_loss:.4f}  {self.step_s[-1]:.3f} s/iteration"
            )

    def on_validation_end(self, trainer, pl_module) -> None:
        v = trainer.callback_metrics.get("val_loss")
        if v is not None:
            self.val_loss = float(v)

    def measured_s(self) -> float | None:
        """Median seconds of a whole training step."""
        return _steady_median(self.step_s)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._bar is not None:
            self._bar.close()
        memory = self._device_memory(trainer, pl_module.device)  # a collective: every rank takes part
        if not trainer.is_global_zero:
            return
        step = self.measured_s()
        # a pipelined run: its pipeline span, what the estimate describes; one process: the step
        pipeline = _steady_median(getattr(trainer.strategy, "pipeline_s", None) or []) or step
        summary = {
            "steps": [self.first_step, trainer.global_step],
            "train_loss": self.train_loss,
            "first_train_loss": self.first_train_loss,
            "val_loss": self.val_loss,
            "measured_s_per_iteration": pipeline,
            "estimated_s_per_iteration": self.estimate_s,
            "measured_s_per_step": step,
            "samples_per_s": self.global_batch / step if step else None,
            # steps skipped for a non-finite loss or gradient norm (16-mixed overflows aside)
            "skipped_steps": getattr(pl_module, "bad_steps", 0),
            "loss_scale_overflows": getattr(getattr(pl_module, "scaler", None), "skipped", 0),
            **memory,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))

    def _device_memory(self, trainer, device: torch.device) -> dict:
        """On a GPU run, per rank the peak of allocated device memory and the plan's estimate for its
        stages (the largest, for a rank holding several); nothing on CPU, where no allocator counts
        a rank's tensors apart from the process's other memory."""
        if device.type != "cuda":
            return {}
        stages = getattr(trainer.strategy, "local_stages", (0,))
        # an allocation the cache could not serve until it freed its cached blocks: each retry syncs the
        # device, so a run planned close to the card's memory is slower than its estimate says
        retries = int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))
        mine = [trainer.global_rank, float(torch.cuda.max_memory_allocated(device)), list(stages), retries]
        ranks = [mine]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            ranks = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(ranks, mine)
        est = self.estimated_peak_bytes
        rows = [
            {
                "rank": r,
                "stages": st,
                "peak_bytes": peak,
                "estimated_peak_bytes": max(est[s] for s in st) if est else None,
                "allocator_retries": n,
            }
            for r, peak, st, n in sorted(x for x in ranks if x is not None)
        ]
        worst = max(rows, key=lambda x: x["peak_bytes"])
        return {
            "device_memory": rows,
            "measured_peak_memory_bytes": worst["peak_bytes"],
            "estimated_peak_memory_bytes": max(est) if est else None,
            "allocator_retries": max(x["allocator_retries"] for x in rows),
        }


def _steady_median(times: list[float]) -> float | None:
    steady = times[2:] or times
    return statistics.median(steady) if steady else None
