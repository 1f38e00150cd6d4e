"""Typed config schemas (Hydra structured configs) and the plan resolver.

`plan: ${dapple_plan:}` in conf/config.yaml calls the planner (strategy=auto) or validates the
stated layout (strategy=fixed) and writes the Plan into the config, so `--cfg job --resolve`
shows it. A misspelled or mistyped key fails with its full path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

GIB = 2**30
GBPS = 1e9  # the configs state bandwidths in GB/s


@dataclass
class ModelConfig:
    name: str = "gpt"  # gpt | bert | vgg19 | from_profile
    preset: str = "tiny"
    # shape fields: None keeps the preset's value
    num_layers: Optional[int] = None
    hidden: Optional[int] = None
    heads: Optional[int] = None
    seq_len: Optional[int] = None
    vocab_size: Optional[int] = None
    ffn_mult: Optional[int] = None
    dropout: Optional[float] = None
    image_size: Optional[int] = None
    num_classes: Optional[int] = None
    width_divisor: Optional[int] = None
    fc_width: Optional[int] = None
    # from_profile: a PipeDream/DAPPLE graph text profile, planned only (no layers to train)
    profile: Optional[str] = None
    profile_batch_size: int = 1
    parameter_scale: float = 1.0  # corrects a profile's parameter unit (vgg-19-pbs-32.txt: 1.048576)
    profile_device_tflops: Optional[float] = None  # the device the profile was measured on


@dataclass
class ClusterConfig:
    name: str = "local"
    nodes: int = 1
    devices_per_node: int = 4
    device_kind: str = "cpu"  # cpu (gloo) | gpu (nccl)
    device_memory_gib: float = 4.0
    device_tflops: float = 0.05
    intra_node_bandwidth_gbps: float = 1.0  # GB/s point to point
    inter_node_bandwidth_gbps: float = 1.0
    intra_node_latency_us: float = 50.0
    inter_node_latency_us: float = 50.0
    intra_node_allreduce_gbps: Optional[float] = None
    inter_node_allreduce_gbps: Optional[float] = None
    launcher: str = "local"  # the launcher this cluster is reached by: local | slurm
    # what `strategy: default` becomes on this cluster: auto (the planner) on real clusters; the
    # CPU clusters of this machine keep the fixed 2-stage demonstration layout
    default_strategy: str = "auto"
    # Slurm (launcher=slurm): every field may be overridden on the command line
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_min: int = 60  # the job's time limit in minutes
    constraint: Optional[str] = None
    cpus_per_task: int = 1
    mem_gb: Optional[int] = None
    setup: List[str] = field(default_factory=list)  # shell lines before the job (modules, containers)
    max_num_timeout: int = 3  # times a job that hit its time limit is requeued


@dataclass
class StrategyConfig:
    name: str = "auto"  # auto (the planner) | fixed | file
    stages: int = 2
    replicas: List[int] = field(default_factory=list)  # one per stage, one for all, or [] = fill the cluster evenly
    boundaries: List[int] = field(default_factory=list)  # layer positions where stages start (not 0)
    num_micro_batches: int = 4
    schedule: str = "1f1b"  # 1f1b | gpipe
    optimizer_factor: float = 4.0
    memory_headroom: float = 0.1
    max_stages: Optional[int] = None
    micro_batch_size: Optional[int] = None
    search_nodes: int = 20000  # candidates the planner may score, all passes (the plan says what it proved)
    optimality_gap: float = 0.01  # first pass prunes what cannot win by more than this; then closed exactly
    warmup_depth: int = 1  # 1F1B in-flight micro-batches as a multiple of DAPPLE's S - s (fixed layouts)
    max_warmup_depth: int = 4  # auto: the deepest 1F1B warm-up searched (1 = DAPPLE's minimal warm-up only)
    profile_source: str = "analytic"  # analytic | measured (model profile for estimates and planning)
    plan_file: Optional[str] = None  # strategy=file: a plan.json to run as written


@dataclass
class DataConfig:
    kind: str = "auto"  # auto (by model) | text | masked_text | model_samples
    num_train: int = 4096
    num_val: int = 256
    num_workers: int = 0


@dataclass
class TrainerConfig:
    max_steps: int = 200
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    lr_decay_steps: Optional[int] = None  # cosine decay horizon; None = max_steps (set it when you will resume longer)
    gradient_clip_val: Optional[float] = 1.0
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


@dataclass
class LoggerConfig:
    name: str = "csv"  # csv | wandb | none
    project: str = "dapple_launch"
    mode: str = "offline"  # wandb: offline | disabled


@dataclass
class LauncherConfig:
    name: str = "auto"  # auto (the cluster's own launcher) | local | slurm
    wait: bool = False  # slurm: wait for the job to end and report its outcome
    script_only: bool = False  # slurm: write and print the sbatch script, submit nothing


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    global_batch_size: int = 16
    dry_run: bool = False
    ckpt_path: Optional[str] = None  # a checkpoint directory, or "last" (newest complete one in the run dir)
    overwrite: bool = False  # allow a new run into a run directory that already holds checkpoints
    plan: Any = None  # filled by ${dapple_plan:}


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="dapple_schema", node=Config)
    for group, node in (("model", ModelConfig), ("cluster", ClusterConfig), ("strategy", StrategyConfig),
                        ("data", DataConfig), ("trainer", TrainerConfig), ("logger", LoggerConfig),
                        ("launcher", LauncherConfig)):
        cs.store(group=group, name=f"{group}_schema", node=node)


def check_schema(cfg: DictConfig) -> None:
    """Refuse keys the schema does not have, including ones added with Hydra's `+key=`, which
    would otherwise be carried along silently and read by nothing."""
    import difflib
    from dataclasses import fields, is_dataclass

    def walk(node: DictConfig, schema, path: str) -> None:
        known = {f.name: f for f in fields(schema)}
        for key in node.keys():
            if key == "hydra" and not path:
                continue
            if key not in known:
                near = difflib.get_close_matches(str(key), list(known), n=1)
                hint = f"did you mean {path}{near[0]}? " if near else ""
                raise ValueError(f"{path}{key} is not a setting of dapple_launch; {hint}valid keys under "
                                 f"{path.rstrip('.') or 'the top level'}: {sorted(known)}")
            child = node._get_node(key)  # not node[key]: that would resolve ${dapple_plan:} again
            factory = known[key].default_factory
            if isinstance(child, DictConfig) and callable(factory) and is_dataclass(sub := factory()):
                walk(child, type(sub), f"{path}{key}.")

    walk(cfg, Config, "")


def _plan_resolver(*, _root_: DictConfig):
    from .plan_config import cached_plan
    check_schema(_root_)
    # A container (not a dict): OmegaConf.resolve, used by `--cfg job --resolve`, can then put it
    # in place of the Any-typed node.
    return OmegaConf.create(cached_plan(_root_).to_dict())


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("dapple_plan"):
        OmegaConf.register_new_resolver("dapple_plan", _plan_resolver)


CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

register_configs()
register_resolvers()
