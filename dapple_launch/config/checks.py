"""The checks a composed config passes before anything runs: its keys against the schema of each
section's kind (check_schema), and every section's values (check_values), each a one-line refusal."""

from __future__ import annotations

from dataclasses import fields

from omegaconf import DictConfig, OmegaConf

from .choices import _need
from .schemas import SECTION_SCHEMAS, ClusterConfig, Config, LauncherConfig, LoggerConfig, TrainerConfig


def schema_of(section: str, node: DictConfig) -> type:
    """The dataclass a composed section follows (its kind's schema for model, strategy, data)."""
    typed = OmegaConf.get_type(node)
    if typed is not None and typed is not dict:
        return typed
    if section in SECTION_SCHEMAS:  # a config read back from config.yaml: the kind names the schema
        key = "kind" if section == "data" else "name"
        return SECTION_SCHEMAS[section][str(node[key])]
    return {"cluster": ClusterConfig, "trainer": TrainerConfig, "logger": LoggerConfig, "launcher": LauncherConfig}[
        section
    ]


def check_schema(cfg: DictConfig) -> None:
    """Refuse keys the schema does not have, including ones added with Hydra's `+key=`, which
    would otherwise be carried along silently and read by nothing."""

    top = {f.name for f in fields(Config)}
    for key in cfg:
        if key == "hydra":
            continue
        if key not in top:
            raise ValueError(unknown_key_message(str(key), sorted(top)))
        child = cfg._get_node(key)  # not cfg[key]: that would resolve ${dapple_plan:} again
        if not isinstance(child, DictConfig) or key == "plan":
            continue
        schema = schema_of(str(key), child)
        known = sorted(f.name for f in fields(schema))
        for sub in child:
            if sub not in known:
                raise ValueError(unknown_key_message(f"{key}.{sub}", known, *kind_hint(str(key), str(sub), schema)))


def unknown_key_message(key: str, known: list[str], where: str = "", owner: str = "dapple_launch") -> str:
    """`where`: the kinds the key does belong to; `owner`: the kind it was given to (model=gpt)."""
    import difflib

    section, _, leaf = key.rpartition(".")
    near = difflib.get_close_matches(leaf, known, n=1)
    hint = f"{where}; " if where else (f"did you mean {section + '.' if section else ''}{near[0]}? " if near else "")
    return f"{key} is not a setting of {owner}; {hint}valid keys under {section or 'the top level'}: {', '.join(known)}"


def kind_hint(section: str, leaf: str, schema: type) -> tuple[str, str]:
    """(the other kinds of `section` that have `leaf`, as "it is a setting of strategy=auto"; the
    kind `schema` stands for, as "strategy=fixed")."""
    kinds = SECTION_SCHEMAS.get(section, {})
    mine = next((k for k, s in kinds.items() if s is schema), None)
    elsewhere = [k for k, s in kinds.items() if s is not schema and leaf in {f.name for f in fields(s)}]
    where = f"it is a setting of {' and '.join(f'{section}={k}' for k in elsewhere)}" if elsewhere else ""
    return where, f"{section}={mine}" if mine else "dapple_launch"


REQUIRED_HINT = {
    "model.target": "PACKAGE.MODULE:CALLABLE, a factory that returns a PipelineModel",
    "data.path": "the text or token file to train on",
}


def check_values(cfg: DictConfig) -> None:
    """Each section's `__post_init__` checks its values: instantiate every section once."""
    for key in ("model", "cluster", "strategy", "data", "trainer", "logger", "launcher"):
        node = cfg[key]
        for full in sorted(OmegaConf.missing_keys(node)):
            hint = f" ({REQUIRED_HINT[full]})" if full in REQUIRED_HINT else ""
            raise ValueError(f"{full} is required: set {full}=...{hint}")
        if key in SECTION_SCHEMAS:  # the kind is chosen by the group option, not by its key
            field_name = "kind" if key == "data" else "name"
            kinds = {schema: kind for kind, schema in SECTION_SCHEMAS[key].items()}
            expected = kinds.get(OmegaConf.get_type(node))
            if expected is not None and str(node[field_name]) != expected:
                raise ValueError(
                    f"{key}.{field_name}={node[field_name]}: the {key} kind is chosen with "
                    f"{key}={node[field_name]}, not with {key}.{field_name}"
                )
        # resolved where it stands first: a section may point into another (data.tokenizer: ${model.path})
        attached = OmegaConf.create(OmegaConf.to_container(node, resolve=True, throw_on_missing=False))
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema_of(key, node)), attached))
    _need(cfg.global_batch_size >= 1, "global_batch_size", cfg.global_batch_size, "must be >= 1")
