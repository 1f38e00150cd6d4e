"""The run directory: what a run leaves there, and the rules that keep saved work safe."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .planner.plan import Plan
from .runtime import checkpoint as ckpt


def resolve_checkpoint(cfg: DictConfig, run_dir: Path, model_description: dict) -> str | None:
    """The checkpoint to resume (None for a fresh run), checked before any process starts."""
    existing = ckpt.find_checkpoints(run_dir / "checkpoints") if (run_dir / "checkpoints").is_dir() else []
    path = cfg.ckpt_path
    if path is None:
        if existing and not cfg.overwrite:
            raise ValueError(
                f"run directory {run_dir} already holds {len(existing)} checkpoint(s) (newest: {existing[-1].name}); "
                f"a new run would overwrite them. Resume with ckpt_path=last, pick another hydra.run.dir, or pass "
                f"overwrite=true to move them aside")
        if existing:
            aside = run_dir / f"checkpoints.replaced-{int(existing[-1].stat().st_mtime)}"
            (run_dir / "checkpoints").rename(aside)
            print(f"overwrite=true: moved the earlier checkpoints to {aside}")
        return None
    if path == "last":
        if not existing:
            raise ValueError(f"ckpt_path=last but {run_dir / 'checkpoints'} holds no complete checkpoint; "
                             f"start without ckpt_path, or point hydra.run.dir at the run to resume")
        path = str(existing[-1])
    from .runtime.strategy import check_compatible
    check_compatible(ckpt.read_meta(path), model_description, path)
    return str(Path(path).resolve())


def write_run_files(cfg: DictConfig, plan: Plan, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    plan.save(run_dir / "plan.json")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["plan"] = plan.to_dict()
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(OmegaConf.to_yaml(OmegaConf.create(resolved)))
    tmp.replace(run_dir / "config.yaml")
