"""From a composed config to the objects the planner reads: ModelPipeline, ModelProfile, Topology, Plan."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from omegaconf import DictConfig, OmegaConf

from .cluster import Topology
from .config import GBPS, GIB
from .config.choices import mapping
from .models import PipelineModel
from .models.from_config import model_from_config
from .planner import Limits, Plan, fixed_plan
from .planner.chunked import CHUNKED, check_chunked, groups_for
from .profile import ModelProfile, read_profile_file
from .schedule import SPLIT_BACKWARD, validate

PROFILE_BATCH = 2
MAX_REMEASURES = 2  # a measured profile timed again where the plan runs (at_operating_point)
T = TypeVar("T")

# strategy=auto's families when none are named (README: strategy.schedules)
DEFAULT_SCHEDULES = ("1f1b", "zb_h1", "interleaved_1f1b", "interleaved_zb", "zbv", "chimera", "1f1b_rr", "zb_h1_rr")


def run_precision(cfg: DictConfig) -> str:
    """trainer.precision, with auto made concrete: bf16-mixed on GPUs that have bf16, 16-mixed on
    other GPUs, 32 on CPU clusters."""
    p = str(cfg.trainer.precision)
    if p != "auto":
        return p
    if cfg.cluster.device_kind != "gpu":
        return "32"
    return "bf16-mixed" if cfg.cluster.bf16 else "16-mixed"


def shipped_topology(name: str, precision: str = "auto") -> Topology:
    """A cluster shipped in conf/cluster/NAME.yaml, as the planner sees it at `precision` (auto: the
    one trainer.precision=auto picks there). For benchmarks and tests that plan without composing."""
    from .config import CONF_DIR, ClusterConfig

    c = mapping(OmegaConf.load(CONF_DIR / "cluster" / f"{name}.yaml"))
    c.pop("defaults", None)
    c = mapping(OmegaConf.merge(OmegaConf.structured(ClusterConfig), c))
    if precision == "auto":
        precision = run_precision(OmegaConf.create({"trainer": {"precision": "auto"}, "cluster": c}))
    return topology_from_config(c, precision)


def topology_from_config(c: DictConfig, precision: str = "32") -> Topology:
    """The cluster as the planner sees it; the device's speed is the one at the run's precision."""
    tflops = c.device_tflops if precision != "32" else (c.device_tflops_fp32 or c.device_tflops)
    return Topology(
        name=c.name,
        nodes=c.nodes,
        devices_per_node=c.devices_per_node,
        device_memory_bytes=c.device_memory_gib * GIB,
        device_tflops=tflops,
        intra_node_bandwidth=c.intra_node_bandwidth_gbps * GBPS,
        inter_node_bandwidth=c.inter_node_bandwidth_gbps * GBPS,
        intra_node_latency_s=c.intra_node_latency_us * 1e-6,
        inter_node_latency_s=c.inter_node_latency_us * 1e-6,
        intra_node_allreduce_bandwidth=(c.intra_node_allreduce_gbps or 0) * GBPS or None,
        inter_node_allreduce_bandwidth=(c.inter_node_allreduce_gbps or 0) * GBPS or None,
        device_kind=str(c.device_kind),
        action_overhead_s=(c.get("action_overhead_us") or 0.0) * 1e-6,
    )


def profile_from_config(cfg: DictConfig, topology: Topology, batch: int = PROFILE_BATCH) -> ModelProfile:
    """The model's per-layer profile; a measured one timed at `batch` and 4 × `batch` samples
    (at_operating_point chooses them), an analytic one at PROFILE_BATCH (its times are linear)."""
    m = cfg.model
    if m.name == "from_profile":
        if not m.profile:
            raise ValueError(
                "model=from_profile needs model.profile=NAME or PATH (a shipped profile such as "
                "bert-48-pbs-2, or a PipeDream/DAPPLE graph text file)"
            )
        from .profile.bundled import locate

        path, batch, scale = locate(str(m.profile), m.profile_batch_size, m.parameter_scale)
        p = read_profile_file(path, batch, device_tflops=m.profile_device_tflops)
        if scale != 1.0:
            from dataclasses import replace

            p = replace(
                p, layers=tuple(replace(layer, parameter_bytes=layer.parameter_bytes * scale) for layer in p.layers)
            )
        return p
    model = model_from_config(m)
    precision = run_precision(cfg)
    source = cfg.strategy.get("profile_source", "analytic")
    if source == "measured":
        # Times hold for this machine's device: plan with a cluster config that describes it.
        if topology.device_kind != "cpu":
            from .host import cuda_missing

            missing = cuda_missing()
            if missing:  # never a CPU's times taken for a GPU cluster's plan
                raise ValueError(
                    f"strategy.profile_source=measured times the layers on this machine's GPU for "
                    f"cluster {topology.name}, but {missing}: plan on a node of that cluster, or use "
                    f"strategy.profile_source=analytic"
                )
            from .profile.measure_job import measure_elsewhere  # (CUDA is never initialised in this process)

            return with_ties(measure_elsewhere(m, batch, "cuda", precision), model)
        return with_ties(measured_cpu_share(model, topology, precision, batch), model)
    from .profile.analytic_cache import cached_analytic_profile

    return with_ties(
        cached_analytic_profile(model, PROFILE_BATCH, topology.device_tflops, topology.name, precision=precision),
        model,
    )


def with_ties(profile: ModelProfile, model: PipelineModel) -> ModelProfile:
    """The profile with the model's tied weights (layers holding a copy, the weight's bytes)."""
    from dataclasses import replace

    from .models.contract import parameter_layer, tied_owners

    owners = tied_owners(model)
    if not owners:
        return profile
    groups: dict[str, list[int]] = {}
    for name, owner in owners.items():
        groups.setdefault(owner, []).append(parameter_layer(name))
    sizes = tied_sizes(model, owners)
    return replace(profile, tied=tuple((tuple(sorted(set(layers))), sizes[owner]) for owner, layers in groups.items()))


def tied_sizes(model: PipelineModel, owners: dict[str, str]) -> dict[str, float]:
    """Bytes of each tied weight (its owner's parameter), from the owner's layer built on the meta device."""
    from .models.contract import on_meta, parameter_layer

    specs, out = model.layers(), {}
    with on_meta():
        for owner in set(owners.values()):
            layer = specs[parameter_layer(owner)].build()
            local = owner.split(".", 2)[2]
            params = dict(layer.named_parameters())
            if local not in params:
                raise ValueError(
                    f"model {model.name}: tied parameter {owner} does not exist (layer "
                    f"{parameter_layer(owner)} has {sorted(params)})"
                )
            t = params[local]
            out[owner] = float(t.numel() * t.element_size())
    return out


def parameter_count(model: PipelineModel) -> int:
    """The model's weights, each tied weight once, from its layers built on the meta device (no
    memory, no weights read: trainer.lr=null's rate is by size, runtime/lr.default_lr)."""
    from .models.contract import on_meta, tied_owners

    # a tied weight's other members (its owner counts it)
    again = {name for name, owner in tied_owners(model).items() if name != owner}
    total = 0
    with on_meta():
        for i, spec in enumerate(model.layers()):
            for name, p in spec.build().named_parameters():
                if f"layers.{i}.{name}" not in again:
                    total += p.numel()
    return total


def limits_from_config(s: DictConfig, seq_len: int | None = None) -> Limits:
    """`seq_len`: the sequence length of a model that supports token slicing (else None)."""
    auto = s.name == "auto"
    if auto and len(s.recompute_counts) > 1:
        raise ValueError(
            f"strategy.recompute_counts={list(s.recompute_counts)}: under strategy=auto the planner "
            f"chooses the stages, so give one count for every stage (e.g. [{s.recompute_counts[0]}]), "
            f"or strategy.recompute=auto to let it choose per stage"
        )
    slices = s.get("token_slices", "none")
    listed = not isinstance(slices, str)
    return Limits(
        optimizer_factor=s.optimizer_factor,
        memory_headroom=s.memory_headroom,
        max_stages=s.max_stages if auto else None,
        micro_batch_size=s.micro_batch_size if auto else None,
        schedule=str(s.schedule),
        recompute=str(s.recompute),
        token_slices=tuple(int(n) for n in slices) if listed else (),
        # (auto slicing steps aside for a stated recomputation, which slices cannot run with)
        auto_token_slices=slices == "auto" and str(s.recompute) not in ("full", "selective"),
        seq_len=seq_len,
        recompute_layers=tuple(int(i) for i in s.recompute_layers),
        recompute_counts=tuple(int(i) for i in s.recompute_counts),
        **({"chunks": int(s.chunks)} if "chunks" in s else {}),
        **({"copies": tuple(int(c) for c in s.copies)} if "copies" in s else {}),
        **(
            {
                "search_nodes": s.search_nodes,
                "optimality_gap": s.optimality_gap,
                "max_warmup_depth": s.max_warmup_depth,
                "schedules": auto_schedules(s),
            }
            if auto
            else {}
        ),
    )


def auto_schedules(s: DictConfig) -> tuple[str, ...]:
    """The families the planner may choose: strategy.schedules, or all that apply to strategy.schedule
    (1f1b: 1F1B, ZB-H1 on 1F1B's layouts, interleaved 1F1B and zero bubble, ZB-V and Chimera on device
    groups holding several stages — with strategy.recompute full or selective, those of a whole
    backward: 1F1B, interleaved 1F1B and Chimera; gpipe: GPipe alone)."""
    if s.schedules:
        return tuple(str(x) for x in s.schedules)
    if str(s.schedule) == "1f1b":
        # (a split backward does not run recomputed layers: with them, the families whose backward is whole)
        recomputes = str(s.recompute) in ("full", "selective")
        return tuple(f for f in DEFAULT_SCHEDULES if not (recomputes and f in SPLIT_BACKWARD))
    return (str(s.schedule),)


def plan_from_config(cfg: DictConfig) -> Plan:
    precision = run_precision(cfg)
    topology = topology_from_config(cfg.cluster, precision)
    s = cfg.strategy
    if s.name == "file":
        plan = plan_from_file(s.plan_file, topology, num_layers(cfg), cfg.global_batch_size, s.plan_index)
        if plan.token_slices and cfg.model.name != "from_profile":
            from .models.token_slices import supports_slicing

            model = model_from_config(cfg.model)
            if not supports_slicing(model) or sum(plan.token_slices) != model.seq_len:
                raise ValueError(
                    f"{s.plan_file}: its token_slices {list(plan.token_slices)} need a model that supports "
                    f"token slicing with sequences of {sum(plan.token_slices)} tokens; model {model.name} "
                    + ("does not support slicing" if not supports_slicing(model) else f"has {model.seq_len}")
                    + ": re-plan for this model"
                )
        return plan
    topology = measured_if_asked(cfg, topology)
    return at_operating_point(cfg, topology, lambda profile: _planned(cfg, profile, topology), lambda plan: plan)


def _planned(cfg: DictConfig, profile: ModelProfile, topology: Topology) -> Plan:
    """strategy=fixed or auto on this profile."""
    s = cfg.strategy
    seq_len = slicing_seq_len(cfg)
    if s.name == "fixed":
        replicas = list(s.replicas)
        groups = s.stages
        if str(s.schedule) in CHUNKED:
            # the schedule's own rules first: a stage count it cannot run is what to fix, not how it fills the cluster
            check_chunked(str(s.schedule), s.stages, s.chunks, s.num_micro_batches)
            groups = groups_for(str(s.schedule), s.stages, s.chunks)
        if not replicas and groups:  # fill the cluster: the same count on every device group (stage)
            if topology.num_devices % groups:
                what = "stages" if groups == s.stages else f"device groups ({s.stages} stages of {s.schedule})"
                raise ValueError(
                    f"strategy.replicas is empty (fill the cluster) but {topology.num_devices} devices do "
                    f"not divide into {groups} equal {what}; list strategy.replicas per "
                    f"{'stage' if groups == s.stages else 'device group'}"
                )
            replicas = [topology.num_devices // groups]
        return fixed_plan(
            profile,
            topology,
            cfg.global_batch_size,
            s.stages,
            replicas,
            s.num_micro_batches,
            limits_from_config(s, seq_len),
            boundaries=list(s.boundaries) or None,
            warmup_depth=s.warmup_depth,
        )
    return choice_for(cfg, profile, topology).plan


def choice_for(cfg: DictConfig, profile: ModelProfile, topology: Topology):
    """strategy=auto: the plans its objective chooses among (one, a frontier, or one per device count)
    and its choice (planner/frontier.py)."""
    from .planner.frontier import plan_choice

    s = cfg.strategy
    budget = s.memory_budget_gib * GIB if s.memory_budget_gib is not None else None
    return plan_choice(
        profile,
        topology,
        cfg.global_batch_size,
        limits_from_config(s, slicing_seq_len(cfg)),
        objective=str(s.objective),
        budget_bytes=budget,
        max_slowdown=s.max_slowdown,
        step=s.frontier_step,
        devices=str(s.devices),
        deadline_s=s.deadline_s_per_iteration,
        max_devices=s.max_devices,
    )


def frontier_from_config(cfg: DictConfig):
    """The Frontier behind an auto plan that chose among several (objective pareto or memory, or
    devices=auto), for the dry run's table, pareto.json and pareto.svg; None otherwise."""
    s = cfg.strategy
    if s.name != "auto" or (str(s.objective) == "time" and str(s.devices) == "all"):
        return None
    return _choice_for(_plan_key(cfg))


@lru_cache(maxsize=8)
def _choice_for(key: str):
    cfg = mapping(OmegaConf.create(key))
    precision = run_precision(cfg)
    topology = measured_if_asked(cfg, topology_from_config(cfg.cluster, precision))
    return at_operating_point(cfg, topology, lambda profile: choice_for(cfg, profile, topology), lambda c: c.plan)


def at_operating_point(cfg: DictConfig, topology: Topology, plan_with: Callable[[ModelProfile], T], plan_of) -> T:
    """What `plan_with` makes of the model's profile, with a measured profile timed where the plan
    runs its layers. A measured profile is a line through two timings per layer, at b and 4b samples
    (a fixed part per call and a part per sample); a device's time is not a line over all sizes (on
    a GPU, small calls are bound by kernel launches and a poorly filled card, so the slope from 2 to
    8 samples undershoots the one at 32: on an H200 GPT xl's micro-batches of 32, timed from 2 and 8,
    ran 11 % over the estimate). Below b the fixed part is the floor the line keeps; above 4b it is
    a guess. So when a plan's devices run micro-batch shares over 4b samples, the layers are timed
    again at b = ceil(largest share / 4) and 4b, and the model planned again, until no share is over
    (at most MAX_REMEASURES times; each profile is cached by its batch). An analytic profile is linear
    by construction: planned once."""
    from .log import get_logger

    profile = profile_from_config(cfg, topology)
    made = plan_with(profile)
    if cfg.model.name == "from_profile" or cfg.strategy.get("profile_source", "analytic") != "measured":
        return made
    for _ in range(MAX_REMEASURES):
        shares = plan_of(made).device_samples()
        b = profile.batch_size
        if max(shares) <= 4 * b:
            break
        new_b = -(-max(shares) // 4)
        get_logger().info(
            f"measured profile: the plan runs up to {max(shares)} samples per device and micro-batch, over the "
            f"{4 * b} its layers were timed at; timing them at {new_b} and {4 * new_b} samples and planning again"
        )
        profile = profile_from_config(cfg, topology, new_b)
        made = plan_with(profile)
    return made


def slicing_seq_len(cfg: DictConfig) -> int | None:
    """The sequence length token slices cut, for a model that supports slicing (models/token_slices.py);
    None when slicing is off (or auto on a model without it). Asked for on another model: refused."""
    from .models.token_slices import supports_slicing

    slices = cfg.strategy.get("token_slices", "none")
    if slices == "none" or cfg.model.name == "from_profile":
        return None
    model = model_from_config(cfg.model)
    if not supports_slicing(model):
        if slices == "auto":
            return None
        raise ValueError(
            f"strategy.token_slices={list(slices)} but model {model.name} does not support token "
            f"slicing (a causal model whose contract has slice_loss and whose attention reads the "
            f"slice's cache: models/token_slices.py); drop strategy.token_slices or use model=gpt"
        )
    L = model.seq_len
    if not isinstance(slices, str):
        if sum(slices) != L:
            raise ValueError(
                f"strategy.token_slices={list(slices)} sum to {sum(slices)} tokens but model "
                f"{model.name}'s sequences have {L}; give lengths summing to {L}"
            )
        if cfg.strategy.recompute in ("full", "selective"):
            raise ValueError(
                "strategy.token_slices with strategy.recompute="
                + str(cfg.strategy.recompute)
                + ": a recomputed forward would not see the slice's cached keys and values; use one"
            )
    return L


def num_layers(cfg: DictConfig) -> int:
    """The model's layer count, without profiling it."""
    if cfg.model.name == "from_profile":
        from .profile.bundled import locate

        path, batch, _ = locate(str(cfg.model.profile), cfg.model.profile_batch_size, cfg.model.parameter_scale)
        return read_profile_file(path, batch).num_layers
    return len(model_from_config(cfg.model).layers())


def plan_from_file(path: str | None, topology, num_layers: int, global_batch: int, index: int | None = None) -> Plan:
    """A plan made elsewhere (a dry run's plan.json, edited or not, or one point of its pareto.json
    with `index`): run as written, once it is checked against this cluster and model."""
    from .runtime.placement import check_plan_runs_on

    if not path or not Path(path).is_file():
        raise ValueError(
            f"strategy=file needs strategy.plan_file=PATH to a plan.json; {path!r} is not a file "
            f"(make one with dry_run=true)"
        )
    try:
        plan = _one_plan(path, index)
    except IndexError as exc:
        raise ValueError(str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{path} is not a readable plan ({type(exc).__name__}: {exc}); write it with dry_run=true "
            f"and edit it, keeping every field"
        ) from None
    if plan.global_batch_size != global_batch:
        raise ValueError(
            f"{path} was planned for global_batch_size={plan.global_batch_size} but this run has "
            f"{global_batch}; set global_batch_size={plan.global_batch_size} or re-plan"
        )
    check_plan_runs_on(plan, topology, num_layers)
    try:
        validate(plan.build_schedule())
    except ValueError as exc:  # a ScheduleError (deadlock) is one too
        raise ValueError(f"{path}: its schedule cannot run: {exc}") from None
    return plan


def _one_plan(path: str, index: int | None) -> Plan:
    from .planner.plan import loads

    data = loads(Path(path).read_text())
    if isinstance(data, list):  # pareto.json: plans fastest first
        if index is None or not 0 <= index < len(data):
            raise IndexError(
                f"{path} holds {len(data)} plans (a frontier, fastest first): pick one with "
                f"strategy.plan_index=K, K in 0..{len(data) - 1}"
            )
        return Plan.from_dict(data[index])
    if index not in (None, 0):
        raise IndexError(f"{path} holds one plan: strategy.plan_index={index} must be 0 or left out")
    return Plan.from_dict(data)


def measured_cpu_share(
    model: PipelineModel, topology: Topology, precision: str = "32", batch: int = PROFILE_BATCH
) -> ModelProfile:
    """A CPU cluster's device is a share of this machine: the local launcher gives each of its
    processes cores // processes threads, and more processes than cores share them. Measure the
    layers with the threads a rank will have, then stretch the times by how oversubscribed the
    cores are, so the estimate describes the ranks as they will really run."""
    from dataclasses import replace

    import torch

    from .host import threads_per_rank, usable_cores
    from .profile.measure import measure_profile

    cores, ranks = usable_cores(), topology.num_devices
    threads = threads_per_rank(ranks, cores)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        profile = measure_profile(model, batch, precision=precision)
    finally:
        torch.set_num_threads(before)
    share = max(1.0, ranks * threads / cores)
    if share == 1.0:
        return profile
    return replace(
        profile,
        source=f"{profile.source} × {share:g} ({ranks} processes on {cores} cores)",
        layers=tuple(
            replace(
                layer,
                forward_s=layer.forward_s * share,
                backward_s=layer.backward_s * share,
                forward_fixed_s=layer.forward_fixed_s * share,
                backward_fixed_s=layer.backward_fixed_s * share,
            )
            for layer in profile.layers
        ),
    )


def measured_if_asked(cfg: DictConfig, topology: Topology) -> Topology:
    """The cluster the planner costs: under strategy.profile_source=measured a CPU cluster of this
    machine's processes is measured here, as its layers are (measured_cpu_cluster); else as stated."""
    if cfg.strategy.profile_source == "measured" and topology.device_kind == "cpu":
        return measured_cpu_cluster(topology, measure_actions=cfg.cluster.get("action_overhead_us") is None)
    return topology


def measured_cpu_cluster(topology: Topology, measure_actions: bool = True) -> Topology:
    """A CPU cluster of this machine's processes, with the links measured here (profile/links.py)
    instead of the config's figures, and (`measure_actions`: the cluster states no action_overhead_us)
    the runtime's own cost per compute action measured on an idle pipeline of as many processes
    (runtime/action_cost.py): with the layers measured too, the estimate describes the ranks as they
    will run. Every device is a local process, so both link kinds are this one."""
    from dataclasses import replace

    from .profile.links import measure_links
    from .runtime.action_cost import measure_action_cost

    links = measure_links(topology.num_devices) if topology.num_devices > 1 else None
    if measure_actions:
        topology = replace(topology, action_overhead_s=measure_action_cost(topology.num_devices, links))
    if links is None:
        return topology
    return replace(
        topology,
        intra_node_bandwidth=links.p2p_bandwidth,
        inter_node_bandwidth=links.p2p_bandwidth,
        intra_node_latency_s=links.p2p_latency_s,
        inter_node_latency_s=links.p2p_latency_s,
        intra_node_allreduce_bandwidth=links.allreduce_bandwidth,
        inter_node_allreduce_bandwidth=links.allreduce_bandwidth,
        intra_node_allreduce_latency_s=links.allreduce_latency_s,
        inter_node_allreduce_latency_s=links.allreduce_latency_s,
    )


_PLAN_INPUTS = ("model", "cluster", "strategy", "global_batch_size")


def _plan_key(cfg: DictConfig) -> str:
    inputs = {
        k: OmegaConf.to_container(cfg[k], enum_to_str=True) if k != "global_batch_size" else cfg[k]
        for k in _PLAN_INPUTS
    }
    inputs["trainer"] = {"precision": str(cfg.trainer.precision)}
    return OmegaConf.to_yaml(OmegaConf.create(inputs))


def cached_plan(cfg: DictConfig) -> Plan:
    """The resolver runs on every access to `plan`; the planner runs once per distinct input."""
    return _plan_for(_plan_key(cfg))


@lru_cache(maxsize=16)
def _plan_for(key: str) -> Plan:
    cfg = mapping(OmegaConf.create(key))
    if frontier_from_config(cfg) is not None:  # planned once: the frontier's choice
        plan = _choice_for(key).plan
    else:
        plan = plan_from_config(cfg)
    plan.check_transfers()  # every plan, whoever made it: its transfers proven against NCCL's rules
    return plan


def _plan_resolver(*, _root_: DictConfig):
    """`plan: ${dapple_plan:}` (conf/config.yaml): the plan of the config it sits in."""
    from .config import check_schema

    check_schema(_root_)
    # A container (not a dict): OmegaConf.resolve, used by `--cfg job --resolve`, can then put it
    # in place of the Any-typed node.
    return OmegaConf.create(cached_plan(_root_).to_dict())


def register_plan_resolver() -> None:
    if not OmegaConf.has_resolver("dapple_plan"):
        OmegaConf.register_new_resolver("dapple_plan", _plan_resolver)


register_plan_resolver()  # whoever can plan can resolve `${dapple_plan:}`
