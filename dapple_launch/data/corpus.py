"""A learnable text corpus generated from a small grammar, tokenised by character.

The sentences follow rules a language model can pick up in a few hundred steps (agreement,
fixed phrases, simple sums), so the loss falls well below the uniform ln(vocab) baseline.
Id 0 is reserved for [MASK] (BERT's masked language modelling).
"""

from __future__ import annotations

import random

import torch

ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789.,+=?!'"
VOCAB = {ch: i + 1 for i, ch in enumerate(ALPHABET)}  # 0 = [MASK]
VOCAB_SIZE = 64  # room to spare; ids above len(ALPHABET) never occur

_SUBJECTS = [
    ("the cat", "sits"),
    ("the dog", "runs"),
    ("a bird", "sings"),
    ("my friend", "reads"),
    ("the cats", "sit"),
    ("the dogs", "run"),
    ("two birds", "sing"),
    ("our friends", "read"),
]
_PLACES = ["on the mat", "in the park", "by the river", "under the tree", "at home", "near the house"]
_TIMES = ["today", "every morning", "at night", "in the spring", "after lunch"]


def _sentence(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.6:
        subj, verb = rng.choice(_SUBJECTS)
        return f"{subj} {verb} {rng.choice(_PLACES)} {rng.choice(_TIMES)}."
    if kind < 0.85:
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        return f"{a}+{b}={a + b}."
    subj, verb = rng.choice(_SUBJECTS)
    plural = not verb.endswith("s")
    return f"{'do' if plural else 'does'} {subj} {verb if plural else verb[:-1]}? yes, {'they do' if plural else 'it does'}."


def generate_text(num_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    parts, n = [], 0
    while n < num_chars:
        s = _sentence(rng) + " "
        parts.append(s)
        n += len(s)
    return "".join(parts)[:num_chars]


def encode(text: str) -> torch.Tensor:
    return torch.tensor([VOCAB[c] for c in text], dtype=torch.long)
