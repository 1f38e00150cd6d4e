"""Helpers for the multi-process tier: N gloo processes on this machine, one thread each.

The ranks are forked from a fork server (multiprocessing's `forkserver`) that imported torch, the
runtime and transformers once per test process: a spawned rank spent about 3 s importing torch
before it ran anything, so 4 ranks on 2 cores took 7 s to start where forking them takes 0.2 s. The
server is a fresh interpreter that has run nothing but imports (no process group, no thread pool),
as the launcher's zygote is. A forked rank inherits the server's environment and working directory,
not the test's, so each rank is handed the test's (a test may set either: monkeypatch.setenv).
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dapple_launch.host import host_rendezvous

PRELOAD = ["torch", "torch.distributed", "tests.rank_preload"]


def _entry(rank, world, rendezvous, out_dir, fn, args, env, cwd):
    torch.set_num_threads(1)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env, **rendezvous)
    try:
        timeout = datetime.timedelta(seconds=float(os.environ.get("DAPPLE_TEST_PG_TIMEOUT", "300")))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
        result = fn(rank, world, *args)
        Path(out_dir, f"{rank}.json").write_text(json.dumps({"ok": True, "result": result}))
    except BaseException:
        Path(out_dir, f"{rank}.json").write_text(json.dumps({"ok": False, "error": traceback.format_exc()}))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world: int, fn, args: tuple, tmp_path) -> list:
    """Run fn(rank, world, *args) on `world` gloo processes; return each rank's JSON result."""
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="ranks-", dir=tmp_path))  # (unique: run_ranks may run twice in one test)
    store, rendezvous = host_rendezvous()  # (held here while the ranks run)
    try:
        mp.set_forkserver_preload(PRELOAD)  # (read when the server starts: the first call of a test process)
        mp.start_processes(
            _entry,
            args=(world, rendezvous, str(out), fn, args, dict(os.environ), os.getcwd()),
            nprocs=world,
            start_method="forkserver",
        )
    except Exception as exc:
        errors = [json.loads(p.read_text()).get("error") for p in sorted(out.glob("*.json"))]
        raise AssertionError("\n".join(e for e in errors if e) or str(exc)) from exc
    results = [json.loads((out / f"{r}.json").read_text()) for r in range(world)]
    for r in results:
        assert r["ok"], r.get("error")
    return [r["result"] for r in results]
