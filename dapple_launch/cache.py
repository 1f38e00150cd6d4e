"""The on-disk cache of what is measured on this machine (layer profiles, links, the runtime's cost
per action, a token file's largest id): standard library only, so the link probe and the data checks
use it without loading torch. Entries are written atomically and read defensively: the cache only
saves measuring again, so nothing in it may end a run."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def cache_dir() -> Path:
    return Path(os.environ.get("DAPPLE_CACHE", Path.home() / ".cache" / "dapple_launch")) / "profiles"


def write_cached(path: Path, text: str) -> None:
    """Atomic: a concurrent reader of the cache sees the old file or the whole new one, and two
    writers (each with its own temporary file) never interleave."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def read_cached(path: Path, parse: Callable[[str], T]) -> T | None:
    """A cache entry parsed, or None when there is none or it cannot be read (cut short, bad bytes,
    a hand edit, a field another version wrote): a damaged entry is measured again and overwritten,
    with a warning, rather than ending the run."""
    if not path.is_file():
        return None
    try:
        return parse(path.read_text(encoding="utf-8"))
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
    ) as exc:  # (bad bytes and bad JSON are ValueErrors)
        from .log import get_logger

        get_logger().warning(f"cache entry {path} cannot be read ({type(exc).__name__}: {exc}); measuring again")
        return None
