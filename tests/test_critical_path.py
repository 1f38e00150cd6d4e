"""Pure tier: the critical path of a simulation of rank orders (schedule/critical_path.py)."""

from __future__ import annotations

import random

import pytest

from dapple_launch.planner.chunked import rank_orders
from dapple_launch.schedule import StageCosts, build_schedule
from dapple_launch.schedule.critical_path import SEND, critical_path
from dapple_launch.schedule.rank_simulate import simulate_ranks, step_costs
from dapple_launch.schedule.ranks import from_stages

FAMILIES = ("interleaved_1f1b", "interleaved_zb", "zbv", "chimera")


def _random_orders(rng: random.Random):
    """Rank orders of every family with several stages per rank, and the stage-per-rank ones."""
    family = rng.choice([*FAMILIES, "1f1b", "gpipe", "zb_h1"])
    if family in FAMILIES:
        P = rng.choice([2, 4] if family == "chimera" else [2, 3, 4])
        v = rng.choice([2, 3]) if family.startswith("interleaved") else 2
        return rank_orders(family, P, P * rng.randint(1, 3), v)
    return from_stages(build_schedule(family, rng.randint(1, 5), rng.randint(1, 8)))


def _random_costs(rng: random.Random, S: int) -> list[StageCosts]:
    """Compute and transfers only (no all-reduce: the path is the walk's, not the buckets' after it);
    a gradient crosses a boundary at its activation's price, as the planner's stage costs have it."""
    sends = [rng.choice([0.0, rng.uniform(0, 2)]) for _ in range(S - 1)] + [0.0]
    return [
        StageCosts(
            rng.uniform(0.1, 2),
            rng.uniform(0.1, 4),
            sends[s],
            sends[s - 1] if s else 0.0,
            weight_grad_s=rng.choice([None, rng.uniform(0, 1)]),
            action_s=rng.choice([0.0, 0.05]),
        )
        for s in range(S)
    ]


def _priced(counts: dict, costs: list[StageCosts]) -> float:
    per = step_costs(costs)
    return sum(n * (costs[s].send_activation_s if k == SEND else per[k][s]) for (s, k), n in counts.items())


def test_the_critical_path_is_the_simulated_length_and_no_longer_than_any_other_costs_simulation():
    """critical_path walks the orders as simulate_ranks does: its length is the simulated iteration,
    its steps and transfers priced at the same costs sum to it, and priced at any other costs they
    stay at or below that simulation (the precedences are the orders', not the costs': the bound
    over cuts relies on it)."""
    rng = random.Random(5)
    longer = 0
    for _ in range(150):
        orders = _random_orders(rng)
        S = orders.num_stages
        costs = _random_costs(rng, S)
        length, counts = critical_path(orders, step_costs(costs), [c.send_activation_s for c in costs])
        assert length == pytest.approx(simulate_ranks(orders, costs, record=False).iteration_s, rel=1e-12)
        assert _priced(counts, costs) == pytest.approx(length, rel=1e-12)
        for _ in range(3):
            other = _random_costs(rng, S)
            simulated = simulate_ranks(orders, other, record=False).iteration_s
            assert _priced(counts, other) <= simulated * (1 + 1e-12)
            # (a path that crosses ranks: more than any one rank's own steps)
            longer += _priced(counts, costs) > max(
                sum(step_costs(costs)[k][s] * n for k, s, n in work) for work in orders.work
            ) * (1 + 1e-9)
    assert longer > 100, longer


def test_a_link_sends_one_transfer_at_a_time_on_the_critical_path():
    """Two stages on two ranks, transfers dearer than compute: the iteration is the link's M
    activations one after another, and the path counts each of them."""
    orders = from_stages(build_schedule("gpipe", 2, 4))
    costs = [StageCosts(0.1, 0.1, 1.0, 0.0), StageCosts(0.1, 0.1, 0.0, 1.0)]
    length, counts = critical_path(orders, step_costs(costs), [1.0, 0.0])
    assert length == pytest.approx(simulate_ranks(orders, costs, record=False).iteration_s)
    assert counts[(0, SEND)] >= 4, counts
