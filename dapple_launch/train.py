"""What every rank runs: build the model, data and Trainer from the resolved config, then fit."""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from omegaconf import DictConfig

from .data.datasets import PipelineData, build_datasets
from .planner.plan import Plan
from .plan_config import model_from_config, run_precision
from .runtime import DappleStrategy, PipelineModule
from .runtime.placement import PlannedEnvironment


def build_logger(cfg: DictConfig, run_dir: Path):
    name = cfg.logger.name
    if name == "csv":
        from lightning.pytorch.loggers import CSVLogger
        return CSVLogger(save_dir=str(run_dir), name="logs")
    if name == "wandb":
        os.environ.setdefault("WANDB_MODE", cfg.logger.mode)
        os.environ.setdefault("WANDB_SILENT", "true")
        from lightning.pytorch.loggers import WandbLogger
        return WandbLogger(save_dir=str(run_dir), project=cfg.logger.project, offline=cfg.logger.mode == "offline")
    if name == "none":
        return False
    raise ValueError(f"unknown logger {name!r}; valid loggers: csv, wandb, none")


def quiet_known_warnings() -> None:
    # The loss is broadcast from the last stage before logging, so every rank logs the same value
    # (sync_dist would only add an all-reduce); checkpoints are taken after the optimizer step on
    # purpose (that is the state a resume continues from).
    for text in ("It is recommended to use `self.log", "Using ModelCheckpoint with manual optimization",
                 "`isinstance(treespec, LeafSpec)` is deprecated", "The number of training batches"):
        warnings.filterwarnings("ignore", message=f".*{re.escape(text)}.*")


def profile_window(t: DictConfig) -> range:
    """The steps trainer.profile_pipeline records: from step 2 (the first iterations learn shapes and
    warm caches), or the last ones of a shorter run."""
    first = min(2, max(0, t.max_steps - t.profile_steps))
    return range(first, min(first + t.profile_steps, t.max_steps))


def build_trainer(cfg: DictConfig, plan: Plan, run_dir: Path) -> L.Trainer:
    t = cfg.trainer
    callbacks = [ModelCheckpoint(dirpath=str(run_dir / "checkpoints"), filename="step{step:06d}", auto_insert_metric_name=False,
                                 every_n_train_steps=t.checkpoint_every_n_steps, save_last="link",
                                 save_top_k=t.keep_checkpoints, monitor="step", mode="max")]
    if t.progress_bar:
        # The rich bar prints "Epoch 2/-2" for a run bounded by steps; tqdm shows the epoch alone.
        from lightning.pytorch.callbacks import TQDMProgressBar
        callbacks.append(TQDMProgressBar(refresh_rate=10))
    from .runtime.preemption import SIGNAL, SaveOnPreemption
    if SIGNAL.installed:  # under Slurm: the warning signal saves a checkpoint at the step's end
        callbacks.append(SaveOnPreemption(run_dir / "checkpoints"))
    logger = build_logger(cfg, run_dir)
    if logger:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    gpu = cfg.cluster.device_kind == "gpu" and torch.cuda.is_available()
    # Ranks and devices come from the plan (runtime/placement.py), locally and under Slurm alike;
    # this environment installs no signal handler, so under Slurm submitit alone owns requeue.
    return L.Trainer(
        plugins=[PlannedEnvironment(plan, cfg.cluster.devices_per_node)],
        strategy=DappleStrategy(plan, timeout_s=t.timeout_s, process_group_backend="nccl" if gpu else "gloo",
                                profile_steps=profile_window(t) if t.profile_pipeline else None,
                                timeline_dir=run_dir),
        accelerator="gpu" if gpu else "cpu",
        devices=plan.world_size if not gpu else cfg.cluster.devices_per_node,
        num_nodes=1 if not gpu else cfg.cluster.nodes,
        max_steps=t.max_steps, val_check_interval=t.val_check_interval, check_val_every_n_epoch=None,
        limit_val_batches=t.limit_val_batches, log_every_n_steps=t.log_every_n_steps, num_sanity_val_steps=0,
        logger=logger, callbacks=callbacks, use_distributed_sampler=False, enable_progress_bar=t.progress_bar,
        enable_model_summary=False, default_root_dir=str(run_dir),
    )


def build_module_and_data(cfg: DictConfig, plan: Plan) -> tuple[PipelineModule, PipelineData]:
    model = model_from_config(cfg.model)
    t = cfg.trainer
    module = PipelineModule(model, lr=t.lr, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps,
                            total_steps=t.lr_decay_steps or t.max_steps, gradient_clip_val=t.gradient_clip_val,
                            seed=t.seed, precision=run_precision(cfg))
    train, val = build_datasets(cfg.data, model, str(cfg.model.name), t.seed)
    data = PipelineData(train, val, cfg.global_batch_size, seed=t.seed, num_workers=cfg.data.num_workers,
                        min_val_batch=max(s.replicas for s in plan.stages))
    return module, data


def fit(cfg: DictConfig, plan: Plan, run_dir: Path, ckpt_path: str | None) -> None:
    quiet_known_warnings()
    L.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    module, data = build_module_and_data(cfg, plan)
    trainer = build_trainer(cfg, plan, run_dir)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
