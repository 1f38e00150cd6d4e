# The type checker's view of transformers (pyproject [tool.basedpyright] stubPath): its package
# imports every model lazily, which pyright binds whole (3,000 files, 25 s of the fast tier) to
# check the few attributes this package reads. Every name is Any here; the tests against HF's own
# model code (tests/test_hf*.py) are what checks their use.
from typing import Any

def __getattr__(name: str) -> Any: ...
