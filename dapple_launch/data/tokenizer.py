"""Text through a model's own tokenizer (a `tokenizer.json`, read by the `tokenizers` package).

`data=text_file data.tokenizer=DIR` and `python -m dapple_launch.data.prepare --tokenizer DIR` encode
with it. Encoding is done once: the ids are written to the cache (keyed by the files' sizes and
times and the tokenizer's bytes) and every rank memory-maps them, as it does a token file.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np


def tokenizer_file(path: str | Path) -> Path:
    p = Path(path).expanduser()
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise ValueError(
            f"data.tokenizer={path}: no tokenizer.json there (a Hugging Face model directory holds one; "
            f"tokenizer.save(PATH) writes one)"
        )
    return f


def load(path: str | Path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("data.tokenizer needs the tokenizers package: pip install 'dapple-launch[hf]'") from None
    f = tokenizer_file(path)
    try:
        return Tokenizer.from_file(str(f))
    except Exception as exc:
        raise ValueError(
            f"{f} is not a tokenizer the tokenizers package reads: {' '.join(str(exc).split())[:200]}"
        ) from None


def vocab_size(path: str | Path) -> int:
    return load(path).get_vocab_size(with_added_tokens=True)


def dtype_for(vocab: int) -> str:
    return "uint16" if vocab <= 1 << 16 else "uint32"


def encode(files: list[Path], path: str | Path) -> np.ndarray:
    tok = load(path)
    ids: list[int] = []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        for start in range(0, len(text), 1 << 20):  # in pieces: a corpus need not fit one call
            ids.extend(tok.encode(text[start : start + (1 << 20)], add_special_tokens=False).ids)
    return np.asarray(ids, dtype=np.dtype(dtype_for(tok.get_vocab_size(with_added_tokens=True))))


def encoded_stream(files: list[Path], path: str | Path) -> np.ndarray:
    """The ids of `files` under the tokenizer at `path`, encoded once and then memory-mapped."""
    from ..cache import cache_dir

    f = tokenizer_file(path)
    h = hashlib.sha256(f.read_bytes())
    for p in files:
        st = p.stat()
        h.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    dtype = dtype_for(vocab_size(path))
    target = cache_dir().parent / "data" / f"tokens-{h.hexdigest()[:24]}.{dtype}"
    if not target.is_file():
        ids = encode(files, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        ids.tofile(tmp)
        tmp.replace(target)
    size = np.dtype(dtype).itemsize
    n = target.stat().st_size // size
    return np.memmap(target, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype=dtype)
