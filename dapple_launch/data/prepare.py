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


def prepare(source: Path, target: Path, dtype: str = "uint16", tokenizer: str | None = None) -> int:
    if not source.exists():
        raise ValueError(f"{source} does not exist")
    if tokenizer:
        from .tokenizer import dtype_for, encode, vocab_size

        need = dtype_for(vocab_size(tokenizer))
        if DTYPES[dtype]().itemsize < DTYPES[need]().itemsize:
            raise ValueError(
                f"--dtype {dtype} cannot hold the ids of {tokenizer}'s {vocab_size(tokenizer)} tokens; "
                f"use --dtype {need}"
            )
        ids = encode(text_files(source), tokenizer)
    else:
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
    parser = argparse.ArgumentParser(
        prog="python -m dapple_launch.data.prepare", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("input", type=Path, help="a UTF-8 text file or a directory of them")
    parser.add_argument("output", type=Path, help="the token file to write")
    parser.add_argument(
        "--dtype",
        choices=["uint16", "uint32"],
        default=None,
        help="the token id type (default uint16, or uint32 for a tokenizer of more than 65536 tokens)",
    )
    parser.add_argument("--tokenizer", default=None, help="a directory holding tokenizer.json (default: bytes, 0-255)")
    args = parser.parse_args(argv)
    try:
        if args.dtype is None:
            from .tokenizer import dtype_for, vocab_size

            args.dtype = dtype_for(vocab_size(args.tokenizer)) if args.tokenizer else "uint16"
        n = prepare(args.input, args.output, args.dtype, args.tokenizer)
    except (ValueError, OSError) as exc:
        print(f"error: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 2
    how = f"tokenizer {args.tokenizer}" if args.tokenizer else "byte tokenizer: ids 0-255"
    print(
        f"wrote {n} token ids ({args.dtype}, {how}) to {args.output}; train on it with "
        f"data=tokens data.path={args.output} data.dtype={args.dtype}"
        + ("" if args.tokenizer else " model.vocab_size=256")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
