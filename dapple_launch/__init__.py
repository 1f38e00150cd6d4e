"""dapple_launch: plan and run hybrid pipeline + data-parallel training (DAPPLE) from a config."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dapple_launch")
except PackageNotFoundError:  # a checkout on the path, not installed
    __version__ = "0+unknown"
