"""What a search may do: the planner's limits (memory, stages, budget, schedule families,
recomputation, token slices, copies), each checked on construction with the rule, the numbers and
the fix. The one input every part of the planner reads besides the profile and the cluster."""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule import SPLIT_BACKWARD


@dataclass(frozen=True)
class Limits:
    optimizer_factor: float = 4.0  # bytes kept per parameter byte: weight, gradient, Adam m and v
    memory_headroom: float = 0.1  # fraction of device memory kept free (allocator, workspace)
    max_stages: int | None = None
    micro_batch_size: int | None = None  # fix the micro-batch size instead of searching it
    schedule: str = "1f1b"
    search_nodes: int = 20_000  # candidates the search may score, all passes; ending within it proves optimality
    optimality_gap: float = 0.01  # first pass: prune what cannot win by more than this (then closed exactly)
    max_warmup_depth: int = 4  # deepest 1F1B warm-up searched (1 = DAPPLE's minimum only)
    # the planner's choice of schedule family (planner/zero_bubble_search.py); () = `schedule` alone
    schedules: tuple[str, ...] = ()
    # activation recomputation (runtime/recompute.py): "none"; "full" (every layer of every stage);
    # "selective" (the layer positions `recompute_layers`, or each stage's first `recompute_counts`
    # layers: one count per stage or one for all); "auto" (per stage, the fewest first layers whose
    # recomputation makes the candidate fit memory: the least time added, as recomputation only adds)
    recompute: str = "none"
    recompute_layers: tuple[int, ...] = ()
    recompute_counts: tuple[int, ...] = ()
    # token slices (TeraPipe, schedule "terapipe"): stated lengths, or chosen by the planner
    # (auto_token_slices) for a model whose sequences of `seq_len` tokens it may slice
    token_slices: tuple[int, ...] = ()
    auto_token_slices: bool = False
    seq_len: int | None = None
    # stages per device group: interleaved_1f1b's v (>= 2); zbv holds 2 (planner/chunked.py)
    chunks: int = 1
    # round-robin copies per stage (schedules 1f1b_rr, zb_h1_rr: planner/round_robin.py); () = the
    # canonical ones (replicas / gcd(replicas, micro-batch size)); one count = for every stage
    copies: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.optimality_gap < 0.5:
            raise ValueError(
                f"strategy.optimality_gap={self.optimality_gap} must be in [0, 0.5): it is the fraction "
                f"a first pass may leave on the table (0 = exact from the start, 0.01 = 1%)"
            )
        if self.search_nodes < 1:
            raise ValueError(f"strategy.search_nodes={self.search_nodes} must be >= 1")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"strategy.recompute={self.recompute!r}: valid choices are {list(RECOMPUTE)}")
        if self.recompute == "selective" and not (self.recompute_layers or self.recompute_counts):
            raise ValueError(
                "strategy.recompute=selective needs strategy.recompute_layers=[positions] or "
                "strategy.recompute_counts=[first layers per stage]"
            )
        if any(k < 0 for k in self.recompute_counts):
            raise ValueError(
                f"strategy.recompute_counts={list(self.recompute_counts)}: a count is how many first layers "
                f"a stage recomputes, so each must be >= 0"
            )
        split = [f for f in SPLIT_BACKWARD if f in (self.schedule, *self.schedules)]
        if self.recompute in ("full", "selective") and split:
            raise ValueError(
                f"strategy.recompute={self.recompute} with schedule {split[0]}: a split backward's W would "
                f"run the recomputed forward a second time; use strategy.schedule=1f1b, gpipe, "
                f"interleaved_1f1b or chimera (or strategy.schedules=[1f1b, interleaved_1f1b, chimera]) "
                f"with recomputation"
            )
        if self.token_slices and (min(self.token_slices) < 1):
            raise ValueError(f"strategy.token_slices={list(self.token_slices)}: every slice needs at least one token")
        if (self.token_slices or self.auto_token_slices) and self.recompute in ("full", "selective"):
            raise ValueError(
                f"strategy.recompute={self.recompute} with token slices: a recomputed forward would not "
                f"see the slice's cached keys and values; use strategy.recompute=none (or auto) with them"
            )
        if self.max_warmup_depth < 1:
            raise ValueError(
                f"strategy.max_warmup_depth={self.max_warmup_depth} must be >= 1 (1 = DAPPLE's minimum warm-up only)"
            )

    def allowed(self) -> tuple[str, ...]:
        """The schedule families a search may return: strategy.schedules, else the one schedule."""
        return self.schedules or (self.schedule,)


RECOMPUTE = ("none", "full", "selective", "auto")
