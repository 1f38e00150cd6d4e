"""A launch's own time: the default job at its smallest (a 2-layer GPT, 2 steps, 4 ranks), from the
command to its exit, in phases read off its output as it comes: the plan printed, rank 0's first
line, the closing summary, the exit. And a dry run's whole time.

Each round runs this checkout and, with --baseline DIR (a checkout of another commit, e.g. `git
worktree add /tmp/base 1f25ae0`), that one, alternately, so a busy minute falls on both; the
analytic profile's cache is cold (an empty DAPPLE_CACHE) on the first round of each and warm after.

    python benchmarks/launch.py [--rounds 3] [--baseline DIR] [--out benchmarks/results/launch.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = ["model.num_layers=2", "model.hidden=32", "model.heads=2", "model.seq_len=16"]
JOB = [
    *TINY,
    "trainer.max_steps=2",
    "trainer.progress_bar=false",
    "data.num_train=256",
    "data.num_val=32",
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=1",
]
MARKS = {"plan": "Plan for ", "first rank": "rank 0 (stage", "summary": "done: steps"}


def _launch(checkout: Path, args: list[str], cache: Path, work: Path) -> dict:
    """Seconds from the start to each mark and to the exit."""
    env = {**os.environ, "DAPPLE_CACHE": str(cache), "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = str(checkout)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapple_launch", *args],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: dict = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        for name, mark in MARKS.items():
            if name not in out and mark in line:
                out[name] = time.perf_counter() - start
    code = proc.wait()
    out["exit"] = time.perf_counter() - start
    if code:
        raise SystemExit(f"{checkout}: {' '.join(args)} exited {code}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "launch.json")
    a = ap.parse_args()
    sides = {"this checkout": ROOT, **({"baseline": a.baseline.resolve()} if a.baseline else {})}
    rows: dict = {name: {"cold": [], "warm": [], "dry cold": [], "dry warm": []} for name in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name, checkout in sides.items():
                cache = Path(tmp) / f"cache-{name.replace(' ', '-')}"
                if r == 0:
                    cache.mkdir()
                kind = "cold" if r == 0 else "warm"
                work = Path(tmp) / f"{name.replace(' ', '-')}-{r}"
                work.mkdir()
                if r == 0:  # the dry run first, on its own cold cache
                    dry_cache = Path(tmp) / f"dry-{name.replace(' ', '-')}"
                    dry_cache.mkdir()
                    rows[name]["dry cold"].append(
                        _launch(checkout, [*TINY, "dry_run=true", "hydra.run.dir=dry"], dry_cache, work)
                    )
                    rows[name]["dry warm"].append(
                        _launch(checkout, [*TINY, "dry_run=true", "hydra.run.dir=dry2"], dry_cache, work)
                    )
                rows[name][kind].append(_launch(checkout, [*JOB, "hydra.run.dir=run"], cache, work))
                print(f"round {r} {name} {kind}: {rows[name][kind][-1]}", flush=True)
    table = {}
    for name, kinds in rows.items():
        for kind, runs in kinds.items():
            if runs:
                table[f"{name}, {kind}"] = {
                    k: round(statistics.median(run[k] for run in runs if k in run), 2)
                    for k in [*MARKS, "exit"]
                    if any(k in run for run in runs)
                } | {"runs": len(runs)}
    print(
        "\n| launch | runs | plan printed s | rank 0's first line s | summary s | exit s |\n|---|---|---|---|---|---|"
    )
    for label, t in table.items():
        print(
            f"| {label} | {t['runs']} | {t.get('plan', '')} | {t.get('first rank', '')} | {t.get('summary', '')} | {t['exit']} |"
        )
    a.out.write_text(
        json.dumps({"rounds": a.rounds, "sides": {k: str(v) for k, v in sides.items()}, "median_s": table}, indent=1)
    )
    print(f"\n{a.out}")


if __name__ == "__main__":
    main()
