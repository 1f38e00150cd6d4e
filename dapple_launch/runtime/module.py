"""The LightningModule that trains any PipelineModel, alone or through DappleStrategy.

Under DappleStrategy it materialises only this rank's layers and hands each step to the
strategy's schedule; under any other strategy (one process: the reference) it runs all layers.
Optimisation is manual because the schedule runs backward inside the step.
"""

from __future__ import annotations

from typing import Any, cast

import lightning as L
import torch
from torch import nn

from ..data.rank_batch import global_size
from ..models.contract import PipelineModel, batch_size, build_layer, run_layers
from .lr import lr_factor
from .precision import LossScaler, MixedPrecision, grads_finite
from .tied import tie_local


class PipelineModule(L.LightningModule):
    def __init__(
        self,
        model: PipelineModel,
        lr: float = 3e-3,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        total_steps: int = 0,
        gradient_clip_val: float | None = None,
        seed: int = 0,
        precision: str = "32",
        max_bad_steps: int = 10,
    ):
        super().__init__()
        self.model, self.seed = model, seed
        self.lr, self.weight_decay, self.warmup_steps, self.total_steps = lr, weight_decay, warmup_steps, total_steps
        self.gradient_clip_val = gradient_clip_val
        self.precision_name = precision
        self.scaler = LossScaler(enabled=precision == "16-mixed")
        self.automatic_optimization = False
        self.layers = nn.ModuleDict()  # keys are global layer positions: "layers.17.weight" on every layout
        self.max_bad_steps = max_bad_steps
        self.bad_steps = 0  # steps skipped for a non-finite loss or gradient (16-mixed overflows aside)
        self.bad_in_row = 0
        self.first_bad_step = 0

    def mixed_precision(self) -> MixedPrecision:
        return MixedPrecision(self.precision_name, self.device.type)

    def configure_model(self) -> None:
        if len(self.layers):
            return
        indices = getattr(self.trainer.strategy, "local_layer_indices", None) if self._trainer else None
        self.materialize(indices)

    def materialize(self, indices: list[int] | None = None) -> PipelineModule:
        specs = self.model.layers()
        for i in indices if indices is not None else range(len(specs)):
            self.layers[str(i)] = build_layer(specs[i], i, self.seed)
        tie_local(self.layers, self.model, self.seed)
        return self

    def local_stack(self) -> list[nn.Module]:
        return [self.layers[k] for k in sorted(self.layers, key=int)]

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: lr_factor(step, self.warmup_steps, self.total_steps)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- steps ----------------------------------------------------------------------------
    def reference_loss(self, batch) -> torch.Tensor:
        """Every layer in this process, the whole batch at once, under the run's precision."""
        x, y = batch
        with self.mixed_precision().autocast():
            return self.model.loss(run_layers(self.local_stack(), x), y).sum() / batch_size(x)

    def _pipelined(self) -> bool:
        return hasattr(self.trainer.strategy, "pipeline_train_step")

    def training_step(self, batch, batch_idx):
        # one optimizer and one step-wise scheduler (configure_optimizers); the strategy a DappleStrategy
        # when pipelined (_pipelined), Lightning's own otherwise
        opt, sched = cast(Any, self.optimizers()), cast(Any, self.lr_schedulers())
        strategy = cast(Any, self.trainer.strategy)
        scale = self.scaler.scale
        clip = self.gradient_clip_val
        step = self.trainer.global_step + 1  # the step being taken, as the progress line counts it
        if self._pipelined():
            loss = strategy.pipeline_train_step(batch, loss_scale=scale)
            finite, _ = strategy.finish_gradients(scale, clip, loss)
        else:
            loss = self.reference_loss(batch)
            self.manual_backward(loss * scale)
            loss = loss.detach()
            finite = bool(torch.isfinite(loss)) and grads_finite(self.parameters())
            if finite:
                if scale != 1.0:
                    for p in self.parameters():
                        if p.grad is not None:
                            p.grad.div_(scale)
                if clip:
                    torch.nn.utils.clip_grad_norm_(self.parameters(), clip)
        # A step with a non-finite loss or gradient on any rank is skipped on every rank alike: the
        # strategy leaves the weights and the optimizer as they are, the step still counts. Under
        # 16-mixed an overflow of the scaled gradients is the scaler's business (the scale halves);
        # anything else non-finite is a bad step, counted, and too many in a row stop the run.
        if self._pipelined():
            strategy.skip_next_step = not finite
        if finite or self._pipelined():
            opt.step()
        overflow = not finite and self.scaler.enabled and bool(torch.isfinite(loss))
        self.scaler.update(found_inf=not finite)
        if not finite and not overflow:
            self._bad_step(step)
        elif finite:
            self.bad_in_row = 0
        opt.zero_grad(set_to_none=True)
        sched.step()
        # The loss is already the same on every rank, so no sync is needed for monitors to agree.
        self.log("train_loss", loss, prog_bar=True, batch_size=global_size(batch))
        return loss

    def _bad_step(self, step: int) -> None:
        self.bad_steps += 1
        self.bad_in_row += 1
        if self.bad_in_row == 1:
            self.first_bad_step = step
        limit = self.max_bad_steps
        from ..log import get_logger

        if self.trainer.is_global_zero:
            get_logger().warning(
                f"step {step}: non-finite loss or gradient norm; skipped on every rank "
                f"({self.bad_in_row} in a row, {self.bad_steps} in all; at {limit} in a row the run stops)"
            )
        if self.bad_in_row >= limit:
            from .checkpoint import find_checkpoints

            found = find_checkpoints(f"{self.trainer.default_root_dir}/checkpoints")
            newest = f"the newest finite checkpoint is {found[-1]}" if found else "no checkpoint was saved"
            raise FloatingPointError(
                f"{self.bad_in_row} steps in a row had a non-finite loss or gradient norm, the first at step "
                f"{self.first_bad_step}; the run was stopped with the weights of step {self.first_bad_step - 1} "
                f"(skipped steps change nothing); {newest}. Lower trainer.lr, clip harder "
                f"(trainer.gradient_clip_val) or use trainer.precision=32, then resume (ckpt_path=last)"
            )

    def validation_step(self, batch, batch_idx):
        if self._pipelined():
            loss = cast(Any, self.trainer.strategy).pipeline_eval_step(batch)
        else:
            with torch.no_grad():
                loss = self.reference_loss(batch)
        self.log("val_loss", loss, prog_bar=True, batch_size=global_size(batch))
        return loss

    # The loss scale is part of the run's state: every rank reads the same value back. The
    # schedule's horizon is recorded so a resume that would stretch it can say so (run_dir.py).
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["loss_scaler"] = self.scaler.state_dict()
        checkpoint["lr_schedule"] = {"decay_steps": self.total_steps, "warmup_steps": self.warmup_steps}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "loss_scaler" in checkpoint:
            self.scaler.load_state_dict(checkpoint["loss_scaler"])
