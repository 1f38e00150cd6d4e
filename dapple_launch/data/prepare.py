"""`python -m dapple_launch.data.prepare INPUT OUTPUT [--dtype uint16]`: text -> a token file.

Reads INPUT (a UTF-8 text file or a directory of them) with the byte tokenizer (ids 0-255) and
writes OUTPUT, a flat binary file of token ids that `data=tokens data.path=OUTPUT` memory-maps (the
layout nanoGPT's and Megatron's preprocessors write). The file appears whole or not at all.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from .files import DTYPES, text_files


def prepare(source: Path, target: Path, dtype: str = "uint16") -> int:
    if not source.exists():
        raise ValueError(f"{source} does not exist")
    ids = np.frombuffer(b"".join(p.read_bytes() for p in text_files(source)), dtype=np.uint8)
    if len(ids) == 0:
        raise ValueError(f"{source} holds no bytes")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        ids.astype(DTYPES[dtype]).tofile(tmp)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return len(ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dapple_launch.data.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path, help="a UTF-8 text file or a directory of them")
    parser.add_argument("output", type=Path, help="the token file to write")
    parser.add_argument("--dtype", choices=["uint16", "uint32"], default="uint16", help="the token id type (default uint16)")
    args = parser.parse_args(argv)
    try:
        n = prepare(args.input, args.output, args.dtype)
    except (ValueError, OSError) as exc:
        print(f"error: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 2
    print(f"wrote {n} token ids ({args.dtype}, byte tokenizer: ids 0-255) to {args.output}; train on it with "
          f"data=tokens data.path={args.output} data.dtype={args.dtype} model.vocab_size=256")
    return 0


if __name__ == "__main__":
    sys.exit(main())
