"""ModelProfile and its three sources: a profile file, an analytic estimate, a measurement."""
from .analytic import analytic_profile
from .graph_file import ProfileFileError, parse_graph_text, read_profile_file
from .measure import measure_profile
from .model_profile import LayerProfile, ModelProfile, chain

__all__ = ["LayerProfile", "ModelProfile", "ProfileFileError", "analytic_profile", "chain",
           "measure_profile", "parse_graph_text", "read_profile_file"]
