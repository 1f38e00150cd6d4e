"""What every rank runs: build the model, data and Trainer from the resolved config, then fit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor
from omegaconf import DictConfig, OmegaConf

from .data.datasets import PipelineData, build_datasets
from .plan_config import model_from_config, parameter_count, run_precision
from .planner.plan import Plan
from .runtime import DappleStrategy, PipelineModule
from .runtime.checkpointing import Checkpointing
from .runtime.lr import default_lr
from .runtime.placement import PlannedEnvironment, job_shape
from .runtime.progress import Progress
from .runtime.signals import SIGNAL, StopOnSignal


def build_logger(cfg: DictConfig, run_dir: Path):
    name = cfg.logger.name
    if name == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=str(run_dir), name="logs")
    if name == "tensorboard":
        try:
            import tensorboard  # noqa: F401 - Lightning's logger needs it (or tensorboardX)
        except ImportError:
            raise ValueError(
                "logger=tensorboard needs the tensorboard package: pip install 'dapple-launch[tensorboard]'"
            ) from None
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(save_dir=str(run_dir), name="logs", version="tensorboard", default_hp_metric=False)
    if name == "wandb":
        os.environ.setdefault("WANDB_MODE", str(cfg.logger.mode))
        os.environ.setdefault("WANDB_SILENT", "true")
        from lightning.pytorch.loggers import WandbLogger

        return WandbLogger(save_dir=str(run_dir), project=cfg.logger.project, offline=cfg.logger.mode == "offline")
    return False


def hyperparameters(cfg: DictConfig, plan: Plan) -> dict:
    """What a logger records with the run (CSV: hparams.yaml; W&B: the run's config): the resolved
    config and the plan's layout, so runs can be compared by layout."""
    config = cast(dict, OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    config.pop("plan", None)
    return {
        **config,
        "plan": {
            "layout": plan.layout(),
            "stages": plan.num_stages,
            "replicas": [s.replicas for s in plan.stages],
            "cuts": [s.layers[0] for s in plan.stages[1:]],
            "micro_batch_size": plan.micro_batch_size,
            "num_micro_batches": plan.num_micro_batches,
            "schedule": plan.schedule,
            "warmup": list(plan.warmup),
            "planner": plan.planner,
            "estimated_iteration_s": plan.estimate.iteration_s,
            "estimated_peak_memory_bytes": max(plan.estimate.peak_memory_bytes),
        },
    }


def profile_window(t: DictConfig) -> range:
    """The steps trainer.profile_pipeline records: from step 2 (the first iterations learn shapes and
    warm caches), or the last ones of a shorter run."""
    first = min(2, max(0, t.max_steps - t.profile_steps))
    return range(first, min(first + t.profile_steps, t.max_steps))


def build_trainer(cfg: DictConfig, plan: Plan, run_dir: Path) -> L.Trainer:
    t = cfg.trainer
    saving = Checkpointing(run_dir / "checkpoints", t.checkpoint_every_n_steps, t.keep_checkpoints)
    callbacks = [
        saving,
        StopOnSignal(saving.save),
        Progress(
            t.max_steps,
            cfg.global_batch_size,
            plan.estimate.iteration_s,
            run_dir,
            show=t.progress_bar,
            estimated_peak_bytes=list(plan.estimate.peak_memory_bytes),
        ),
    ]
    logger = build_logger(cfg, run_dir)
    if logger:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
        logger.log_hyperparams(hyperparameters(cfg, plan))
    gpu = cfg.cluster.device_kind == "gpu"
    if gpu:  # never a silent CPU run of a GPU plan (a rank started where torch sees no CUDA)
        from .host import check_gpu_here

        check_gpu_here(run_precision(cfg))
    # Ranks and devices come from the plan (runtime/placement.py), locally and under Slurm alike.
    trainer = L.Trainer(
        plugins=[PlannedEnvironment(plan, cfg.cluster.devices_per_node)],
        strategy=DappleStrategy(
            plan,
            timeout_s=t.timeout_s,
            process_group_backend="nccl" if gpu else "gloo",
            profile_steps=profile_window(t) if t.profile_pipeline else None,
            timeline_dir=run_dir,
        ),
        accelerator="gpu" if gpu else "cpu",
        # on GPUs, the job's shape: the nodes and tasks per node the plan uses (devices=auto may use fewer
        # than the cluster has; the Slurm launcher submits exactly these)
        devices=plan.world_size if not gpu else job_shape(plan, cfg.cluster.devices_per_node)[1],
        num_nodes=1 if not gpu else job_shape(plan, cfg.cluster.devices_per_node)[0],
        max_steps=t.max_steps,
        val_check_interval=t.val_check_interval,
        check_val_every_n_epoch=None,
        limit_val_batches=t.limit_val_batches,
        log_every_n_steps=t.log_every_n_steps,
        num_sanity_val_steps=0,
        logger=logger,
        callbacks=callbacks,
        use_distributed_sampler=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
    )
    from .runtime.signals import keep_lightning_off_signals

    keep_lightning_off_signals(trainer)
    return trainer


def loader_workers(cfg: DictConfig) -> int:
    """data.num_workers, or its default for the device kind (config/schemas.DataConfig)."""
    chosen = cfg.data.get("num_workers")
    if chosen is not None:
        return int(chosen)
    return 2 if str(cfg.cluster.device_kind) == "gpu" else 0


def build_module_and_data(cfg: DictConfig, plan: Plan) -> tuple[PipelineModule, PipelineData]:
    model = model_from_config(cfg.model)
    t = cfg.trainer
    module = PipelineModule(
        model,
        # (null only where ranks start without the launcher, which settles it: launch/job.settle_lr)
        lr=t.lr if t.lr is not None else default_lr(parameter_count(model)),
        weight_decay=t.weight_decay,
        warmup_steps=t.warmup_steps,
        total_steps=t.lr_decay_steps or t.max_steps,
        gradient_clip_val=t.gradient_clip_val,
        seed=t.seed,
        precision=run_precision(cfg),
        max_bad_steps=t.get("max_bad_steps", 10),
    )
    train, val = build_datasets(cfg.data, model, str(cfg.model.name), t.seed)
    data = PipelineData(
        train,
        val,
        cfg.global_batch_size,
        seed=t.seed,
        num_workers=loader_workers(cfg),
        min_val_batch=max(s.replicas for s in plan.stages),
        # page-locked host batches on a GPU run: the copy to the device runs asynchronously
        pin_memory=str(cfg.cluster.device_kind) == "gpu",
    )
    return module, data


def fit(cfg: DictConfig, plan: Plan, run_dir: Path, ckpt_path: str | None) -> int:
    """Train; 0 when the run reached its last step, the agreed stop code when the ranks stopped
    together on a signal (runtime/signals.py)."""
    L.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    module, data = build_module_and_data(cfg, plan)
    trainer = build_trainer(cfg, plan, run_dir)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return SIGNAL.agreed
