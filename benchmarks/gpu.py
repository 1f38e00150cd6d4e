"""The command on this machine's GPU against the planner's estimates (issue 38's device check).

Runs `python -m dapple_launch` as a user would, on the one GPU this machine shows, described as a
one-node cluster of that GPU (`cluster=h100x8` with its device count and memory read here):

1. the refusal of a plan that needs more GPUs than the node shows (exit 2, one line, nothing started);
2. a training run of `model=gpt` (`--preset`, default xl) under `trainer.precision=bf16-mixed`,
   planned by `strategy=auto` from the profile measured on this GPU (`strategy.profile_source=measured`,
   taken in a process of its own): the measured iteration against the estimate, and the allocator's
   peak (`torch.cuda.max_memory_allocated`, in summary.json) against the plan's memory estimate;
3. exact resume on the GPU (`--resume-preset`, default medium): a run of 2N steps against a run of N
   steps resumed to 2N from its checkpoint, losses compared.

Nothing else depends on a GPU: without CUDA this says so and exits 0 (CI never runs it).

    python benchmarks/gpu.py --out DIR     # DIR/gpu.json, DIR/gpu.md, the runs' logs and plans
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dapple_launch.planner.plan import Plan  # noqa: E402  (pure: no torch)
from dapple_launch.profile.model_profile import ModelProfile  # noqa: E402

FACTS = r"""
import json, torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
try:
    import transformers
    out["transformers"] = transformers.__version__
except ImportError:
    pass
if out["available"]:
    p = torch.cuda.get_device_properties(0)
    out.update(name=p.name, count=torch.cuda.device_count(), memory_bytes=p.total_memory,
               capability=list(torch.cuda.get_device_capability(0)), bf16=torch.cuda.is_bf16_supported(),
               nccl=".".join(map(str, torch.cuda.nccl.version())))
print(json.dumps(out))
"""


def facts() -> dict:
    done = subprocess.run([sys.executable, "-c", FACTS], capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"available": False}


PAIR = r"""
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def rank(r):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=r, world_size=2, device_id=torch.device("cuda", 0))
    x = torch.full((4,), float(r), device="cuda")
    peer = 1 - r
    ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y := torch.empty_like(x), peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    torch.cuda.synchronize()
    print(f"rank {r} received {y.tolist()}", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(rank, nprocs=2)
"""


def nccl_pair(timeout_s: float) -> dict:
    """Two ranks on this one GPU exchanging a tensor over NCCL: the multi-process NCCL path as far as
    one GPU allows (NCCL has refused two ranks of a communicator on one device since 2.5)."""
    script = Path(os.environ.get("TMPDIR", "/tmp")) / "dapple-nccl-pair.py"  # spawn re-imports a file
    script.write_text(PAIR)
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout_s)
        rc, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        rc, text = 124, f"timed out after {timeout_s:.0f} s"
    said = [x.strip() for x in text.splitlines() if "received" in x or "Duplicate GPU" in x or "Error" in x]
    return {"rc": rc, "lines": said[:4]}


def cluster(f: dict) -> list[str]:
    """This machine as a one-node cluster config: h100x8's links and bf16 speed (an H200's dense bf16
    peak is the H100 SXM's), this node's GPU count and memory."""
    name = f["name"].replace(" ", "-").lower()
    return [
        "cluster=h100x8",
        f"cluster.name={name}x{f['count']}",
        f"cluster.devices_per_node={f['count']}",
        f"cluster.device_memory_gib={f['memory_bytes'] / 2**30:.1f}",
        "cluster.launcher=local",
        "trainer.precision=bf16-mixed",
        "trainer.progress_bar=false",
    ]


def launch(overrides: list[str], log: Path, timeout_s: float, env: dict) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dapple_launch", *overrides],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            env=env,
        )
        rc, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc, text = 124, out + err + f"\n(timed out after {timeout_s:.0f} s)"
    wall = time.perf_counter() - t0
    with log.open("a") as fh:
        fh.write(f"\n$ python -m dapple_launch {' '.join(overrides)}\n(rc {rc}, {wall:.1f} s)\n{text}\n")
    return rc, text, wall


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def model_args(args) -> list[str]:
    """The training run's model: a `model=gpt` preset, or any Hugging Face causal LM's config.json
    (`--hf-config DIR`, random initialisation by the family's own code, `--seq-len` tokens)."""
    if args.hf_config:
        return [
            "model=hf",
            f"model.config={Path(args.hf_config).resolve()}",
            "model.init=random",
            f"model.seq_len={args.seq_len}",
        ]
    return ["model=gpt", f"model.preset={args.preset}"]


def train_run(f: dict, args, work: Path, log: Path, env: dict) -> dict:
    run_dir = work / f"run-{args.name}"
    steps = args.steps
    rc, text, wall = launch(
        [
            *cluster(f),
            *model_args(args),
            f"global_batch_size={args.global_batch}",
            "strategy.profile_source=measured",
            f"trainer.max_steps={steps}",
            f"trainer.val_check_interval={steps}",
            "trainer.limit_val_batches=2",
            f"trainer.checkpoint_every_n_steps={steps}",
            "trainer.log_every_n_steps=1",
            f"hydra.run.dir={run_dir}",
        ],
        log,
        args.timeout_s,
        env,
    )
    s, plan = read_json(run_dir / "summary.json") or {}, read_json(run_dir / "plan.json") or {}
    est = plan.get("estimate", {})
    row = {
        "preset": args.name,
        "model": model_args(args),
        "global_batch": args.global_batch,
        "rc": rc,
        "wall_s": round(wall, 1),
        "layout": " | ".join(
            f"{b - a} layers ×{st['replicas']}" for st in plan.get("stages", []) for a, b in [st["layers"]]
        ),
        "schedule": plan.get("schedule"),
        "micro_batch_size": plan.get("micro_batch_size"),
        "num_micro_batches": plan.get("num_micro_batches"),
        "recompute_layers": sum(len(st.get("recompute_layers", [])) for st in plan.get("stages", [])),
        "estimated_s_per_iteration": s.get("estimated_s_per_iteration") or est.get("iteration_s"),
        "measured_s_per_iteration": s.get("measured_s_per_iteration"),
        "measured_s_per_step": s.get("measured_s_per_step"),
        "samples_per_s": s.get("samples_per_s"),
        "estimated_peak_memory_bytes": s.get("estimated_peak_memory_bytes"),
        "measured_peak_memory_bytes": s.get("measured_peak_memory_bytes"),
        "first_train_loss": s.get("first_train_loss"),
        "train_loss": s.get("train_loss"),
        "val_loss": s.get("val_loss"),
        # the rate the launcher chose for the model's size (trainer.lr unset), as it logged it
        "lr_line": next((x[x.index("trainer.lr=") :].strip() for x in text.splitlines() if "trainer.lr=" in x), None),
        "skipped_steps": s.get("skipped_steps"),
        "allocator_retries": s.get("allocator_retries"),
        "device_samples": max(Plan.from_dict(plan).device_samples()) if plan.get("stages") else None,
        "last_lines": text.strip().splitlines()[-8:],
    }
    for name in ("plan.json", "summary.json", "logs/error-rank-0.txt"):
        if (run_dir / name).is_file():
            shutil.copy(run_dir / name, Path(args.out) / f"{args.name}-{Path(name).name}")
    return row


def resume_run(f: dict, args, work: Path, log: Path, env: dict) -> dict:
    """2N steps straight against N steps then resumed to 2N (the same seed, plan and batches)."""
    n = args.resume_steps
    common = [
        *cluster(f),
        "model=gpt",
        f"model.preset={args.resume_preset}",
        f"global_batch_size={args.resume_batch}",
        f"trainer.val_check_interval={4 * n}",
        f"trainer.checkpoint_every_n_steps={n}",
        "trainer.log_every_n_steps=1",
    ]
    straight, broken = work / "straight", work / "resumed"
    limit = args.resume_timeout_s
    r1 = launch([*common, f"trainer.max_steps={2 * n}", f"hydra.run.dir={straight}"], log, limit, env)
    r2 = launch([*common, f"trainer.max_steps={n}", f"hydra.run.dir={broken}"], log, limit, env)
    r3 = launch([*common, f"trainer.max_steps={2 * n}", "ckpt_path=last", f"hydra.run.dir={broken}"], log, limit, env)
    a, b = read_json(straight / "summary.json") or {}, read_json(broken / "summary.json") or {}
    la, lb = a.get("train_loss"), b.get("train_loss")
    return {
        "preset": args.resume_preset,
        "steps": [n, 2 * n],
        "rc": [r1[0], r2[0], r3[0]],
        "straight_loss": la,
        "resumed_loss": lb,
        "resumed_steps": b.get("steps"),
        "abs_difference": abs(la - lb) if la is not None and lb is not None else None,
    }


def profiles_at(cache: Path, samples: int | None, out: Path) -> list[dict]:
    """Each measured profile the run took (the first at the default batch, a later one where the plan
    runs: plan_config.at_operating_point), and what it says one micro-batch's forward and backward of
    every layer take at the plan's samples per device: the first extrapolates, the last measured there."""
    rows = []
    for path in sorted(cache.rglob("*-b*.json")):
        p = ModelProfile.from_json(path.read_text())
        shutil.copy(path, out / f"gpu-measured-profile-b{p.batch_size}.json")
        at = sum(p.seconds(0, p.num_layers, samples)) if samples else None
        rows.append({"batch": [p.batch_size, 4 * p.batch_size], "samples": samples, "layers_s_at_samples": at})
    return sorted(rows, key=lambda r: r["batch"])


def gib(x) -> str:
    return f"{x / 2**30:.1f} GiB" if x else "-"


def table(result: dict) -> str:
    f, t = result["facts"], result.get("train") or {}
    lines = [
        f"GPU: {f.get('name')} ×{f.get('count')}, {gib(f.get('memory_bytes'))}, torch {f.get('torch')}, "
        f"CUDA {f.get('cuda')}, NCCL {f.get('nccl')}"
        + (f", transformers {f['transformers']}" if f.get("transformers") else ""),
        "",
        "| check | result |",
        "|---|---|",
    ]
    ref = result.get("refusal") or {}
    lines.append(f"| plan of 2 GPUs on a node showing 1 | rc {ref.get('rc')}: {ref.get('line')} |")
    pair = result.get("nccl_pair")
    if pair:
        lines.append(f"| two ranks over NCCL on this one GPU | rc {pair['rc']}: {' / '.join(pair['lines'])[:300]} |")
    if t:
        m, e = t.get("measured_s_per_iteration"), t.get("estimated_s_per_iteration")
        pm, pe = t.get("measured_peak_memory_bytes"), t.get("estimated_peak_memory_bytes")
        lines += [
            f"| {t['preset']}, G {t['global_batch']}, bf16-mixed, planned from the measured profile | rc {t['rc']}, "
            f"{t['layout']} {t['schedule']} {t['num_micro_batches']}×{t['micro_batch_size']}, {t['recompute_layers']} layers recomputed |",
            f"| iteration: measured / estimated | {m and f'{m:.3f}'} s / {e and f'{e:.3f}'} s"
            + (f" ({m / e - 1:+.1%})" if m and e else "")
            + " |",
            f"| whole training step (optimizer, hooks) | {t.get('measured_s_per_step') and round(t['measured_s_per_step'], 3)} s, "
            f"{t.get('samples_per_s') and round(t['samples_per_s'], 1)} samples/s |",
            f"| peak allocated / estimated | {gib(pm)} / {gib(pe)}"
            + (f" ({pm / pe - 1:+.1%})" if pm and pe else "")
            + " |",
            f"| training loss, first step → last ({t.get('lr_line') or 'trainer.lr as set'}) | "
            f"{t.get('first_train_loss')} → {t.get('train_loss')} |",
            f"| validation loss | {t.get('val_loss')} |",
        ]
    for p in result.get("profiles") or []:
        at = p["layers_s_at_samples"]
        lines.append(
            f"| profile timed at {p['batch'][0]} and {p['batch'][1]} samples: every layer's F + B at {p['samples']} | "
            f"{at and f'{at:.4f}'} s per micro-batch |"
        )
    if t.get("allocator_retries") is not None:
        lines.append(f"| allocator cache flushes (num_alloc_retries) | {t['allocator_retries']} |")
    r = result.get("resume")
    if r:
        lines.append(
            f"| resume gpt {r['preset']}: {r['steps'][1]} steps straight vs {r['steps'][0]} + resumed | rc {r['rc']}, "
            f"loss {r['straight_loss']} vs {r['resumed_loss']} (|Δ| {r['abs_difference']}) |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--preset", default="xl")
    ap.add_argument("--hf-config", help="a Hugging Face config.json's directory: train that model instead")
    ap.add_argument("--seq-len", type=int, default=1024, help="with --hf-config: tokens per sample")
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--resume-preset", default="medium")
    ap.add_argument("--resume-batch", type=int, default=16)
    ap.add_argument("--resume-steps", type=int, default=4)
    ap.add_argument("--skip-resume", action="store_true")
    ap.add_argument("--timeout-s", type=float, default=300, help="each launch's limit")
    ap.add_argument("--resume-timeout-s", type=float, default=120, help="each resume launch's limit")
    ap.add_argument("--budget-s", type=float, default=1e9, help="the training run ends by then")
    args = ap.parse_args()
    args.name = Path(args.hf_config).name if args.hf_config else f"gpt-{args.preset}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    f = facts()
    if not f.get("available"):
        print(f"no CUDA GPU here (torch {f.get('torch')}): this benchmark needs one; nothing measured")
        return 0
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "dapple-gpu-check"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = out / "gpu-log.txt"
    env = {**os.environ, "DAPPLE_CACHE": str(work / "cache"), "PYTHONUNBUFFERED": "1"}
    result: dict = {"facts": f}
    rc, text, _ = launch(
        [
            *cluster(f),
            "model=gpt",
            "cluster.devices_per_node=2",
            "strategy=fixed",
            "strategy.stages=2",
            f"hydra.run.dir={work}/x",
        ],
        log,
        120,
        env,
    )
    lines = [x for x in text.strip().splitlines() if x.strip()]
    result["refusal"] = {"rc": rc, "lines": len(lines), "line": lines[-1] if lines else ""}
    result["nccl_pair"] = nccl_pair(90)
    print(f"nccl pair: {result['nccl_pair']}", flush=True)
    # the short resume check first: a long training run that overruns its limit leaves it standing
    if not args.skip_resume:
        result["resume"] = resume_run(f, args, work, log, env)
        print(f"resume: {result['resume']}", flush=True)
    left = args.budget_s - (time.perf_counter() - t0)
    args.timeout_s = min(args.timeout_s, left)
    result["train"] = train_run(f, args, work, log, env)
    print(f"train run: rc {result['train']['rc']}, {result['train']['wall_s']} s", flush=True)
    result["profiles"] = profiles_at(work / "cache", (result["train"] or {}).get("device_samples"), out)
    (out / "gpu.json").write_text(json.dumps(result, indent=1))
    md = table(result)
    (out / "gpu.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
