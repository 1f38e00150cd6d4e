"""The configs' vocabulary: every choice an enum (a wrong choice fails at composition with the valid
ones), the units the configs state, and the one-line value checks the schemas run."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast

GIB = 2**30
GBPS = 1e9  # the configs state bandwidths in GB/s
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"  # shipped inside the package (a wheel carries it)


class Choice(str, enum.Enum):
    """A config choice: compares, hashes and formats as its name (`Precision["bf16-mixed"] ==
    "bf16-mixed"`), so code reading a typed config and a worker reading config.yaml agree."""

    def __str__(self) -> str:
        return str(self.value)

    __format__ = str.__format__

    @classmethod
    def _missing_(cls, value):  # `trainer.precision=32` arrives as the integer 32
        return cls.__members__.get(str(value))


def choice(name: str, *values: str) -> type[Choice]:
    return cast(type[Choice], Choice(name, {v: v for v in values}))  # (the functional API makes a class)


if TYPE_CHECKING:  # the functional API makes these at run time; a checker sees each as a Choice
    ModelName: TypeAlias = Choice
    LlamaPreset: TypeAlias = Choice
    HFInit: TypeAlias = Choice
    GPTPreset: TypeAlias = Choice
    BERTPreset: TypeAlias = Choice
    VGGPreset: TypeAlias = Choice
    StrategyName: TypeAlias = Choice
    ScheduleName: TypeAlias = Choice
    RecomputeName: TypeAlias = Choice
    Objective: TypeAlias = Choice
    DevicesChoice: TypeAlias = Choice
    ProfileSource: TypeAlias = Choice
    DeviceKind: TypeAlias = Choice
    ClusterLauncher: TypeAlias = Choice
    LauncherName: TypeAlias = Choice
    DataKind: TypeAlias = Choice
    TokenDtype: TypeAlias = Choice
    LoggerName: TypeAlias = Choice
    WandbMode: TypeAlias = Choice
    Precision: TypeAlias = Choice
else:
    ModelName = choice("ModelName", "gpt", "bert", "vgg19", "from_profile", "custom", "hf", "llama")
    LlamaPreset = choice("LlamaPreset", "tiny", "1b", "8b", "70b")
    HFInit = choice("HFInit", "pretrained", "random")
    GPTPreset = choice("GPTPreset", "tiny", "small", "medium", "large", "xl")
    BERTPreset = choice("BERTPreset", "tiny", "base", "large", "48")
    VGGPreset = choice("VGGPreset", "imagenet", "tiny")
    StrategyName = choice("StrategyName", "auto", "fixed", "file")
    ScheduleName = choice(
        "ScheduleName",
        "1f1b",
        "gpipe",
        "zb_h1",
        "interleaved_1f1b",
        "interleaved_zb",
        "zbv",
        "chimera",
        "1f1b_rr",
        "zb_h1_rr",
    )
    RecomputeName = choice("RecomputeName", "none", "full", "selective", "auto")
    Objective = choice("Objective", "time", "memory", "pareto")
    DevicesChoice = choice("DevicesChoice", "all", "auto")
    ProfileSource = choice("ProfileSource", "analytic", "measured")
    DeviceKind = choice("DeviceKind", "cpu", "gpu")
    ClusterLauncher = choice("ClusterLauncher", "local", "slurm")
    LauncherName = choice("LauncherName", "auto", "local", "slurm")
    DataKind = choice("DataKind", "synthetic", "text_file", "tokens")
    TokenDtype = choice("TokenDtype", "uint16", "uint32")
    LoggerName = choice("LoggerName", "csv", "wandb", "tensorboard", "none")
    WandbMode = choice("WandbMode", "offline", "online", "disabled")
    Precision = choice("Precision", "auto", "32", "bf16-mixed", "16-mixed")


def _need(ok: bool, key: str, value, rule: str) -> None:
    """One refusal: the key, its value, the rule (which says the fix)."""
    if not ok:
        raise ValueError(f"{key}={value}: {rule}")


def _positive(section: str, **values) -> None:
    for key, value in values.items():
        if value is not None:
            _need(value >= 1, f"{section}.{key}", value, "must be >= 1")


def mapping(c, where: str = "the config"):
    """`c` (what OmegaConf.load or create returned) as the DictConfig a config file is: a file
    holding a list is refused by name rather than failing later on a missing key."""
    from omegaconf import DictConfig

    if not isinstance(c, DictConfig):
        raise ValueError(f"{where} holds a list where a mapping of settings was expected")
    return c
