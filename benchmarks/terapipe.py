"""TeraPipe benchmark: token slices inside each sequence, through this runtime on 4 gloo processes.

Sleep rows: a 4-stage causal model over sequences of L = 1024 tokens whose layers sleep what the
cost model says a slice costs (schedule/terapipe.py: (1 - a) l/L + a l (2c + l)/L² of a whole
sequence's forward or backward), so 2 shared cores do not blur the schedule. At global batch 1, 2
and 4 (one sequence per micro-batch): no slicing, 16 equal slices, and the planner's slices (its
dynamic programme, costed by the simulator); measured iteration against the simulator's.
Real rows: a small GPT (4 stages, 256 tokens) at global batch 8, CPU seconds per rank without
slicing and with 4 equal slices: what slicing costs in real compute (more, smaller calls).

    python benchmarks/terapipe.py [--quick] [--out terapipe.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dapple_launch.cluster import Topology  # noqa: E402
from dapple_launch.models.contract import LayerSpec, PipelineModel  # noqa: E402
from dapple_launch.models.token_slices import current  # noqa: E402
from dapple_launch.planner import Limits, Plan, fixed_plan  # noqa: E402
from dapple_launch.profile import LayerProfile, chain  # noqa: E402
from dapple_launch.runtime.executor import StageExecutor  # noqa: E402
from dapple_launch.runtime.grid import ProcessGrid  # noqa: E402
from dapple_launch.runtime.module import PipelineModule  # noqa: E402
from dapple_launch.runtime.p2p import PointToPoint  # noqa: E402
from tests.multiproc import run_ranks  # noqa: E402

STAGES, L, HIDDEN, VOCAB = 4, 1024, 8, 32
FORWARD_S, BACKWARD_S = 0.12, 0.24  # one whole sequence, one stage
ATTENTION = 0.5  # the share of a stage's work that is causal attention (grows with the context)


def slice_share(length: int, context: int) -> float:
    return (1 - ATTENTION) * length / L + ATTENTION * length * (2 * context + length) / L**2


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        piece = current()
        ctx.share = slice_share(piece.stop - piece.start, piece.start) if piece else 1.0
        time.sleep(FORWARD_S * ctx.share)
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        time.sleep(BACKWARD_S * ctx.share)
        return g * w, (g * x).sum((0, 1))


class SleepStage(nn.Module):
    def __init__(self, first: bool, last: bool):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN) if first else None
        self.w = nn.Parameter(torch.ones(HIDDEN))
        self.head = nn.Linear(HIDDEN, VOCAB) if last else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        x = _Sleep.apply(x, self.w)
        return self.head(x) if self.head is not None else x


class SleepLM(PipelineModel):
    """A causal LM in miniature whose stages sleep a slice's modelled cost."""

    name, seq_len, vocab_size = "sleep-lm", L, VOCAB

    def layers(self):
        return [LayerSpec(f"stage{s}", lambda s=s: SleepStage(s == 0, s == STAGES - 1)) for s in range(STAGES)]

    def loss(self, output, target):
        return F.cross_entropy(output.flatten(0, 1), target.flatten(), reduction="none").view(target.shape).mean(1)

    def slice_loss(self, output, target, start, stop):
        part = target[:, start:stop]
        return F.cross_entropy(output.flatten(0, 1), part.flatten(), reduction="none").view(part.shape).sum(1) / L

    def batch(self, n, generator=None, device="cpu"):
        ids = torch.randint(0, VOCAB, (n, L + 1), generator=generator)
        return ids[:, :-1], ids[:, 1:]


PROBE_FORWARD_S, PROBE_BACKWARD_S = 0.03, 0.06  # the calibration's sleeps: short, so the runtime's cost shows


def sleep_profile(per_call_s: float = 0.0, forward_s: float = FORWARD_S, backward_s: float = BACKWARD_S):
    """What a measured profile would say of these layers: the sleeps, plus what the runtime pays per
    call whatever its tokens (`per_call_s`, calibrated in main), as each call's fixed part."""
    layers = [
        LayerProfile(
            f"stage{s}",
            forward_s + per_call_s,
            backward_s + per_call_s,
            4.0 * HIDDEN * L,
            4.0 * HIDDEN,
            slice_compute=ATTENTION,
            forward_fixed_s=per_call_s,
            backward_fixed_s=per_call_s,
        )
        for s in range(STAGES)
    ]
    return chain("sleep-lm", layers, batch_size=1)


def topology():
    # gloo between local processes: a fraction of a millisecond per transfer, plenty of bandwidth
    return Topology(
        "local-sleep",
        1,
        STAGES,
        8e9,
        1.0,
        1e9,
        1e9,
        intra_node_latency_s=3e-4,
        inter_node_latency_s=3e-4,
        device_kind="cpu",
    )


def plans(G: int, per_call_s: float) -> dict[str, Plan]:
    profile, topo = sleep_profile(per_call_s), topology()
    none = fixed_plan(profile, topo, G, STAGES, [1], G, Limits(schedule="gpipe"))
    equal = fixed_plan(profile, topo, G, STAGES, [1], G, Limits(token_slices=(L // 16,) * 16))
    chosen = fixed_plan(profile, topo, G, STAGES, [1], G, Limits(schedule="gpipe", auto_token_slices=True, seq_len=L))
    return {"none": none, "equal 16": equal, "planner": chosen}


def _run(rank, world, plan_json, model_kind, iterations):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    plan = Plan.from_json(plan_json)
    global FORWARD_S, BACKWARD_S
    if model_kind == "calibrate":  # short sleeps: what the runtime itself costs per action shows
        FORWARD_S, BACKWARD_S = PROBE_FORWARD_S, PROBE_BACKWARD_S
    model = SleepLM() if model_kind in ("sleep", "calibrate") else real_model()
    grid = ProcessGrid.from_plan(plan)
    stage, replica = grid.position(rank)
    a, b = plan.stages[stage].layers
    local = PipelineModule(model).materialize(list(range(a, b)))
    ex = StageExecutor(
        local.local_stack(),
        model.loss,
        PointToPoint(grid, stage, replica),
        grid.num_stages,
        slice_loss_fn=model.slice_loss,
    )
    batch = model.batch(plan.global_batch_size, torch.Generator().manual_seed(1))
    walls, cpus = [], []
    for i in range(iterations + 1):  # the first connects the peers and learns the shapes
        dist.barrier()
        w0, c0 = time.perf_counter(), time.process_time()
        ex.run(plan.build_schedule(), batch)
        local.zero_grad(set_to_none=True)
        if i:
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}


def real_model():
    from dapple_launch.models import build_model

    return build_model("gpt", "tiny", num_layers=2, hidden=64, heads=4, seq_len=256, vocab_size=64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 timed iterations per row (about 3 minutes here)")
    ap.add_argument("--out", default="terapipe.json")
    args = ap.parse_args(argv)
    iters = 2 if args.quick else 4
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # Calibration, as a measured profile fits each layer's fixed cost per call: the same model with
        # short sleeps (a twentieth of the rows'), 64 slices of one sequence; what the run takes beyond
        # the simulator's figure for the sleeps alone, per action and stage over the pipeline's
        # 2 (K + S - 1) steps, is the runtime's own cost per call.
        probe = fixed_plan(
            sleep_profile(0.0, PROBE_FORWARD_S, PROBE_BACKWARD_S),
            topology(),
            1,
            STAGES,
            [1],
            1,
            Limits(token_slices=(L // 64,) * 64),
        )
        wall = max(r["wall_s"] for r in run_ranks(STAGES, _run, (probe.to_json(), "calibrate", iters + 1), tmp))
        per_call = max(0.0, wall - probe.estimate.simulated_iteration_s) / (2 * (64 + STAGES - 1))
        print(
            f"calibration: the runtime costs {per_call * 1e3:.2f} ms per action and stage (64 slices, sleeps of "
            f"{PROBE_FORWARD_S}/{PROBE_BACKWARD_S} s per sequence: {wall:.3f} s measured, "
            f"{probe.estimate.simulated_iteration_s:.3f} s for the sleeps)\n"
        )
        print("| global batch | slicing | slices | measured | simulator | error | speed-up over no slicing |")
        print("|---|---|---|---|---|---|---|")
        for G in (1, 2, 4):
            base = None
            for name, plan in plans(G, per_call).items():
                res = run_ranks(STAGES, _run, (plan.to_json(), "sleep", iters), tmp)
                measured = max(r["wall_s"] for r in res)
                predicted = plan.estimate.simulated_iteration_s
                base = base or measured
                row = {
                    "G": G,
                    "slicing": name,
                    "slices": list(plan.token_slices),
                    "measured_s": measured,
                    "simulated_s": predicted,
                    "error": measured / predicted - 1,
                    "speedup": base / measured,
                }
                rows.append(row)
                shown = (
                    f"{len(plan.token_slices)}: {plan.token_slices[0]}…{plan.token_slices[-1]}"
                    if plan.token_slices
                    else "-"
                )
                print(
                    f"| {G} | {name} | {shown} | {measured:.3f} s | {predicted:.3f} s | {row['error']:+.1%} "
                    f"| {row['speedup']:.2f}× |",
                    flush=True,
                )
        # real compute: a small GPT, CPU seconds per rank, unsliced against 4 equal slices at global batch 8
        topo = Topology("local", 1, STAGES, 8e9, 0.05, 1e9, 1e9, device_kind="cpu")
        from dapple_launch.profile import analytic_profile

        model = real_model()
        profile = analytic_profile(model, 2, topo.device_tflops, "cpu")
        real = {}
        for name, limits in (("none", Limits(schedule="gpipe")), ("4 equal slices", Limits(token_slices=(64,) * 4))):
            plan = fixed_plan(profile, topo, 8, STAGES, [1], 8, limits)
            res = run_ranks(STAGES, _run, (plan.to_json(), "real", iters + 1), tmp)
            real[name] = {"cpu_s": [r["cpu_s"] for r in res], "wall_s": max(r["wall_s"] for r in res)}
    cpu_ratio = statistics.median(s / n for s, n in zip(real["4 equal slices"]["cpu_s"], real["none"]["cpu_s"]))
    print(
        f"\nreal compute (GPT, 256 tokens, 4 stages, global batch 8): CPU s per rank unsliced "
        f"{[round(x, 3) for x in real['none']['cpu_s']]}, 4 slices {[round(x, 3) for x in real['4 equal slices']['cpu_s']]}"
        f": slicing costs {cpu_ratio:.2f}× the CPU time (median over ranks)"
    )
    at_one = next(r for r in rows if r["G"] == 1 and r["slicing"] == "planner")
    worst = max(abs(r["error"]) for r in rows)
    out = {
        "rows": rows,
        "real": real,
        "slicing_cpu_ratio": cpu_ratio,
        "per_action_s": per_call,
        "speedup_over_no_slicing": at_one["speedup"],
        "simulator_error": worst,
    }
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(
        f"speed-up over no slicing at global batch 1 (planner's slices): {at_one['speedup']:.2f}×; "
        f"worst simulator error {worst:.1%}; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
