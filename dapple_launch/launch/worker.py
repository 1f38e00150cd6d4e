"""One rank: `python -m dapple_launch.launch.worker RUN_DIR SNAPSHOT_DIR` (RANK, WORLD_SIZE, ... in
the environment).

It reads the plan and resolved config the launching command wrote into SNAPSHOT_DIR for this
launch, so every rank runs the plan that was made once, at launch time (never re-planned, never
a file a later launch could replace). It installs the stop signals (a handler only raises a
flag), starts its heartbeat, trains, and on a failure writes one line saying why into
logs/error-rank-N.txt (the traceback goes to its log) for the launcher to show.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

EXIT_STOPPED = 3  # stopped early on a signal, after the ranks saved together


def main(run_dir: str, snapshot: str | None = None, requeue_signal: bool = False) -> int:
    run = Path(run_dir)
    rank = int(os.environ.get("RANK", "0"))
    from ..log import quiet_third_party, setup
    from ..runtime.signals import SIGNAL, STOP

    SIGNAL.install(requeue=requeue_signal)
    log = setup()
    quiet_third_party()
    try:
        import torch
        from omegaconf import OmegaConf

        from ..config.choices import mapping
        from ..planner.plan import Plan
        from ..runtime.grid import ProcessGrid
        from ..runtime.heartbeat import BEAT

        torch.set_num_threads(int(os.environ.get("DAPPLE_THREADS", "1")))
        source = Path(snapshot) if snapshot else run
        cfg = mapping(OmegaConf.load(source / "config.yaml"), str(source / "config.yaml"))
        from ..host import rendezvous_interfaces

        # the interface peers on other nodes reach this rank through, never loopback (before any group)
        os.environ.update(
            rendezvous_interfaces(os.environ.get("MASTER_ADDR"), cfg.cluster.get("network_interface") or None)
        )
        if str(cfg.cluster.device_kind) == "gpu":  # before the first NCCL communicator exists
            from .devices import nccl_env

            os.environ.update(nccl_env(run))
        plan = Plan.load(source / "plan.json")
        stage, replica = ProcessGrid.from_plan(plan).position(rank)
        import socket

        node = socket.gethostname()
        log = setup(f"[rank {rank} · stage {stage} · replica {replica} · {node}] " if rank else "")
        log.info(
            f"rank {rank} (stage {stage}, replica {replica}) on node {node}"
            + (f", interface {os.environ['GLOO_SOCKET_IFNAME']}" if os.environ.get("GLOO_SOCKET_IFNAME") else "")
        )
        BEAT.start(
            run,
            rank,
            stage=stage,
            replica=replica,
            device=ProcessGrid.from_plan(plan).device_of(rank),
            node=node,
            job=os.environ.get("SLURM_JOB_ID"),
        )
        from ..train import fit

        agreed = fit(cfg, plan, run, os.environ.get("DAPPLE_CKPT") or None)
        _leave_together()
    except BaseException as exc:
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        line = " ".join(str(exc).split()) or type(exc).__name__
        trace = traceback.format_exc()
        try:  # the line for the launcher's message, the traceback below it for whoever digs
            errors = run / "logs"
            errors.mkdir(parents=True, exist_ok=True)
            (errors / f"error-rank-{rank}.txt").write_text(f"{type(exc).__name__}: {line}\n\n{trace}")
        except OSError:
            pass
        report(rank, f"{type(exc).__name__}: {line}")
        from ..runtime.heartbeat import BEAT

        BEAT.end("failed")
        if rank:  # rank 0 shares the user's terminal: the launcher reports for it
            print(trace, file=sys.stderr)
            log.error(line)
        return 1
    return EXIT_STOPPED if agreed == STOP else 0


def report(rank: int, line: str) -> None:
    """The one line the launcher shows, on the pipe it reads (launch/zygote.py), not on a disk that
    may be full: one write under the pipe's atomic size, so lines of ranks never interleave."""
    fd = os.environ.get("DAPPLE_REPORT_FD")
    if fd:
        try:
            os.write(int(fd), f"error {rank} {line[:3500]}\n".encode(errors="replace"))
        except OSError:
            pass


def _leave_together() -> None:
    """Tear the process group down on purpose once every rank is done. Left to interpreter exit,
    gloo's threads are destroyed in whatever order the runtime picks, and now and then a rank
    aborts ("terminate called without an active exception", exit -6) after a run that succeeded."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
