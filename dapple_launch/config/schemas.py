"""Typed config schemas (Hydra structured configs): one per section, and one per kind where a
section has kinds (model families, strategy kinds, data kinds), so a key that belongs to another kind
fails with its full path. Each checks its values in `__post_init__` (checks.check_values)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from .choices import (
    ClusterLauncher,
    DataKind,
    DeviceKind,
    DevicesChoice,
    LauncherName,
    LoggerName,
    Objective,
    Precision,
    ProfileSource,
    RecomputeName,
    ScheduleName,
    StrategyName,
    TokenDtype,
    WandbMode,
    _need,
    _positive,
)
from .model_schemas import MODEL_SCHEMAS


# ---- cluster -----------------------------------------------------------------------------------
@dataclass
class ClusterConfig:
    name: str = "local"
    nodes: int = 1
    devices_per_node: int = 4
    device_kind: DeviceKind = DeviceKind["cpu"]  # cpu: gloo between processes; gpu: NCCL
    device_memory_gib: float = 4.0
    device_tflops: float = 0.05  # the device's half-precision (bf16/fp16) tensor peak
    device_tflops_fp32: Optional[float] = None  # its fp32 peak; None: the same as device_tflops
    bf16: bool = False  # the device computes in bf16 (A100, H100); trainer.precision=auto picks it
    intra_node_bandwidth_gbps: float = 1.0  # GB/s point to point
    inter_node_bandwidth_gbps: float = 1.0
    intra_node_latency_us: float = 50.0
    inter_node_latency_us: float = 50.0
    # the runtime's own time per compute action beyond the layers' (Python, scheduling): the planner
    # adds it to every F, B, I and W. None: measured on an idle pipeline of this machine's processes
    # where the layers are measured on CPU processes too (strategy.profile_source=measured;
    # runtime/action_cost.py), else 0
    action_overhead_us: Optional[float] = None
    intra_node_allreduce_gbps: Optional[float] = None
    inter_node_allreduce_gbps: Optional[float] = None
    launcher: ClusterLauncher = ClusterLauncher["local"]  # the launcher this cluster is reached by
    # Slurm (launcher=slurm): every field may be overridden on the command line
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_min: int = 60  # the job's time limit in minutes
    constraint: Optional[str] = None
    cpus_per_task: int = 1
    mem_gb: Optional[int] = None
    setup: list[str] = field(default_factory=list)  # shell lines before the job (modules, containers)
    max_num_timeout: int = 3  # times a job that hit its time limit is requeued
    # the interface ranks reach each other through (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); None:
    # the one the route to the rendezvous address takes, on each node
    network_interface: Optional[str] = None

    def __post_init__(self) -> None:
        _positive(
            "cluster",
            nodes=self.nodes,
            devices_per_node=self.devices_per_node,
            time_min=self.time_min,
            cpus_per_task=self.cpus_per_task,
            mem_gb=self.mem_gb,
        )
        for key in (
            "device_memory_gib",
            "device_tflops",
            "device_tflops_fp32",
            "intra_node_bandwidth_gbps",
            "inter_node_bandwidth_gbps",
            "intra_node_allreduce_gbps",
            "inter_node_allreduce_gbps",
        ):
            value = getattr(self, key)
            if value is not None:
                _need(value > 0 and math.isfinite(value), f"cluster.{key}", value, "must be a number > 0")
        for key in ("intra_node_latency_us", "inter_node_latency_us", "action_overhead_us"):
            if getattr(self, key) is not None:
                _need(getattr(self, key) >= 0, f"cluster.{key}", getattr(self, key), "must be >= 0")
        _need(self.max_num_timeout >= 0, "cluster.max_num_timeout", self.max_num_timeout, "must be >= 0")


# ---- strategy: one schema per kind ---------------------------------------------------------------
@dataclass
class StrategyConfig:
    name: StrategyName = MISSING
    # print how the plan was chosen (families tried, bounds, why not the others) below its headline;
    # plan.json's `planner` and `proof` hold it either way
    explain: bool = False


@dataclass
class PlannedStrategyConfig(StrategyConfig):
    """What a fixed layout and the planner share: the schedule, the memory model, the profile."""

    schedule: ScheduleName = ScheduleName["1f1b"]
    optimizer_factor: float = 4.0  # bytes kept per parameter byte: weight, gradient, Adam m and v
    memory_headroom: float = 0.1  # fraction of device memory kept free (allocator, workspace)
    profile_source: ProfileSource = ProfileSource["analytic"]  # the model profile for estimates and planning
    # activation recomputation: none | full (every layer) | selective (recompute_layers, or each stage's
    # first recompute_counts layers) | auto (the planner recomputes a stage's fewest first layers that fit)
    recompute: RecomputeName = RecomputeName["none"]
    recompute_layers: list[int] = field(default_factory=list)  # layer positions (selective)
    recompute_counts: list[int] = field(default_factory=list)  # first layers per stage, or one for all (selective)
    # TeraPipe: none | auto (the planner's dynamic programme, when it helps a causal model) | [l1, l2, ...]
    # (token slice lengths summing to the sequence length; the plan runs schedule terapipe)
    token_slices: Any = "none"

    def __post_init__(self) -> None:
        _need(self.optimizer_factor > 0, "strategy.optimizer_factor", self.optimizer_factor, "must be > 0")
        t = self.token_slices
        listed = isinstance(t, (list, tuple)) or OmegaConf.is_list(t)
        _need(
            t in ("none", "auto") or (listed and len(t) > 0 and all(isinstance(n, int) and n >= 1 for n in t)),
            "strategy.token_slices",
            t,
            "must be none, auto, or a list of token counts >= 1 summing to the sequence length, e.g. [512,256,256]",
        )
        _need(
            str(self.recompute) == "selective" or not (self.recompute_layers or self.recompute_counts),
            "strategy.recompute_layers/recompute_counts",
            list(self.recompute_layers or self.recompute_counts),
            f"apply with strategy.recompute=selective only (it is {self.recompute})",
        )
        _need(
            str(self.recompute) != "selective" or bool(self.recompute_layers) != bool(self.recompute_counts),
            "strategy.recompute=selective",
            [list(self.recompute_layers), list(self.recompute_counts)],
            "needs exactly one of strategy.recompute_layers=[positions] or strategy.recompute_counts=[per stage]",
        )
        for k in [*self.recompute_layers, *self.recompute_counts]:
            _need(k >= 0, "strategy.recompute_layers/recompute_counts", k, "must be >= 0")
        _need(
            0 <= self.memory_headroom < 1,
            "strategy.memory_headroom",
            self.memory_headroom,
            "must be in [0, 1): the fraction of device memory kept free",
        )


@dataclass
class FixedStrategyConfig(PlannedStrategyConfig):
    """A stated layout, validated by the same code the planner uses."""

    name: StrategyName = StrategyName["fixed"]
    stages: int = 2
    replicas: list[int] = field(default_factory=list)  # one per stage, one for all, or [] = fill the cluster evenly
    boundaries: list[int] = field(default_factory=list)  # layer positions where stages 1.. start
    num_micro_batches: int = 4
    warmup_depth: int = 1  # 1F1B in-flight micro-batches as a multiple of DAPPLE's S - s
    # interleaved_1f1b: stages per device group (v >= 2; `stages` counts all v·P of them); zbv holds 2
    chunks: int = 2
    # 1f1b_rr, zb_h1_rr: round-robin copies per stage (one count for all, or one per stage; each
    # divides its stage's replicas); [] = the fewest whose copies split a micro-batch evenly
    copies: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(
            "strategy",
            stages=self.stages,
            num_micro_batches=self.num_micro_batches,
            warmup_depth=self.warmup_depth,
            chunks=self.chunks,
        )
        for r in self.replicas:
            _need(r >= 1, "strategy.replicas", list(self.replicas), "every replica count must be >= 1")
        for c in self.copies:
            _need(c >= 1, "strategy.copies", list(self.copies), "every copy count must be >= 1")
        _need(
            not self.copies or str(self.schedule) in ("1f1b_rr", "zb_h1_rr"),
            "strategy.copies",
            list(self.copies),
            f"is a setting of strategy.schedule=1f1b_rr or zb_h1_rr (stages of round-robin copies), not "
            f"{self.schedule}: drop it or change the schedule",
        )


@dataclass
class AutoStrategyConfig(PlannedStrategyConfig):
    """The planner chooses stages, replicas, placement, micro-batches and warm-up (DAPPLE)."""

    name: StrategyName = StrategyName["auto"]
    max_stages: Optional[int] = None
    micro_batch_size: Optional[int] = None
    search_nodes: int = (
        20000  # candidates the 1F1B passes may score (ZB-H1: a quarter more); the plan says what it proved
    )
    optimality_gap: float = 0.01  # first pass prunes what cannot win by more than this; then closed exactly
    max_warmup_depth: int = 4  # the deepest 1F1B warm-up searched (1 = DAPPLE's minimal warm-up only)
    # the schedule families the planner may choose; [] = all that apply to `schedule` (1f1b: 1f1b and zb_h1)
    schedules: list[ScheduleName] = field(default_factory=list)
    # auto: recompute only where nothing fits otherwise (objective=time); a lever on the frontier
    recompute: RecomputeName = RecomputeName["auto"]
    token_slices: Any = "auto"  # TeraPipe for causal models, where the planner finds it faster
    # time: the fastest plan; memory: the least memory per device within max_slowdown of the fastest;
    # pareto: the frontier of time against memory (pareto.json, pareto.svg), the fastest in budget chosen
    objective: Objective = Objective["time"]
    max_slowdown: float = 0.1  # objective=memory: how much slower than the fastest a plan may be
    memory_budget_gib: Optional[float] = None  # memory per device to plan within, below the card's (usable) memory
    frontier_step: float = 0.1  # relative memory step between frontier searches (0 = exact; see planner/frontier.py)
    # all: plan for the whole cluster; auto: the frontier over device counts (1 .. a node, then whole
    # nodes), choosing the cheapest that meets deadline_s_per_iteration, else the fastest within max_devices
    devices: DevicesChoice = DevicesChoice["all"]
    deadline_s_per_iteration: Optional[float] = None
    max_devices: Optional[int] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(
            "strategy",
            max_stages=self.max_stages,
            micro_batch_size=self.micro_batch_size,
            search_nodes=self.search_nodes,
            max_warmup_depth=self.max_warmup_depth,
            max_devices=self.max_devices,
        )
        _need(self.max_slowdown >= 0, "strategy.max_slowdown", self.max_slowdown, "must be >= 0 (0.1 = 10% slower)")
        _need(
            self.memory_budget_gib is None or self.memory_budget_gib > 0,
            "strategy.memory_budget_gib",
            self.memory_budget_gib,
            "must be > 0 GiB per device",
        )
        _need(
            0 <= self.frontier_step < 1,
            "strategy.frontier_step",
            self.frontier_step,
            "must be in [0, 1): the relative memory step between frontier searches (0 = exact)",
        )
        _need(
            self.deadline_s_per_iteration is None or self.deadline_s_per_iteration > 0,
            "strategy.deadline_s_per_iteration",
            self.deadline_s_per_iteration,
            "must be > 0 seconds",
        )
        _need(
            str(self.devices) == "auto" or (self.deadline_s_per_iteration is None and self.max_devices is None),
            "strategy.deadline_s_per_iteration/max_devices",
            [self.deadline_s_per_iteration, self.max_devices],
            "apply with strategy.devices=auto only",
        )
        _need(
            0 <= self.optimality_gap < 0.5,
            "strategy.optimality_gap",
            self.optimality_gap,
            "must be in [0, 0.5): the fraction a first pass may leave on the table (0 = exact from the start)",
        )


@dataclass
class FileStrategyConfig(StrategyConfig):
    """Run a plan made elsewhere (a dry run's plan.json, edited or not) as written."""

    name: StrategyName = StrategyName["file"]
    plan_file: Optional[str] = None
    plan_index: Optional[int] = None  # for a file holding a list of plans (pareto.json): which one (0 = fastest)


STRATEGY_SCHEMAS = {"fixed": FixedStrategyConfig, "auto": AutoStrategyConfig, "file": FileStrategyConfig}


# ---- data: one schema per kind -------------------------------------------------------------------
@dataclass
class DataConfig:
    kind: DataKind = MISSING
    # loader processes per rank; null: 2 on a GPU run (the next batch is read and pinned while the
    # card computes), 0 on CPU (workers would take the cores the ranks compute on)
    num_workers: Optional[int] = None

    def __post_init__(self) -> None:
        _need(self.num_workers is None or self.num_workers >= 0, "data.num_workers", self.num_workers, "must be >= 0")


@dataclass
class SyntheticDataConfig(DataConfig):
    """Generated by model: gpt a grammar corpus, bert masked copies of it, vgg19 and custom models
    samples from their own batch()."""

    kind: DataKind = DataKind["synthetic"]
    num_train: int = 4096
    num_val: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("data", num_train=self.num_train, num_val=self.num_val)


@dataclass
class FileDataConfig(DataConfig):
    path: str = MISSING
    seq_len: Optional[int] = None  # None: the model's sequence length
    val_fraction: float = 0.05  # the held-out share (the end of the token stream) used for validation

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("data", seq_len=self.seq_len)
        _need(
            0 < self.val_fraction < 1,
            "data.val_fraction",
            self.val_fraction,
            "must be in (0, 1): the share of the windows held out for validation",
        )


@dataclass
class TextFileDataConfig(FileDataConfig):
    """A UTF-8 text file, or a directory of them, read as bytes (token ids 0-255), or through a model's
    tokenizer (data.tokenizer=DIR holding tokenizer.json)."""

    kind: DataKind = DataKind["text_file"]
    tokenizer: Optional[str] = None


@dataclass
class TokensDataConfig(FileDataConfig):
    """A flat binary file of token ids (nanoGPT's and Megatron's preprocessors write these)."""

    kind: DataKind = DataKind["tokens"]
    dtype: TokenDtype = TokenDtype["uint16"]


DATA_SCHEMAS = {"synthetic": SyntheticDataConfig, "text_file": TextFileDataConfig, "tokens": TokensDataConfig}


# ---- trainer, logger, launcher --------------------------------------------------------------------
@dataclass
class TrainerConfig:
    max_steps: int = 200
    # Adam's peak learning rate; None: by the model's parameter count (runtime/lr.default_lr: GPT-3's
    # table, 3e-3 for the CPU presets), resolved once before the ranks start and logged
    lr: Optional[float] = None
    weight_decay: float = 0.0
    warmup_steps: int = 10
    lr_decay_steps: Optional[int] = None  # cosine decay horizon; None = max_steps (set it when you will resume longer)
    gradient_clip_val: Optional[float] = 1.0
    precision: Precision = Precision[
        "auto"
    ]  # auto: bf16-mixed where the cluster has bf16, 16-mixed on other GPUs, 32 on CPU
    val_check_interval: int = 100
    limit_val_batches: int = 4
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int = 100
    keep_checkpoints: int = 2
    seed: int = 1234
    timeout_s: float = 300.0  # a stalled peer ends the run after this long
    progress_bar: bool = True
    profile_pipeline: bool = False  # record every rank's actions; write timeline.svg/json next to plan.json
    profile_steps: int = 3  # how many iterations to record (from step 2, after the first has warmed up)
    max_bad_steps: int = 10  # non-finite loss or gradients this many steps in a row stop the run

    def __post_init__(self) -> None:
        _positive(
            "trainer",
            max_steps=self.max_steps,
            max_bad_steps=self.max_bad_steps,
            val_check_interval=self.val_check_interval,
            limit_val_batches=self.limit_val_batches,
            log_every_n_steps=self.log_every_n_steps,
            checkpoint_every_n_steps=self.checkpoint_every_n_steps,
            keep_checkpoints=self.keep_checkpoints,
            profile_steps=self.profile_steps,
            lr_decay_steps=self.lr_decay_steps,
        )
        _need(
            self.lr is None or self.lr > 0 and math.isfinite(self.lr),
            "trainer.lr",
            self.lr,
            "must be a number > 0 (or null: by the model's size)",
        )
        _need(self.weight_decay >= 0, "trainer.weight_decay", self.weight_decay, "must be >= 0")
        _need(self.warmup_steps >= 0, "trainer.warmup_steps", self.warmup_steps, "must be >= 0")
        _need(
            self.timeout_s > 0,
            "trainer.timeout_s",
            self.timeout_s,
            "must be > 0 (seconds a stalled peer may hold the run)",
        )
        if self.gradient_clip_val is not None:
            _need(
                self.gradient_clip_val > 0,
                "trainer.gradient_clip_val",
                self.gradient_clip_val,
                "must be > 0, or null for no clipping",
            )


@dataclass
class LoggerConfig:
    name: LoggerName = LoggerName["csv"]
    project: str = "dapple_launch"
    mode: WandbMode = WandbMode["offline"]  # wandb: offline (`wandb sync` later) | online | disabled


@dataclass
class LauncherConfig:
    name: LauncherName = LauncherName["auto"]  # auto: the cluster's own launcher
    wait: bool = False  # slurm: wait for the job to end and report its outcome
    script_only: bool = False  # slurm: write and print the sbatch script, submit nothing


@dataclass
class Config:
    model: Any = MISSING  # one of MODEL_SCHEMAS
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    strategy: Any = MISSING  # one of STRATEGY_SCHEMAS
    data: Any = MISSING  # one of DATA_SCHEMAS
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    global_batch_size: int = 16
    dry_run: bool = False
    ckpt_path: Optional[str] = None  # a checkpoint directory, or "last" (newest complete one in the run dir)
    overwrite: bool = False  # allow a new run into a run directory that already holds checkpoints
    plan: Any = None  # filled by ${dapple_plan:}


SECTION_SCHEMAS = {"model": MODEL_SCHEMAS, "strategy": STRATEGY_SCHEMAS, "data": DATA_SCHEMAS}


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="dapple_schema", node=Config)
    for group, node in (
        ("cluster", ClusterConfig),
        ("trainer", TrainerConfig),
        ("logger", LoggerConfig),
        ("launcher", LauncherConfig),
    ):
        cs.store(group=group, name=f"{group}_schema", node=node)
    for group, schemas in SECTION_SCHEMAS.items():
        for kind, node in schemas.items():
            cs.store(group=group, name=f"{kind}_schema", node=node)
