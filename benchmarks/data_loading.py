"""What each rank reads of a global batch (data/rank_batch.py) against reading it whole.

For plans of every family on 8 ranks with GPT-style token batches (inputs and targets of
`seq_len` int64 ids), each rank's RankView loads one global batch and the bytes of tensors it then
holds are counted exactly (data.rank_batch.batch_bytes; what is pinned and copied to the device), as
are the samples it loads. The "whole" column is what every rank held before: the global batch.

    python benchmarks/data_loading.py          # table on stdout, benchmarks/results/data_loading.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dapple_launch.data.rank_batch import RankView, batch_bytes  # noqa: E402
from dapple_launch.models import build_model  # noqa: E402
from dapple_launch.runtime.grid import ProcessGrid  # noqa: E402
from dapple_launch.runtime.rank_rows import rank_reads  # noqa: E402
from tests.rank_batches import Rows  # noqa: E402
from tests.test_chunked_numerics import chunked_plan  # noqa: E402
from tests.test_pipeline_numerics import make_plan  # noqa: E402
from tests.test_round_robin_numerics import rr_plan  # noqa: E402

SEQ = 1024  # the batch's sequence length (the plans' model is tiny; only the batch's rows matter here)


def layouts(g: int):
    deep = build_model("gpt", "tiny", num_layers=14, hidden=32, heads=2, seq_len=8, vocab_size=40)
    return {
        "1f1b 4 stages x 2": lambda: make_plan(deep, (2, 2, 2, 2), "1f1b", 8, g),
        "1f1b 8 stages": lambda: make_plan(deep, (1,) * 8, "1f1b", 8, g),
        "zb_h1 5:1:1:1": lambda: make_plan(deep, (5, 1, 1, 1), "zb_h1", 8, g),
        "interleaved 8 groups": lambda: chunked_plan(deep, (1,) * 8, "interleaved_1f1b", 16, 8, g),
        "zbv 4 groups x 2": lambda: chunked_plan(deep, (2, 2, 2, 2), "zbv", 8, 8, g),
        "chimera D4 x 2": lambda: chunked_plan(deep, (2, 2, 2, 2), "chimera", 4, 8, g),
        "copies 4:4 1f1b_rr": lambda: rr_plan(deep, (4, 4), (2, 2), "1f1b_rr", 8, g),
    }


def measure(plan, g: int) -> dict:
    grid = ProcessGrid.from_plan(plan)
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randint(0, 50_000, (g, SEQ), generator=gen), torch.randint(0, 50_000, (g, SEQ), generator=gen))
    whole = batch_bytes(batch)
    schedule = plan.build_schedule()
    held, samples = [], []
    for r in range(grid.world_size):
        reads = rank_reads(grid, schedule, r, g)
        got = RankView(Rows(batch), {g: reads}).__getitems__(list(range(g)))
        held.append(batch_bytes(got))
        samples.append(len(reads.rows))
    return {
        "ranks": grid.world_size,
        "whole_bytes_per_rank": whole,
        "bytes_per_rank": held,
        "samples_per_rank": samples,
        "all_ranks_ratio": sum(held) / (whole * grid.world_size),
        "busiest_rank_ratio": max(held) / whole,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "data_loading.json"))
    args = ap.parse_args()
    g = args.global_batch
    rows = {name: measure(make(), g) for name, make in layouts(g).items()}
    print(
        f"global batch {g} × {SEQ} tokens (inputs + targets, int64): {2 * g * SEQ * 8 / 2**20:.1f} MiB read by every rank before"
    )
    print("| plan | ranks | MiB per rank (now) | all ranks / before | busiest rank / before |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        per = " ".join(f"{b / 2**20:.2f}" for b in r["bytes_per_rank"])
        print(f"| {name} | {r['ranks']} | {per} | {r['all_ranks_ratio']:.3f} | {r['busiest_rank_ratio']:.3f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"global_batch": g, "seq_len": SEQ, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
