"""The runtime: DappleStrategy (registered in Lightning as "dapple") and what it runs.

Imported lazily: the launcher reads checkpoints and learning-rate schedules from here without
loading Lightning (seconds of start-up), which only the ranks need."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (what the lazy names below are, for a type checker)
    from .module import PipelineModule
    from .strategy import DappleStrategy


def __getattr__(name: str):
    if name == "PipelineModule":
        from .module import PipelineModule

        return PipelineModule
    if name == "DappleStrategy":
        from .strategy import DappleStrategy

        return DappleStrategy
    raise AttributeError(name)


__all__ = ["DappleStrategy", "PipelineModule"]
