"""ModelProfile and its three sources: a profile file, an analytic estimate, a measurement.

The analytic estimate and the measurement run the model, so they need torch; they are loaded on
first use rather than here, because the planner imports this package and must stay pure (no torch at
import, ARCHITECTURE.md) so that planning a file profile never pays for, or depends on, torch.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from .graph_file import ProfileFileError, parse_graph_text, read_profile_file
from .model_profile import LayerProfile, ModelProfile, chain, kept_of

if TYPE_CHECKING:  # (what the lazy names below are, for a type checker)
    from .analytic import analytic_profile
    from .measure import measure_profile

_NEEDS_TORCH = {"analytic_profile": ".analytic", "measure_profile": ".measure"}

__all__ = [
    "LayerProfile",
    "ModelProfile",
    "ProfileFileError",
    "analytic_profile",
    "chain",
    "kept_of",
    "measure_profile",
    "parse_graph_text",
    "read_profile_file",
]


def __getattr__(name: str):
    if name in _NEEDS_TORCH:
        return getattr(import_module(_NEEDS_TORCH[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
