"""The planner: pure functions (ModelProfile, Topology, global batch, limits) -> Plan."""

from .build import to_plan
from .cost import Costed, StageSpec, evaluate
from .fixed import fixed_plan
from .limits import Limits
from .plan import Estimate, Plan, RunnerUp, StagePlan

__all__ = [
    "Costed",
    "Estimate",
    "Limits",
    "Plan",
    "RunnerUp",
    "StageSpec",
    "StagePlan",
    "evaluate",
    "fixed_plan",
    "to_plan",
]
