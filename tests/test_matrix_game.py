"""The matrix game behind the bound over a chunked shape's cuts (planner/path_bound.py): the path
terms' weights against the cuts found so far, solved exactly (the simplex method) rather than
approximately (multiplicative weights, whose error is the matrix's range times sqrt(ln T / steps)).
Any weights give a valid bound; these tests prove the exact ones optimal (both players' values
agree), never below what multiplicative weights guarantee, and that the bound they give a shape
rises where the approximate game stopped at the groups' work."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dapple_launch.planner.path_bound import GAME_STEPS, game_solution, game_weights


def _matrices(seed: int):
    rng = np.random.default_rng(seed)
    for T, C in ((1, 1), (1, 4), (5, 1), (3, 2), (40, 6), (300, 12), (600, 16)):
        yield rng.uniform(0.1, 0.5, size=(T, C))
        # ties and repeated rows and columns: degenerate pivots (Bland's rule), exact duplicates
        tied = np.round(rng.uniform(0.1, 0.5, size=(T, C)), 1)
        yield np.concatenate([tied, tied[: max(1, T // 3)]])
        # one term dominant on a cut or two, as a group's run is at cuts that heap its stages
        skew = rng.uniform(0.2, 0.3, size=(T, C))
        skew[rng.integers(T), rng.integers(C)] = 5.0
        yield skew
    yield np.full((7, 5), 0.25)  # (every weighting is worth the same)


@pytest.mark.parametrize("seed", range(4))
def test_the_exact_game_is_optimal_and_never_below_multiplicative_weights(seed):
    """λ lies on the simplex, the value it guarantees is the least column of λ·A, and the column
    player's weights μ (Σ μ = 1) hold every row to the same value: max over rows of A μ equals it
    (weak duality makes each a bound on the other, so both are the game's value). Multiplicative
    weights (the fallback) never guarantee more."""
    checked = 0
    for A in _matrices(seed):
        solved = game_solution(A)
        assert solved is not None, A.shape
        lam, value, mu, pivots = solved
        assert lam.shape == (A.shape[0],) and np.all(lam >= 0) and math.isclose(lam.sum(), 1.0, rel_tol=1e-9)
        assert np.all(mu >= 0) and math.isclose(mu.sum(), 1.0, rel_tol=1e-9)
        assert math.isclose(value, float((lam @ A).min()), rel_tol=1e-12)
        assert value == pytest.approx(float((A @ mu).max()), rel=1e-9), (A.shape, value, float((A @ mu).max()))
        assert 0 <= pivots <= 2000
        T = A.shape[0]
        scale = max(float(A.max() - A.min()), abs(value))  # (the tolerance: rounding at that size)
        rng = np.random.default_rng(seed)
        for _ in range(20):  # (no weighting does better: each is held to at most the value by μ)
            other = rng.dirichlet(np.ones(T))
            assert float((other @ A).min()) <= value + 1e-9 * scale
        mw, guaranteed = _mw(A, GAME_STEPS * 2)
        assert guaranteed <= value + 1e-9 * scale
        checked += 1
    assert checked == 22


def _mw(A: np.ndarray, steps: int) -> tuple[np.ndarray, float]:
    """game_weights' fallback alone (no pivots allowed)."""
    lam, value, pivots, done = game_weights(A, steps, pivots=0)
    assert pivots == 0 and done == steps
    return lam, value


def test_the_games_known_values_and_its_fallback_where_pivots_run_out():
    """Matching pennies shifted (value 2, each row half), a dominated row (weight 0), and a game
    the pivots cannot finish: None from the exact solver, and game_weights' multiplicative weights,
    whose steps it reports so the bound's cells count them."""
    lam, value, mu, _ = game_solution(np.array([[3.0, 1.0], [1.0, 3.0]]))
    assert value == pytest.approx(2.0) and lam == pytest.approx([0.5, 0.5]) and mu == pytest.approx([0.5, 0.5])
    lam, value, _, _ = game_solution(np.array([[4.0, 2.0], [1.0, 1.0], [2.0, 4.0]]))
    assert value == pytest.approx(3.0) and lam[1] == pytest.approx(0.0)
    A = np.random.default_rng(5).uniform(0.1, 0.5, size=(200, 20))
    assert game_solution(A, pivots=1) is None
    assert game_solution(np.array([[1.0, math.inf]])) is None
    lam, value, pivots, steps = game_weights(A, 50)
    assert pivots > 0 and steps == 0 and value == pytest.approx(float((lam @ A).min()))
    lam, fallback, pivots, steps = game_weights(A, 50, pivots=1)  # (out of pivots: 50 steps of the approximate game)
    assert (pivots, steps) == (1, 50) and fallback <= value + 1e-12 and math.isclose(lam.sum(), 1.0)


@pytest.mark.slow  # (2-4 s: a shipped profile's tables over every span; out of the fast tier)
def test_the_exact_game_lifts_a_shape_the_approximate_one_left_at_its_groups_work():
    """BERT-48 on 8 × 8 A100s at G 256, interleaved zero bubble with 3 chunks on 2 groups of 32,
    b 128 (M 2): multiplicative weights at 300 steps stopped the paths' game at the groups' work
    (275.5 ms: the shape bound), one of the shapes that held the row's proof at 5.45 %. Solved
    exactly, the same terms give 287 ms, still below every cut simulated (the best found by moving
    cuts one layer at a time: 317 ms)."""
    from dapple_launch.config import CONF_DIR
    from dapple_launch.plan_config import shipped_topology
    from dapple_launch.planner.chunked import chunked_layout, evaluate_chunked
    from dapple_launch.planner.chunked_bounds import group_bound_of, room_shape_bounds
    from dapple_launch.planner.limits import Limits
    from dapple_launch.profile import read_profile_file

    profile = read_profile_file(CONF_DIR.parent / "profiles" / "bert-48-pbs-2.txt", 2, device_tflops=125.0)
    topo, G, family, v, groups, b = shipped_topology("a100x64"), 256, "interleaved_zb", 3, (32, 32), 128
    plain = room_shape_bounds(profile, topo, G, family, v, groups, b, {}, None)[0]
    dual = group_bound_of(profile, topo, G, family, v, groups, b, {})
    dual.with_paths = True
    value = dual.bound()
    assert value > plain * 1.03, (value, plain)
    limits = Limits(schedules=(family,))
    L, S = profile.num_layers, v * len(groups)
    for stops in ([11, 19, 26, 35, 45, L], [round(L * k / S) for k in range(1, S)] + [L], [3, 12, 22, 31, 41, L]):
        layout = chunked_layout(family, list(groups), stops, None)
        T = evaluate_chunked(profile, topo, layout, b, G // b, limits, family, v).iteration_s
        assert value <= T * (1 + 1e-9), (stops, value, T)
