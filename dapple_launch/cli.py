"""The command line: check what the user asked for, then let Hydra run the job.

Before Hydra starts anything, the overrides are composed once here (for a sweep, its first point)
and every refusal becomes one plain line naming the key, the rule and the fix, with exit code 2:
Hydra's own composition errors (an unknown key, a wrong choice or type, a missing option), the
schema's (a key another kind owns, `+key=` included) and each section's value checks. Planning,
data and checkpoint checks follow in the job (launch/job.py), still before any process starts.
"""

from __future__ import annotations

import difflib
import os
import re
import sys

import hydra
from omegaconf import DictConfig

from .config import CONF_DIR, SECTION_SCHEMAS, check_schema, check_values, schema_of, unknown_key_message
from .log import get_logger, setup

EXIT_REFUSED = 2


class Refusal(ValueError):
    """Bad input: one line for the user, exit 2, nothing started."""


def _parse(argv: list[str]):
    """Hydra's own reading of the command line: (its flags, the overrides as written)."""
    from hydra._internal.utils import get_args_parser

    args, rest = get_args_parser().parse_known_args(argv)
    return args, [a for a in [*args.overrides, *rest] if not a.startswith("-")]


def _user_overrides(argv: list[str]) -> tuple[list[str], str | None]:
    """(the overrides to compose, with a sweep's first value, --config-dir)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args, raw = _parse(argv)
    out = []
    for o in OverridesParser.create().parse_overrides(raw):
        if o.key_or_group.startswith("hydra"):
            continue  # Hydra's own settings (run dir, launcher) do not change the job's config
        if o.is_sweep_override():
            out.append(f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}")
        else:
            out.append(o.input_line)
    return out, args.config_dir


def compose(overrides: list[str], config_dir: str | None = None) -> DictConfig:
    """The job's config as Hydra composes it (what the tests compose too)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    extra = [f"hydra.searchpath=[file://{config_dir}]"] if config_dir else []
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=[*overrides, *extra])


def check(overrides: list[str], config_dir: str | None = None) -> DictConfig:
    """Compose and check; every refusal raises Refusal with its one line."""
    try:
        cfg = compose(overrides, config_dir)
        check_schema(cfg)
        check_values(cfg)
    except Refusal:
        raise
    except Exception as exc:
        raise Refusal(explain_error(exc)) from None
    return cfg


def explain_error(exc: BaseException) -> str:
    """One line from a composition or validation error: the key, the rule, the fix."""
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and not isinstance(exc, ValueError):
        text = f"{text}\n{cause}"
    full_key = m.group(1) if (m := re.search(r"full_key: (\S+)", text)) else ""
    given = m.group(1) if (m := re.search(r"override (\S+=.*)$", text, flags=re.M)) else f"{full_key}=..."
    if isinstance(exc, ValueError) and "full_key" not in text:
        return text  # our own checks already say it in one line
    if m := re.search(r"ValueError raised while resolving interpolation: (.*?)(?: \(\S+\))?$", text.splitlines()[0]):
        return m.group(1)  # a resolver's own refusal (cluster=from_slurm outside an allocation)
    if m := re.search(r"Key '([^']+)' (?:is )?not in (?:struct|'(\w+)')", text):
        key = full_key or m.group(1)
        if key.startswith("model.args."):
            leaf = key.split(".", 2)[2]
            return (
                f"{key}: model.args is the factory's keyword arguments, a free mapping: add a key with "
                f"+{key}=VALUE, or set them all at once with model.args={{{leaf}:VALUE,...}}"
            )
        return unknown_key_message(key, *_known_keys(key, m.group(2)))
    if m := re.search(r"Could not find '([^']+)'", text):
        group, _, option = m.group(1).rpartition("/")
        options = re.findall(r"^\t(\S+)$", text, flags=re.M)
        options = [o for o in options if not o.endswith("_schema")]
        near = difflib.get_close_matches(option, options, n=1)
        hint = f"did you mean {group}={near[0]}? " if near else ""
        return f"{group}={option} is not an option of {group}; {hint}valid: {', '.join(options)}"
    if m := re.search(r"Invalid value '([^']*)', expected one of \[([^\]]*)\]", text):
        near = difflib.get_close_matches(m.group(1), [v.strip() for v in m.group(2).split(",")], n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        return f"{full_key}={m.group(1)} is not a valid choice: expected one of {m.group(2)}{hint}"
    if m := re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", text):
        return f"{full_key}={m.group(1)}: expected {m.group(2).lower()}"
    if "is not a ListConfig, list or tuple" in text:
        return f"{given}: {full_key} is a list: write it as [a,b,...], e.g. {full_key}=[2,2]"
    if "is not a subclass of" in text or "is not a DictConfig" in text or "is not a dict" in text:
        return f"{given}: {full_key} is a section, not a value; set its keys ({full_key}.KEY=VALUE)"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first + (f" ({full_key})" if full_key and full_key not in first else "")


def _known_keys(key: str, owner_type: str | None) -> tuple[list[str], str, str]:
    """The valid keys beside `key` (its kind's schema where the error names it), the other kinds
    that have it ("it is a setting of strategy=auto") and the kind it was given to."""
    from dataclasses import fields

    from .config import ClusterConfig, Config, LauncherConfig, LoggerConfig, TrainerConfig, kind_hint

    section = key.lstrip("+").split(".")[0]
    if "." not in key:
        return sorted(f.name for f in fields(Config)), "", "dapple_launch"
    fixed = {"cluster": ClusterConfig, "trainer": TrainerConfig, "logger": LoggerConfig, "launcher": LauncherConfig}
    if section in fixed:
        return sorted(f.name for f in fields(fixed[section])), "", "dapple_launch"
    kinds = SECTION_SCHEMAS.get(section, {})
    owner = next((s for s in kinds.values() if s.__name__ == owner_type), None)
    if owner is None:
        return sorted({f.name for s in kinds.values() for f in fields(s)}), "", "dapple_launch"
    return (sorted(f.name for f in fields(owner)), *kind_hint(section, key.split(".")[1], owner))


def refuse(message: str) -> None:
    get_logger().error(message)
    sys.exit(EXIT_REFUSED)


def _runs_one_job(argv: list[str]) -> bool:
    """Whether Hydra will run the job once, in this process (not a sweep, --cfg, --info or help)."""
    args, raw = _parse(argv)
    asked = (
        args.multirun,
        args.cfg,
        args.info,
        args.help,
        args.hydra_help,
        args.shell_completion,
        args.experimental_rerun,
    )
    return not any(asked) and not any(o.lstrip("+~").startswith(("hydra.mode", "hydra/launcher")) for o in raw)


def check_run_dir(argv: list[str]) -> None:
    """An explicit hydra.run.dir: refuse a directory another launch holds, or one that cannot be
    written, before Hydra writes its own files there."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not _runs_one_job(argv):
        return  # nothing runs in this directory
    _, raw = _parse(argv)
    given = [o for o in OverridesParser.create().parse_overrides(raw) if o.key_or_group == "hydra.run.dir"]
    if not given:
        return
    from pathlib import Path

    from .run_dir import check_unlocked, storage_refusal

    run_dir = Path(str(given[-1].value())).expanduser()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".dapple-write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise Refusal(str(storage_refusal(exc, run_dir))) from None
    check_unlocked(run_dir)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    from .launch.job import run
    from .log import quiet_third_party

    quiet_third_party()
    try:
        code = run(cfg)
    except ValueError as exc:
        refuse(str(exc))
        return
    if code:
        sys.exit(code)


def main() -> None:
    argv = sys.argv[1:]
    setup()
    from .help import HELP, wants_help

    if wants_help(argv):
        print(HELP)
        return
    overrides, config_dir = _user_overrides(argv)
    if "--resolve" in argv:  # `--cfg job --resolve` shows the plan: its resolver is the planning layer's
        from .plan_config import register_plan_resolver

        register_plan_resolver()
    try:
        cfg = check(overrides, config_dir)
        check_run_dir(argv)
    except (Refusal, ValueError) as exc:
        refuse(str(exc))
    if _runs_one_job(argv):
        from .launch.job import start_early

        start_early(cfg)
    try:
        _hydra_main()
    finally:
        # The interpreter's last garbage collections, over the objects torch (with torch._dynamo,
        # which the analytic profile's fake tensors load) leaves, took 1.5 s of every launch's
        # exit; frozen, they are skipped, and what dies with the process is not collected first
        # (atexit handlers and the modules' finalisation still run): 0.25 s.
        import gc

        gc.freeze()


__all__ = ["main", "check", "compose", "explain_error", "schema_of"]
