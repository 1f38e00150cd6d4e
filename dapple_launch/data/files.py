"""Your data: a text file (or a directory of them) read as bytes, or a flat binary file of token ids.

Both are a stream of token ids cut into windows of seq_len + 1 ids (stride seq_len, so every id
but the first is a target once): window i is ids [i·seq_len, (i+1)·seq_len]. The last
`val_fraction` of the windows is the validation set, the rest the training set; the model turns
each window into an example (`example_from_tokens`: next-token prediction unless the model masks).
A text file's ids are its bytes (0-255, the byte tokenizer); a token file is memory-mapped, so
every rank reads only the windows it samples. Everything a run would trip over later (a missing
or empty file, fewer windows than one global batch, ids beyond the model's vocabulary) is refused
by `check` before any process starts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..models.contract import PipelineModel

DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32}


def text_files(path: Path) -> list[Path]:
    """The files a text_file path stands for: itself, or every regular file below a directory
    (sorted, hidden ones left out)."""
    if path.is_dir():
        return sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
    return [path]


def open_stream(kind: str, path: str | Path, dtype: str = "uint16", tokenizer: str | None = None) -> np.ndarray:
    """The token ids of a text file (its bytes, or its tokenizer's ids) or of a token file (memory-mapped)."""
    path = Path(path).expanduser()
    if kind == "text_file" and tokenizer:
        from .tokenizer import encoded_stream

        return encoded_stream(text_files(path), tokenizer)
    if kind == "text_file":
        return np.frombuffer(b"".join(p.read_bytes() for p in text_files(path)), dtype=np.uint8)
    size = np.dtype(DTYPES[dtype]).itemsize
    if path.stat().st_size < size:
        return np.zeros(0, dtype=DTYPES[dtype])
    return np.memmap(path, dtype=DTYPES[dtype], mode="r", shape=(path.stat().st_size // size,))


@dataclass(frozen=True)
class Split:
    num_tokens: int
    seq_len: int
    train_windows: int
    val_windows: int

    @property
    def windows(self) -> int:
        return self.train_windows + self.val_windows


def split(num_tokens: int, seq_len: int, val_fraction: float) -> Split:
    windows = max(0, (num_tokens - 1) // seq_len)
    val = min(windows, max(1, round(windows * val_fraction))) if windows else 0
    return Split(num_tokens, seq_len, windows - val, val)


class TokenWindows(Dataset):
    """Windows [first, first + count) of a token stream, each made an example by the model."""

    def __init__(self, stream: np.ndarray, seq_len: int, first: int, count: int, model: PipelineModel, seed: int):
        self.stream, self.seq_len, self.first, self.count = stream, seq_len, first, count
        self.model, self.seed = model, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        a = (self.first + i) * self.seq_len
        window = torch.from_numpy(np.asarray(self.stream[a : a + self.seq_len + 1], dtype=np.int64))
        # a per-window generator: masking (BERT) is the same on every rank and after a resume
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.first + i)
        return self.model.example_from_tokens(window, g)


def seq_len_of(data_cfg, model: PipelineModel) -> int:
    """data.seq_len, defaulting to the model's; a model with position embeddings caps it."""
    own = getattr(model, "seq_len", None)
    seq_len = data_cfg.seq_len or own
    if seq_len is None:
        raise ValueError(
            f"data.seq_len is not set and model {model.name} states no sequence length; set "
            f"data.seq_len=N (tokens per sample)"
        )
    if own is not None and seq_len > own:
        raise ValueError(
            f"data.seq_len={seq_len} exceeds model {model.name}'s sequence length {own} (its position "
            f"embeddings); set data.seq_len<={own} or model.seq_len={seq_len}"
        )
    return int(seq_len)


def datasets(data_cfg, model: PipelineModel, seed: int) -> tuple[TokenWindows, TokenWindows]:
    seq_len = seq_len_of(data_cfg, model)
    stream = open_stream(
        str(data_cfg.kind), data_cfg.path, str(data_cfg.get("dtype", "uint16")), data_cfg.get("tokenizer")
    )
    s = split(len(stream), seq_len, data_cfg.val_fraction)
    return (
        TokenWindows(stream, seq_len, 0, s.train_windows, model, seed),
        TokenWindows(stream, seq_len, s.train_windows, s.val_windows, model, seed + 7919),
    )


def check(data_cfg, model: PipelineModel, global_batch: int, min_val_batch: int) -> Split:
    """Refuse, before any process starts, data a run would fail on; the split it will use."""
    kind, path = str(data_cfg.kind), Path(str(data_cfg.path)).expanduser()
    if not path.exists():
        raise ValueError(
            f"data.path={path} does not exist; point data.path at a "
            f"{'UTF-8 text file or a directory of them' if kind == 'text_file' else 'token file'}"
        )
    if kind == "text_file" and path.is_dir() and not text_files(path):
        raise ValueError(
            f"data.path={path} is a directory with no files in it; put text files there or point data.path at a file"
        )
    if kind == "tokens" and path.is_dir():
        raise ValueError(
            f"data.path={path} is a directory; data=tokens reads one flat binary file of token ids "
            f"(python -m dapple_launch.data.prepare INPUT OUTPUT writes one)"
        )
    tokenizer = data_cfg.get("tokenizer")
    vocab = getattr(model, "vocab_size", None)
    if tokenizer:
        from .tokenizer import vocab_size

        tok_vocab = vocab_size(tokenizer)
        if vocab is not None and tok_vocab > vocab:
            raise ValueError(
                f"data.tokenizer={tokenizer} has {tok_vocab} tokens but model {model.name} has vocab_size "
                f"{vocab}: its ids would not fit the embedding; use the model's own tokenizer, or a "
                f"model with vocab_size>={tok_vocab}"
            )
    try:
        stream = open_stream(kind, path, str(data_cfg.get("dtype", "uint16")), tokenizer)
    except OSError as exc:
        raise ValueError(f"data.path={path} cannot be read: {exc.strerror or exc}") from None
    if len(stream) == 0:
        raise ValueError(f"data.path={path} is empty: it holds no tokens")
    seq_len = seq_len_of(data_cfg, model)
    s = split(len(stream), seq_len, data_cfg.val_fraction)
    if len(stream) < seq_len + 1:
        raise ValueError(
            f"data.path={path} holds {len(stream)} tokens, fewer than one window of data.seq_len + 1 = "
            f"{seq_len + 1}; use a longer file or a smaller data.seq_len"
        )
    if s.train_windows < global_batch:
        raise ValueError(
            f"data.path={path} gives {s.train_windows} training windows of {seq_len} tokens ({len(stream)} tokens, "
            f"{data_cfg.val_fraction:g} held out), fewer than one global batch of {global_batch}; use more data, a "
            f"smaller data.seq_len or a smaller global_batch_size (<= {s.train_windows})"
        )
    if s.val_windows < min_val_batch:
        raise ValueError(
            f"data.path={path} holds {s.val_windows} validation window(s) (data.val_fraction={data_cfg.val_fraction:g}) "
            f"but a validation batch needs at least {min_val_batch} (the most replicas a stage has); raise "
            f"data.val_fraction"
        )
    vocab = getattr(model, "vocab_size", None)
    if vocab is not None:
        top = max_token(stream, path)
        if top >= vocab:
            fix = (
                "model.vocab_size=256 (the byte tokenizer's ids are 0-255)"
                if kind == "text_file" and not tokenizer
                else f"model.vocab_size>={top + 1}, or the tokenizer the model was built for"
            )
            raise ValueError(
                f"data.path={path} holds token id {top} but model {model.name} has vocab_size {vocab} "
                f"(ids 0..{vocab - 1}); set {fix}"
            )
    return s


def max_token(stream: np.ndarray, path: Path) -> int:
    """The largest id in the stream; a token file's is cached by (path, size, mtime): scanning
    gigabytes once per launch would be the slowest part of it."""
    from ..cache import cache_dir, read_cached, write_cached

    st = path.stat()
    ident = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:20]
    key = cache_dir().parent / "data" / f"max-token-{ident}.json"
    cached = None if path.is_dir() else read_cached(key, lambda text: int(json.loads(text)["max"]))
    if cached is not None:
        return cached
    top, chunk = 0, 1 << 26
    for a in range(0, len(stream), chunk):
        top = max(top, int(stream[a : a + chunk].max()))
    if not path.is_dir():
        try:
            write_cached(key, json.dumps({"max": top}))
        except OSError:  # a read-only cache directory: scan again next time
            pass
    return top
