"""The runtime: DappleStrategy (registered in Lightning as "dapple") and what it runs."""
from .module import PipelineModule
from .strategy import DappleStrategy

__all__ = ["DappleStrategy", "PipelineModule"]
