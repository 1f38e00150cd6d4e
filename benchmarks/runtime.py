"""This runtime against torch.distributed.pipelining, side by side in one run, 4 gloo processes.

1. sleep rows: 4 stages × 1 replica, layers that sleep a known time (20 ms forward, 40 ms
   backward per micro-batch), GPipe and 1F1B through our executor and through
   torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B on PipelineStage: iteration time
   ours / theirs and ours / the simulator's prediction (each action its sleep plus the runtime's
   own cost per action, calibrated on a run of the same layers sleeping nothing). Both runtimes
   run in the same 4 processes, iterations alternating, `--repeats` runs (as the compute rows).
2. compute rows: the same cut with real layers (Linear + GELU): CPU seconds per rank per
   iteration, ours / theirs (process CPU time, so gloo's own threads count on both sides; the
   row's ratio is of the mean over ranks). Both runtimes run in the same 4 processes, iterations
   alternating, so the drifting load of 2 shared cores falls on both alike; `--repeats` such runs,
   each rank keeping its median.
3. saved activation bytes per stage (saved-tensor hooks, exact) on every row, ours / theirs.
4. interleaved 1F1B, interleaved zero bubble and ZB-V (benchmarks/runtime_chunked.py): 8 stages on
   the 4 processes (2 per rank) against torch's ScheduleInterleaved1F1B,
   ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble on the same stages:
   sleep rows (time, and the rank-order simulator with the runtime's per-action cost calibrated on
   a no-sleep row), compute rows (CPU), saved bytes per rank.
5. uneven: a model whose last layer holds most parameters (VGG's FC layers in miniature), on 4
   processes: the 3:1 plan torch.distributed.pipelining cannot express, against every uniform plan
   (4 data-parallel replicas, 2:2, 4 stages), each at its best micro-batch count; and the
   planner, given a profile of the known layer costs and a topology with gloo's bandwidth as
   probed in this run and the runtime's cost per action as calibrated on the idle 1F1B row
   (Topology.action_overhead_s), picks its plan and estimates it.
6. stages of round-robin copies (benchmarks/runtime_round_robin.py; torch has none): 1f1b_rr and
   zb_h1_rr on a 3:1 layout whose replica count divides no micro-batch, against the simulator
   (time, and saved bytes exactly) and against 1F1B on the same processes and layout.

    python benchmarks/runtime.py [--quick] [--iterations N] [--out runtime.json]

Writes runtime.json with sleep_time_ratio, cpu_time_ratio, activation_bytes_ratio (ours / theirs,
worst row) and simulator_error (worst relative error of the sleep rows), per schedule the same under
"schedules", plus every row.
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
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import runtime_chunked as chunked
from benchmarks import runtime_round_robin as round_robin
from benchmarks.common import SavedBytes, SleepLayer, median_runs, time_iterations, timed
from dapple_launch.cluster import Topology
from dapple_launch.planner import Limits
from dapple_launch.planner.cost import StageSpec, evaluate
from dapple_launch.planner.search import plan as run_planner
from dapple_launch.profile.model_profile import LayerProfile, ModelProfile
from dapple_launch.runtime.executor import GradientSync, StageExecutor
from dapple_launch.runtime.grid import ProcessGrid
from dapple_launch.runtime.p2p import PointToPoint
from dapple_launch.schedule import StageCosts, build_schedule, simulate
from tests.multiproc import run_ranks

WORLD, WIDTH = 4, 2048
SLEEP_F, SLEEP_B, SLEEP_BATCH = 0.020, 0.040, 4  # per micro-batch; samples per micro-batch
COMPUTE_WIDTH, COMPUTE_BATCH = 768, 32
COMPUTE_ITERATIONS = 10  # per side and run of a compute row (a tenth of a second each)
# uneven model: three light-parameter layers and one parameter-heavy layer, per-sample sleep
UNEVEN_F, UNEVEN_B, UNEVEN_BIG, UNEVEN_G = 0.0015, 0.003, 4_000_000, 24


def _stage_layers(kind: str) -> nn.Module:
    if kind in ("sleep", "idle"):  # idle: the same tensors and actions, nothing to wait for (the runtime's own cost)
        return nn.Sequential(SleepLayer(WIDTH, SLEEP_F, SLEEP_B) if kind == "sleep" else SleepLayer(WIDTH, 0.0, 0.0))
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(COMPUTE_WIDTH, COMPUTE_WIDTH), nn.GELU(), nn.Linear(COMPUTE_WIDTH, COMPUTE_WIDTH), nn.GELU()
    )


def _per_sample_loss(y, t):
    return y.float().pow(2).mean(1)


def _ours_step(rank, world, kind, schedule_name, micro_batches):
    grid = ProcessGrid((1,) * world)
    layers = _stage_layers(kind)
    ex = StageExecutor(layers, _per_sample_loss, PointToPoint(grid, rank, 0), world)
    schedule = build_schedule(schedule_name, world, micro_batches)
    n = (COMPUTE_BATCH if kind == "compute" else SLEEP_BATCH) * micro_batches
    width = COMPUTE_WIDTH if kind == "compute" else WIDTH
    batch = (torch.randn(n, width, generator=torch.Generator().manual_seed(1)), torch.zeros(n))

    def step():
        ex.run(schedule, batch)
        layers.zero_grad(set_to_none=True)

    return step, SavedBytes()


def _theirs_step(rank, world, kind, schedule_name, micro_batches):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    layers = _stage_layers(kind)
    stage = PipelineStage(layers, rank, world, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    sched = cls(stage, micro_batches, loss_fn=lambda y, t: _per_sample_loss(y, t).mean())
    n = (COMPUTE_BATCH if kind == "compute" else SLEEP_BATCH) * micro_batches
    width = COMPUTE_WIDTH if kind == "compute" else WIDTH
    x = torch.randn(n, width, generator=torch.Generator().manual_seed(1))
    target = torch.zeros(n)

    def step():
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=target, losses=[], return_outputs=False)
        else:
            sched.step()
        layers.zero_grad(set_to_none=True)

    return step, SavedBytes()


# ---- uneven plans ----------------------------------------------------------------------------
OURS = (("ours", _ours_step),)  # (a side of common.timed)


def _uneven_layers() -> list[nn.Module]:
    return [SleepLayer(WIDTH, UNEVEN_F, UNEVEN_B, per_sample=True) for _ in range(3)] + [
        SleepLayer(WIDTH, UNEVEN_F, UNEVEN_B, per_sample=True, extra_params=UNEVEN_BIG)
    ]


def _probe(rank, world, nbytes, iterations):
    """gloo on this machine: point-to-point and 4-way all-reduce bandwidth, for the planner's topology."""
    t = torch.zeros(int(nbytes // 4))
    p2p, ar = [], []
    for _ in range(iterations + 1):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(t, 1)
        elif rank == 1:
            dist.recv(t, 0)
        p2p.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        ar.append(time.perf_counter() - t0)
    return {"p2p_s": statistics.median(p2p[1:]), "allreduce_s": statistics.median(ar[1:])}


def _uneven(rank, world, replicas, cuts, micro_batches, iterations):
    grid = ProcessGrid(tuple(replicas))
    stage, replica = grid.position(rank)
    bounds = [0, *cuts, 4]
    all_layers = _uneven_layers()
    layers = nn.Sequential(*all_layers[bounds[stage] : bounds[stage + 1]])
    groups = [dist.new_group(grid.stage_ranks(s)) for s in range(grid.num_stages)]
    params = list(layers.parameters())
    sync = GradientSync(params, groups[stage], grid.replicas[stage])
    ex = StageExecutor(
        layers, _per_sample_loss, PointToPoint(grid, stage, replica), grid.num_stages, on_last_backward=sync.start
    )
    schedule = build_schedule("1f1b", grid.num_stages, micro_batches)
    batch = (torch.randn(UNEVEN_G, WIDTH, generator=torch.Generator().manual_seed(1)), torch.zeros(UNEVEN_G))

    def step():
        ex.run(schedule, batch)
        sync.finish()
        layers.zero_grad(set_to_none=True)

    return time_iterations(step, iterations, SavedBytes())


def uneven_profile() -> ModelProfile:
    small, big = WIDTH * 4.0, (UNEVEN_BIG + WIDTH) * 4.0
    layers = tuple(
        LayerProfile(
            f"layer{i}",
            UNEVEN_F,
            UNEVEN_B,
            WIDTH * 4.0,
            small + (big if i == 3 else 0.0),
            inputs=(i - 1,) if i else (),
            saved_bytes=2 * WIDTH * 4.0,
        )
        for i in range(4)
    )
    return ModelProfile("uneven-sleep", layers, batch_size=1, source="known sleep costs", device="cpu")


def probed_topology(probe: dict) -> Topology:
    nbytes = probe["bytes"]
    ar_bus = 2 * (WORLD - 1) / WORLD * nbytes / probe["allreduce_s"]  # ring formula, solved for bandwidth
    return Topology(
        "this machine (probed)",
        1,
        WORLD,
        4e9,
        1.0,
        nbytes / probe["p2p_s"],
        nbytes / probe["p2p_s"],
        intra_node_latency_s=50e-6,
        inter_node_latency_s=50e-6,
        intra_node_allreduce_bandwidth=ar_bus,
        device_kind="cpu",
        action_overhead_s=probe["action_overhead_s"],
    )


UNEVEN_LAYOUTS = {
    "3:1 (uneven)": ((3, 1), (3,)),
    "4 (data parallel)": ((4,), ()),
    "2:2": ((2, 2), (2,)),
    "1:1:1:1": ((1, 1, 1, 1), (1, 2, 3)),
}


def best_micro_batches(profile, topo, replicas, cuts) -> tuple[int, float]:
    bounds = [0, *cuts, 4]
    devices, d = [], 0
    for r in replicas:
        devices.append(tuple(range(d, d + r)))
        d += r
    layout = tuple(StageSpec(a, z, ds) for a, z, ds in zip(bounds, bounds[1:], devices))
    best = None
    for m in (1, 2, 3, 4, 6, 8, 12, 24):
        b = UNEVEN_G // m
        if m < len(replicas) or b < max(replicas):
            continue
        c = evaluate(profile, topo, layout, b, m, Limits(optimizer_factor=1.0))
        if best is None or c.iteration_s < best[1]:
            best = (m, c.iteration_s)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--quick", action="store_true", help="fewer rows and iterations, every schedule (under 10 minutes here)"
    )
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3, help="side-by-side runs per row (each rank's median over them)")
    ap.add_argument("--out", default="runtime.json")
    args = ap.parse_args()
    iters = args.iterations or (3 if args.quick else 5)
    micro = (4, 8) if args.quick else (4, 8, 16)
    rows, uneven, chimera = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        per_action = {}  # the runtime's own cost per compute action, from a no-sleep run (as the chunked rows)
        for name in ("gpipe", "1f1b"):
            idle = run_ranks(WORLD, timed, (OURS, ("idle", name, micro[-1]), iters), tmp)
            unit = simulate(build_schedule(name, WORLD, micro[-1]), [StageCosts(1.0, 1.0)] * WORLD, record=False)
            per_action[name] = max(r["wall_s"] for r in idle) / unit.iteration_s
        for kind in ("sleep", "compute"):
            for name in ("gpipe", "1f1b"):
                for m in micro if kind == "sleep" else micro[-1:]:
                    row = _row(
                        kind,
                        name,
                        m,
                        *_measure(kind, (_ours_step, _theirs_step), (kind, name, m), iters, args.repeats, tmp),
                    )
                    if kind == "sleep":
                        a = per_action[name]
                        sim = simulate(
                            build_schedule(name, WORLD, m),
                            [StageCosts(SLEEP_F, SLEEP_B, action_s=a)] * WORLD,
                            record=False,
                        )
                        row["simulated_s"], row["per_action_s"] = sim.iteration_s, a
                        row["simulator_error"] = row["ours_wall_s"] / sim.iteration_s - 1
                    rows.append(row)
                    print(
                        f"  {kind} {name} M={m}: ours {row['ours_wall_s']:.3f} s, theirs {row['theirs_wall_s']:.3f} s",
                        flush=True,
                    )
        for m in micro:  # Chimera: ours only (torch has none), against the simulator and our 1F1B row
            idle = run_ranks(WORLD, timed, (chunked.OURS, ("idle", "chimera", 2, m), iters), tmp)
            chunk_action = chunked.per_action_cost(max(r["wall_s"] for r in idle), "chimera", 2, m)
            res = run_ranks(WORLD, timed, (chunked.OURS, ("sleep", "chimera", 2, m), iters), tmp)
            one = next(r for r in rows if r["kind"] == "sleep" and r["schedule"] == "1f1b" and r["micro_batches"] == m)
            row = {
                "kind": "sleep",
                "schedule": "chimera",
                "micro_batches": m,
                "chunks": 2,
                "ours_wall_s": max(r["wall_s"] for r in res),
                "ours_saved": [r["peak_saved_bytes"] for r in res],
                "simulated_s": chunked.predicted("chimera", 2, m, chunk_action),
                "per_action_s": chunk_action,
                "over_1f1b": max(r["wall_s"] for r in res) / one["ours_wall_s"],
            }
            row["simulator_error"] = row["ours_wall_s"] / row["simulated_s"] - 1
            chimera.append(row)
            print(
                f"  sleep chimera M={m}: ours {row['ours_wall_s']:.3f} s (1F1B {one['ours_wall_s']:.3f} s)", flush=True
            )
        for name in chunked.TORCH:  # 2 stages per rank
            idle = run_ranks(WORLD, timed, (chunked.OURS, ("idle", name, 2, micro[-1]), iters), tmp)
            chunk_action = chunked.per_action_cost(max(r["wall_s"] for r in idle), name, 2, micro[-1])
            for kind in ("sleep", "compute"):
                for m in micro if kind == "sleep" else micro[-1:]:
                    row = _row(
                        kind,
                        name,
                        m,
                        *_measure(
                            kind, (chunked.ours_step, chunked.theirs_step), (kind, name, 2, m), iters, args.repeats, tmp
                        ),
                    )
                    row["chunks"] = 2
                    if kind == "sleep":
                        row["simulated_s"] = chunked.predicted(name, 2, m, chunk_action)
                        row["per_action_s"] = chunk_action
                        row["simulator_error"] = row["ours_wall_s"] / row["simulated_s"] - 1
                    rows.append(row)
                    print(
                        f"  {kind} {name} M={m}: ours {row['ours_wall_s']:.3f} s, theirs {row['theirs_wall_s']:.3f} s",
                        flush=True,
                    )
        nbytes = (UNEVEN_BIG + WIDTH) * 4.0
        probes = run_ranks(WORLD, _probe, (nbytes, iters), tmp)
        # with the runtime's own cost per action, as calibrated above for the simulator's sleep rows: the
        # planner's topology carries it (Topology.action_overhead_s), so its estimates and its choice
        # count the 2 M actions each stage runs
        probe = {
            "bytes": nbytes,
            "p2p_s": probes[1]["p2p_s"],
            "allreduce_s": max(p["allreduce_s"] for p in probes),
            "action_overhead_s": per_action["1f1b"],
        }
        profile, topo = uneven_profile(), probed_topology(probe)
        chosen = run_planner(profile, topo, UNEVEN_G, Limits(optimizer_factor=1.0))
        for label, (replicas, cuts) in UNEVEN_LAYOUTS.items():
            m, estimate = best_micro_batches(profile, topo, replicas, cuts)
            res = run_ranks(WORLD, _uneven, (replicas, cuts, m, iters), tmp)
            measured = max(r["wall_s"] for r in res)
            uneven.append(
                {
                    "plan": label,
                    "micro_batches": m,
                    "measured_s": measured,
                    "estimate_s": estimate,
                    "estimate_error": estimate / measured - 1,
                }
            )
            print(f"  uneven {label} M={m}: {measured:.3f} s (estimate {estimate:.3f} s)", flush=True)
        copies = round_robin.measure(args.quick, iters, tmp)
    report(rows, uneven, probe, chosen, args.out, chimera, copies)


def _measure(kind: str, steps: tuple, row_args: tuple, iters: int, repeats: int, tmp: str) -> tuple[list, list]:
    """Per rank, ours and theirs (`steps`: their step builders), both runtimes side by side in the same
    processes, iterations alternating (common.time_side_by_side), `repeats` such runs, each rank's
    median over them. Sleep rows too: their wall time is the sleeps', but wake-ups and transfers on 2
    shared cores move one run's median of 3 iterations by ±0.5 % (1F1B M=4: 1.007 in one run, 0.998,
    1.002 and 1.001 in three runs of 12 iterations side by side), as much as the runtimes could
    differ; compute rows at least COMPUTE_ITERATIONS per run (CPU seconds drift the same way)."""
    sides = (("ours", steps[0]), ("theirs", steps[1]))
    n = iters if kind == "sleep" else max(iters, COMPUTE_ITERATIONS)
    runs = [run_ranks(WORLD, timed, (sides, row_args, n), tmp) for _ in range(repeats)]
    return (
        median_runs([[r["ours"] for r in run] for run in runs]),
        median_runs([[r["theirs"] for r in run] for run in runs]),
    )


def _row(kind, name, m, ours, theirs) -> dict:
    row = {
        "kind": kind,
        "schedule": name,
        "micro_batches": m,
        "ours_wall_s": max(r["wall_s"] for r in ours),
        "theirs_wall_s": max(r["wall_s"] for r in theirs),
        "ours_cpu_s": [r["cpu_s"] for r in ours],
        "theirs_cpu_s": [r["cpu_s"] for r in theirs],
        "ours_saved": [r["peak_saved_bytes"] for r in ours],
        "theirs_saved": [r["peak_saved_bytes"] for r in theirs],
    }
    row["time_ratio"] = row["ours_wall_s"] / row["theirs_wall_s"]
    row["cpu_ratio"] = sum(row["ours_cpu_s"]) / sum(row["theirs_cpu_s"])
    row["cpu_ratio_worst_rank"] = max(a / b for a, b in zip(row["ours_cpu_s"], row["theirs_cpu_s"]))
    row["saved_ratio"] = max(a / b for a, b in zip(row["ours_saved"], row["theirs_saved"]) if b)
    return row


def report(rows, uneven, probe, chosen, out, chimera=(), copies=()) -> None:
    print(
        f"\n{WORLD} gloo processes, 1 thread each; median of the timed iterations; ours / theirs = this runtime / "
        f"torch.distributed.pipelining\n"
    )
    print(
        "| layers | schedule | M | ours s | theirs s | time ours/theirs | ours vs simulator | CPU s/rank ours "
        "| CPU s/rank theirs | CPU ours/theirs (mean; worst rank) | saved MiB/stage ours | saved MiB/stage theirs | "
        "saved ours/theirs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mib = lambda xs: ", ".join(f"{x / 2**20:.2f}" for x in xs)
        cpu = lambda xs: ", ".join(f"{x:.3f}" for x in xs)
        sim = f"{r['simulator_error']:+.1%}" if "simulator_error" in r else ""
        print(
            f"| {r['kind']} | {r['schedule']}{' (2 stages per rank)' if r.get('chunks') else ''} | {r['micro_batches']} | {r['ours_wall_s']:.3f} | "
            f"{r['theirs_wall_s']:.3f} | {r['time_ratio']:.3f} | {sim} | {cpu(r['ours_cpu_s'])} | "
            f"{cpu(r['theirs_cpu_s'])} | {r['cpu_ratio']:.3f}; {r['cpu_ratio_worst_rank']:.3f} | {mib(r['ours_saved'])} | {mib(r['theirs_saved'])} | "
            f"{r['saved_ratio']:.3f} |"
        )
    if chimera:
        print(
            "\nChimera (torch.distributed.pipelining has none): 4 stages on 4 processes, two pipelines in opposite "
            "directions, same per-stage costs as the 1F1B sleep rows\n"
        )
        print("| M | ours s | simulator s | ours vs simulator | / our 1F1B | saved MiB/rank |")
        print("|---|---|---|---|---|---|")
        for r in chimera:
            print(
                f"| {r['micro_batches']} | {r['ours_wall_s']:.3f} | {r['simulated_s']:.3f} | {r['simulator_error']:+.1%} "
                f"| {r['over_1f1b']:.3f} | {', '.join(f'{x / 2**20:.2f}' for x in r['ours_saved'])} |"
            )
    best_uniform = min((u for u in uneven if "uneven" not in u["plan"]), key=lambda u: u["measured_s"])
    ours = next(u for u in uneven if "uneven" in u["plan"])
    print(
        f"\nuneven model (3 layers of {UNEVEN_F * 1e3:g}/{UNEVEN_B * 1e3:g} ms per sample, the last with "
        f"{UNEVEN_BIG / 1e6:g} M parameters), global batch {UNEVEN_G}; gloo probed: point-to-point "
        f"{probe['bytes'] / probe['p2p_s'] / 1e9:.2f} GB/s, 4-way all-reduce of {probe['bytes'] / 1e6:.0f} MB in "
        f"{probe['allreduce_s'] * 1e3:.0f} ms\n"
    )
    print("| plan | M | measured s | planner estimate s | estimate error |")
    print("|---|---|---|---|---|")
    for u in uneven:
        print(
            f"| {u['plan']} | {u['micro_batches']} | {u['measured_s']:.3f} | {u['estimate_s']:.3f} | "
            f"{u['estimate_error']:+.1%} |"
        )
    print(
        f"\n3:1 / best uniform ({best_uniform['plan']}): {ours['measured_s'] / best_uniform['measured_s']:.3f}; "
        f"the planner picked {chosen.layout()} with {chosen.num_micro_batches} micro-batches "
        f"(estimate {chosen.estimate.iteration_s:.3f} s; the runtime's cost per action "
        f"{probe['action_overhead_s'] * 1e3:.2f} ms, calibrated on the idle 1F1B row)"
    )
    rr = round_robin.report(copies) if copies else None
    sleep = [r for r in rows if r["kind"] == "sleep"]
    summary = {
        "sleep_time_ratio": max(r["time_ratio"] for r in sleep),
        "cpu_time_ratio": max(r["cpu_ratio"] for r in rows if r["kind"] == "compute"),
        "activation_bytes_ratio": max(r["saved_ratio"] for r in rows),
        "simulator_error": max(abs(r["simulator_error"]) for r in sleep),
        "uneven_over_best_uniform": ours["measured_s"] / best_uniform["measured_s"],
        "planner_choice": {
            "layout": chosen.layout(),
            "num_micro_batches": chosen.num_micro_batches,
            "estimate_s": chosen.estimate.iteration_s,
        },
        "schedules": {
            name: {
                "sleep_time_ratio": max(r["time_ratio"] for r in sleep if r["schedule"] == name),
                "activation_bytes_ratio": max(r["saved_ratio"] for r in rows if r["schedule"] == name),
                "simulator_error": max(abs(r["simulator_error"]) for r in sleep if r["schedule"] == name),
                "cpu_time_ratio": max(r["cpu_ratio"] for r in rows if r["schedule"] == name and r["kind"] == "compute"),
            }
            for name in dict.fromkeys(r["schedule"] for r in rows)
        }
        | (
            {
                "chimera": {
                    "simulator_error": max(abs(r["simulator_error"]) for r in chimera),
                    "over_1f1b": max(r["over_1f1b"] for r in chimera),
                }
            }
            if chimera
            else {}
        )
        | (
            {name: v | {"over_best_1f1b": rr["over_best_1f1b"][name]} for name, v in rr["schedules"].items()}
            if rr
            else {}
        ),
        "round_robin": rr,
        "probe": probe,
        "rows": rows,
        "uneven": uneven,
        "chimera": list(chimera),
    }
    print(
        "\n"
        + " · ".join(
            f"{k} {summary[k]:.3f}"
            for k in ("sleep_time_ratio", "cpu_time_ratio", "activation_bytes_ratio", "simulator_error")
        )
    )
    Path(out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
