"""The shapes a candidate may take: the micro-batch counts a family needs to fill its pipeline, the
micro-batch sizes a global batch allows, and the divisors both are drawn from."""

from __future__ import annotations

from functools import lru_cache

from .limits import Limits

MIN_MICRO_BATCHES = {
    "1f1b": lambda stages: stages,
    "gpipe": lambda stages: 1,
    "zb_h1": lambda stages: stages,
    "terapipe": lambda stages: 1,
    # stages of copies: one micro-batch per copy at the least (round_robin_constraint)
    "1f1b_rr": lambda stages: 1,
    "zb_h1_rr": lambda stages: 1,
}


@lru_cache(maxsize=64)
def _divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


def divisors(n: int) -> list[int]:
    """Ascending; asked for once per layout a baseline tries, hence cached."""
    return list(_divisors(n))


def micro_batch_sizes(global_batch: int, limits: Limits) -> list[int]:
    if limits.micro_batch_size:
        if global_batch % limits.micro_batch_size:
            raise ValueError(
                f"strategy.micro_batch_size={limits.micro_batch_size} does not divide "
                f"global_batch_size={global_batch}; pick a divisor of {global_batch}"
            )
        return [limits.micro_batch_size]
    return sorted(divisors(global_batch), reverse=True)
