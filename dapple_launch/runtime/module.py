"""The LightningModule that trains any PipelineModel, alone or through DappleStrategy.

Under DappleStrategy it materialises only this rank's layers and hands each step to the
strategy's schedule; under any other strategy (one process: the reference) it runs all layers.
Optimisation is manual because the schedule runs backward inside the step.
"""
from __future__ import annotations

import lightning as L
import torch
from torch import nn

from ..models.contract import PipelineModel, batch_size, build_layer, run_layers
from .lr import lr_factor
from .precision import LossScaler, MixedPrecision, grads_finite
from .tied import tie_local


class PipelineModule(L.LightningModule):
    def __init__(self, model: PipelineModel, lr: float = 3e-3, weight_decay: float = 0.0,
                 warmup_steps: int = 0, total_steps: int = 0, gradient_clip_val: float | None = None,
                 seed: int = 0, precision: str = "32"):
        super().__init__()
        self.model, self.seed = model, seed
        self.lr, self.weight_decay, self.warmup_steps, self.total_steps = lr, weight_decay, warmup_steps, total_steps
        self.gradient_clip_val = gradient_clip_val
        self.precision_name = precision
        self.scaler = LossScaler(enabled=precision == "16-mixed")
        self.automatic_optimization = False
        self.layers = nn.ModuleDict()  # keys are global layer positions: "layers.17.weight" on every layout

    def mixed_precision(self) -> MixedPrecision:
        return MixedPrecision(self.precision_name, self.device.type)

    def configure_model(self) -> None:
        if len(self.layers):
            return
        indices = getattr(self.trainer.strategy, "local_layer_indices", None) if self._trainer else None
        self.materialize(indices)

    def materialize(self, indices: list[int] | None = None) -> "PipelineModule":
        specs = self.model.layers()
        for i in indices if indices is not None else range(len(specs)):
            self.layers[str(i)] = build_layer(specs[i], i, self.seed)
        tie_local(self.layers, self.model, self.seed)
        return self

    def local_stack(self) -> list[nn.Module]:
        return [self.layers[k] for k in sorted(self.layers, key=int)]

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, self.warmup_steps, self.total_steps))
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
        opt, sched = self.optimizers(), self.lr_schedulers()
        strategy = self.trainer.strategy
        scale = self.scaler.scale
        if self._pipelined():
            loss = strategy.pipeline_train_step(batch, loss_scale=scale)
            finite = strategy.finish_gradients(scale, check_finite=self.scaler.enabled)
        else:
            loss = self.reference_loss(batch)
            self.manual_backward(loss * scale)
            loss = loss.detach()
            if scale != 1.0:
                for p in self.parameters():
                    if p.grad is not None:
                        p.grad.div_(scale)
            finite = not self.scaler.enabled or grads_finite(self.parameters())
        if finite and self.gradient_clip_val:
            if self._pipelined():
                strategy.clip_grad_norm_(self.gradient_clip_val)
            else:
                torch.nn.utils.clip_grad_norm_(self.parameters(), self.gradient_clip_val)
        # A step with an inf/NaN gradient (16-mixed) is skipped on every rank alike: the strategy
        # leaves the weights as they are, the step still counts, the scale halves.
        if self._pipelined():
            strategy.skip_next_step = not finite
        if finite or self._pipelined():
            opt.step()
        self.scaler.update(found_inf=not finite)
        opt.zero_grad(set_to_none=True)
        sched.step()
        # The loss is already the same on every rank, so no sync is needed for monitors to agree.
        self.log("train_loss", loss, prog_bar=True, batch_size=batch_size(batch[0]))
        return loss

    def validation_step(self, batch, batch_idx):
        if self._pipelined():
            loss = self.trainer.strategy.pipeline_eval_step(batch)
        else:
            with torch.no_grad():
                loss = self.reference_loss(batch)
        self.log("val_loss", loss, prog_bar=True, batch_size=batch_size(batch[0]))
        return loss

    # The loss scale is part of the run's state: every rank reads the same value back. The
    # schedule's horizon is recorded so a resume that would stretch it can say so (run_dir.py).
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["loss_scaler"] = self.scaler.state_dict()
        checkpoint["lr_schedule"] = {"decay_steps": self.total_steps, "warmup_steps": self.warmup_steps}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "loss_scaler" in checkpoint:
            self.scaler.load_state_dict(checkpoint["loss_scaler"])
