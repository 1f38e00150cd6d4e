"""One job: plan (or read the plan), check the data and the checkpoint, write the run files, launch.

Every check here runs before any process starts or any job is submitted; a refusal is a
ValueError with one line (the command line turns it into exit code 2).
"""

from __future__ import annotations

import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ..planner.plan import Plan


def plan_of(cfg: DictConfig) -> Plan:
    """The plan, made outside the `${dapple_plan:}` interpolation so its errors arrive as they are."""
    from ..config import check_schema
    from ..plan_config import cached_plan

    check_schema(cfg)
    return cached_plan(cfg)


def check_data(cfg: DictConfig, plan: Plan, model) -> None:
    """Enough samples for one global batch and a validation batch the stages can split."""
    d, G = cfg.data, cfg.global_batch_size
    widest = max(s.replicas for s in plan.stages)
    if d.kind == "synthetic":
        if d.num_train < G:
            raise ValueError(
                f"data.num_train={d.num_train} is fewer samples than one global batch "
                f"(global_batch_size={G}): nothing would train; set data.num_train>={G}"
            )
        if d.num_val < widest:
            raise ValueError(
                f"data.num_val={d.num_val} cannot be split across the {widest} replicas of a stage; "
                f"set data.num_val>={widest}"
            )
        return
    from ..data.files import check

    check(d, model, G, widest)


def settle_lr(cfg: DictConfig, model, log) -> None:
    """trainer.lr=null: the rate for the model's size (runtime/lr.default_lr), set in the config the
    run files and every rank read, and said once."""
    if cfg.trainer.lr is not None:
        return
    from ..plan_config import parameter_count
    from ..runtime.lr import default_lr

    n = parameter_count(model)
    cfg.trainer.lr = lr = default_lr(n)
    log.info(
        f"trainer.lr={lr:.3g}: for {n / 1e6:.1f} M parameters (GPT-3's rates by model size; set trainer.lr to choose)"
    )


def write_frontier(cfg: DictConfig, run_dir: Path, log) -> None:
    """When the plan was chosen among several (objective pareto or memory, devices=auto): the table,
    pareto.json (the plans, fastest first, each in plan.json's schema) and pareto.svg."""
    from ..plan_config import frontier_from_config
    from ..planner.frontier import describe, frontier_to_json
    from ..planner.frontier_svg import frontier_svg
    from ..run_dir import storage_refusal

    f = frontier_from_config(cfg)
    if f is None:
        return
    log.info(describe(f))
    try:
        for name, text in (("pareto.json", frontier_to_json(f)), ("pareto.svg", frontier_svg(f))):
            tmp = run_dir / f"{name}.tmp"
            tmp.write_text(text)
            tmp.replace(run_dir / name)
    except OSError as exc:
        raise storage_refusal(exc, run_dir) from None
    log.info(f"frontier: {run_dir / 'pareto.json'} ({len(f.points)} plans), picture {run_dir / 'pareto.svg'}")


def launcher_of(cfg: DictConfig) -> str:
    """Where the ranks start: local, slurm (a new submission) or allocation (a step of the Slurm
    job this process runs in)."""
    launcher = str(cfg.launcher.name)
    if str(cfg.cluster.name) == "from_slurm" and launcher != "local":
        return "allocation"  # already inside the job: a step of it, never a new submission
    if launcher == "auto":
        # Inside a Slurm job (a hydra-submitit sweep point) the ranks start here, on the allocation.
        return "local" if "SLURM_JOB_ID" in os.environ else str(cfg.cluster.launcher)
    return launcher


def start_early(cfg: DictConfig) -> None:
    """What a local training launch can start before it plans: the ranks' zygote (launch/local.py)."""
    if not cfg.dry_run and cfg.model.name != "from_profile" and launcher_of(cfg) == "local":
        from .local import start_zygote_early

        start_zygote_early()


def run(cfg: DictConfig) -> int:
    from ..log import get_logger
    from ..models import identity
    from ..plan_config import model_from_config
    from ..run_dir import RunLock, prepare, resolve_checkpoint, write_run_files
    from .local import launch_local

    log = get_logger()
    plan = plan_of(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    lock = RunLock(run_dir).acquire()  # one launch per run directory, before anything of ours is written
    try:
        if str(cfg.cluster.name) == "from_slurm":
            from ..allocation import allocation

            log.info(allocation().describe())
        log.info(plan.explain(full=bool(cfg.strategy.get("explain", False))))
        write_frontier(cfg, run_dir, log)
        model = model_from_config(cfg.model) if cfg.model.name != "from_profile" else None
        if model is not None:
            check_data(cfg, plan, model)
            settle_lr(cfg, model, log)
        if cfg.dry_run:
            write_run_files(cfg, plan, run_dir)
            log.info(f"dry run: plan written to {run_dir / 'plan.json'}; nothing started")
            return 0
        if model is None:
            raise ValueError(
                "model=from_profile describes a profile only, for planning (dry_run=true); it has no "
                "layers to train: pick model=gpt, bert, vgg19 or custom to train"
            )
        launcher = launcher_of(cfg)
        if launcher == "slurm":
            from .slurm import check_can_submit

            check_can_submit(cfg, plan, run_dir)
        elif launcher == "allocation":
            pass  # the allocation is the plan's (planned for it) and launch_in_allocation checks the shape
        else:
            from .devices import check_local_gpu_launch

            check_local_gpu_launch(cfg, plan)  # a GPU run here must be one: CUDA, one GPU per rank, bf16
        ckpt_path = resolve_checkpoint(cfg, run_dir, identity(model))
        prepare(cfg, run_dir)
        snapshot = write_run_files(cfg, plan, run_dir)
        if ckpt_path:
            log.info(f"resuming from {ckpt_path}")
        if launcher == "slurm":
            from .slurm import launch_slurm

            return launch_slurm(cfg, plan, run_dir, snapshot, ckpt_path)
        if launcher == "allocation":
            from .slurm import launch_in_allocation

            code = launch_in_allocation(cfg, plan, run_dir, snapshot, ckpt_path)
            if code == 0:
                log.info(closing_summary(run_dir, guessed=guessed_estimate(cfg)))
            return code
        code = launch_local(plan, run_dir, snapshot, ckpt_path, cfg.trainer.timeout_s, resume_hint(run_dir))
        if code == 0:
            log.info(closing_summary(run_dir, guessed=guessed_estimate(cfg)))
        return code
    finally:
        lock.release()


def resume_hint(run_dir: Path) -> str:
    """The command that resumes this run: its own overrides, this run directory, ckpt_path=last."""
    import shlex

    keep = [
        o
        for o in HydraConfig.get().overrides.task
        if not o.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir=", "overwrite="))
    ]
    return " ".join(
        ["python -m dapple_launch", *map(shlex.quote, keep), shlex.quote(f"hydra.run.dir={run_dir}"), "ckpt_path=last"]
    )


def guessed_estimate(cfg: DictConfig) -> str | None:
    """What to do when a CPU cluster's estimate rests on the stated figures (an analytic profile at
    cluster.device_tflops, the stated links) rather than on this machine; None when it is measured
    (or the cluster is a datasheet's, whose figures are the point)."""
    if str(cfg.cluster.device_kind) != "cpu" or str(cfg.strategy.get("profile_source", "measured")) != "analytic":
        return None
    return (
        f"the estimate uses cluster {cfg.cluster.name}'s stated figures (device_tflops={cfg.cluster.device_tflops}, "
        f"links, no runtime cost per action); strategy.profile_source=measured times this machine's layers, "
        f"links and runtime instead"
    )


# an estimate this far off is worth saying why (and how to get a better one), where there is a better one
GUESS_WARNING = 0.25


DIVERGED = 1.1  # a run whose last training loss is this far above its first one says so


def closing_summary(run_dir: Path, guessed: str | None = None) -> str:
    """What the run did and where everything is, from the summary rank 0 wrote at its end. `guessed`:
    said (guessed_estimate) when the measured time is more than GUESS_WARNING away from the estimate."""
    import json

    from ..planner.explain import human_bytes, human_seconds
    from ..runtime.checkpoint import find_checkpoints

    lines = []
    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        s = None
    if s:
        losses = [
            f"train loss {s['train_loss']:.4f}" if s.get("train_loss") is not None else "",
            f"validation loss {s['val_loss']:.4f}" if s.get("val_loss") is not None else "",
        ]
        lines.append(f"done: steps {s['steps'][0]}..{s['steps'][1]}; " + ", ".join(x for x in losses if x))
        first, last = s.get("first_train_loss"), s.get("train_loss")
        if first is not None and last is not None and last > first * DIVERGED and s["steps"][1] - s["steps"][0] > 1:
            lines.append(
                f"  the training loss rose from {first:.4f} at this run's first step to {last:.4f} at its last: "
                f"training diverged (a learning rate too high for the model is the usual cause: lower trainer.lr "
                f"or lengthen trainer.warmup_steps)"
            )
        if s.get("skipped_steps"):
            lines.append(f"  {s['skipped_steps']} step(s) skipped for a non-finite loss or gradient norm")
        m, e, whole = (
            s.get("measured_s_per_iteration"),
            s.get("estimated_s_per_iteration"),
            s.get("measured_s_per_step"),
        )
        if m:
            lines.append(
                f"  {human_seconds(m)} per iteration measured, {human_seconds(e)} estimated "
                f"({m / e - 1:+.0%}); {s['samples_per_s']:.1f} samples/s"
            )
            if guessed and abs(m / e - 1) > GUESS_WARNING:
                lines.append(f"  ({guessed})")
        if m and whole and whole > m * 1.005:  # the optimizer step, the batch's move, Lightning: outside any plan
            lines.append(
                f"  {human_seconds(whole)} per training step with the optimizer step and Lightning's "
                f"hooks ({human_seconds(whole - m)} outside the pipeline the plan estimates)"
            )
        peak, est = s.get("measured_peak_memory_bytes"), s.get("estimated_peak_memory_bytes")
        if peak and est:  # GPU runs: the allocator's peak on the fullest device against the plan's
            lines.append(
                f"  {human_bytes(peak)} peak device memory allocated, {human_bytes(est)} estimated ({peak / est - 1:+.0%})"
            )
        if s.get("allocator_retries"):  # the caching allocator emptied its cache to fit an allocation
            lines.append(
                f"  the allocator freed its cache {s['allocator_retries']} times to fit (each waits for the device: "
                f"a plan close to the card's memory; strategy.memory_budget_gib below the card leaves room)"
            )
    else:
        lines.append("done")
    found = find_checkpoints(run_dir / "checkpoints")
    lines.append(f"  plan: {run_dir / 'plan.json'}; logs: {run_dir / 'logs'}")
    if found:
        lines.append(f"  checkpoints: {run_dir / 'checkpoints'} (newest: {found[-1].name})")
    if (run_dir / "timeline.svg").is_file():
        lines.append(f"  timeline: {run_dir / 'timeline.svg'}")
    return "\n".join(lines)
