"""Measured profiles on a busy machine: one pass of repetitions against passes until two agree.

The measuring profiler (profile/measure.py) times each layer's forward and backward. One pass
times every repetition of a layer back to back, so other work running through that stretch
slows all of them and the median keeps it; the settled profile runs passes apart in time until
two agree on each layer and takes the median over passes. This benchmark measures the default
model's profile both ways, alternating, --rounds times, while background processes (--load) run
bursts of CPU work at random (0.1 to 0.6 s on, as long off) on this machine's cores, and reports
how much each way's profile varies from round to round: its total time's spread (slowest /
fastest round) and each layer's worst spread.

    python benchmarks/profile_noise.py [--rounds 8] [--load 4] [--out profile_noise.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dapple_launch.cli import compose  # noqa: E402
from dapple_launch.plan_config import PROFILE_BATCH, model_from_config  # noqa: E402
from dapple_launch.profile.measure import _time_layers, combine_passes, settled_times  # noqa: E402


def _bursts(stop, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        end = time.perf_counter() + rng.uniform(0.1, 0.6)
        x = 0
        while time.perf_counter() < end:
            x += 1
        stop.wait(rng.uniform(0.1, 0.6))


def _layer_times(rows) -> list[float]:
    return [f + b for _, f, b, *_ in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--load", type=int, default=4, help="background processes running bursts (0: the machine as it is)")
    ap.add_argument("--out", default="profile_noise.json")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)  # as a rank of the default job: one thread each
    model = model_from_config(compose([]).model)
    stop = mp.Event()
    load = [mp.Process(target=_bursts, args=(stop, s), daemon=True) for s in range(args.load)]
    for p in load:
        p.start()
    ways = {
        "one pass": lambda: combine_passes([_time_layers(model, PROFILE_BATCH, torch.device("cpu"), 5, 0)]),
        "passes until two agree": lambda: settled_times(
            lambda: _time_layers(model, PROFILE_BATCH, torch.device("cpu"), 5, 0)
        )[0],
    }
    per_way: dict[str, list[list[float]]] = {k: [] for k in ways}
    seconds: dict[str, float] = {k: 0.0 for k in ways}
    try:
        for r in range(args.rounds):
            for name in list(ways) if r % 2 == 0 else list(ways)[::-1]:  # alternate who goes first
                t0 = time.perf_counter()
                per_way[name].append(_layer_times(ways[name]()))
                seconds[name] += time.perf_counter() - t0
    finally:
        stop.set()
        for p in load:
            p.join()
    rows = {}
    print(
        f"default model, profile batch {PROFILE_BATCH}, {args.rounds} rounds, "
        f"{f'background bursts on {args.load} processes' if load else 'no added load'}\n"
    )
    print(
        "| profile | total F+B ms (median) | total spread (max/min) | worst layer spread | "
        "rounds within 10 % of the median | s per profile |"
    )
    print("|---|---|---|---|---|---|")
    for name, runs in per_way.items():
        totals = [sum(r) for r in runs]
        med = statistics.median(totals)
        layer_spread = max(max(r[i] for r in runs) / min(r[i] for r in runs) for i in range(len(runs[0])))
        close = sum(abs(t / med - 1) <= 0.10 for t in totals)
        rows[name] = {
            "totals_ms": [t * 1e3 for t in totals],
            "median_ms": med * 1e3,
            "total_spread": max(totals) / min(totals),
            "worst_layer_spread": layer_spread,
            "within_10pct": close,
            "seconds_per_profile": seconds[name] / args.rounds,
        }
        print(
            f"| {name} | {med * 1e3:.2f} | {max(totals) / min(totals):.2f} | {layer_spread:.2f} | "
            f"{close}/{args.rounds} | {seconds[name] / args.rounds:.2f} |"
        )
    Path(args.out).write_text(json.dumps({"rounds": args.rounds, "load_processes": args.load, "ways": rows}, indent=2))


if __name__ == "__main__":
    main()
