"""Slurm launcher: one task per device of the nodes the plan uses, submitted with submitit.

The plan and resolved config are written into the run directory before submission, and every
task reads them: ranks never re-plan. Each task takes the rank the plan gives its device (or exits
if the plan leaves the device idle) and exports the torch.distributed environment; Lightning sees
the plan's placement (runtime/placement.py), which installs no signal handler. On the preemption
signal the ranks save together (runtime/signals.py) and task 0 hands over to submitit, which
calls `checkpoint()` and requeues: the job resumes the newest complete checkpoint, verified, with
the same plan and arguments (a damaged newest checkpoint fails the job with its name rather than
falling back silently).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ..log import get_logger
from ..plan_config import topology_from_config
from ..planner.plan import Plan
from ..runtime.placement import check_plan_runs_on, job_shape
from .sbatch import executor

JOB_ID_FILE = "slurm/job_id"


class TrainTask:
    """What submitit pickles and runs on every task of the job. `snapshot`: the directory holding
    the config and plan written at submission (the ranks read those, whatever happens later)."""

    def __init__(
        self, run_dir: str, snapshot: str, ckpt_path: str | None, in_allocation: bool = False, replan: bool = False
    ):
        self.run_dir, self.snapshot, self.ckpt_path = run_dir, snapshot, ckpt_path
        # a step of the user's own allocation (cluster=from_slurm): no submitit to requeue it
        self.in_allocation = in_allocation
        # the successor of a job that lost a node (launch/node_loss.py): plan for the nodes it is given
        self.replan = replan

    def __call__(self) -> str:
        import submitit

        from ..log import setup
        from ..runtime.checkpoint import newest_intact
        from ..runtime.signals import REQUEUE, SIGNAL

        setup()
        env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        job = submitit.JobEnvironment()
        if not self.replan and not self.in_allocation and self._sized_for_other_nodes(job):
            self.replan = True  # requeued onto fewer (or more) nodes than planned for, and free to re-plan
        if self.replan:
            from .node_loss import replanned_snapshot

            self.snapshot, self.replan = replanned_snapshot(self, job), False
        if not self._take_planned_rank(env, job):
            return "idle"
        # A requeued job (preempted, timed out, or `scontrol requeue`) runs this again: the run
        # directory was checked clean at submission, so any checkpoint in it is this job's own.
        found = newest_intact(Path(self.run_dir) / "checkpoints")
        os.environ["DAPPLE_CKPT"] = str(found) if found else (self.ckpt_path or "")
        if os.environ["DAPPLE_CKPT"]:
            get_logger().info(f"resuming from {os.environ['DAPPLE_CKPT']}")
        os.environ.setdefault("DAPPLE_THREADS", "1")
        from .worker import main

        code = main(self.run_dir, self.snapshot, requeue_signal=not self.in_allocation)
        if SIGNAL.agreed == REQUEUE:  # saved together on the signal: now submitit requeues (task 0) and exits
            SIGNAL.hand_over()
            return "preempted"
        if code not in (0, 3):
            if not self.in_allocation:
                from .node_loss import after_failure

                line = after_failure(self, job)
                if line is not None:
                    raise RuntimeError(line)
            self._fate(job, "failed", self._error_line())
            raise RuntimeError(f"rank {os.environ.get('RANK')} failed; see {self.run_dir}/logs")
        if os.environ.get("RANK") == "0":
            self._fate(job, "done" if code == 0 else "stopped", "finished" if code == 0 else "stopped on a signal")
        return self.run_dir

    def _error_line(self) -> str:
        rank = os.environ.get("RANK")
        try:
            first = (Path(self.run_dir) / "logs" / f"error-rank-{rank}.txt").read_text().splitlines()[0]
        except (OSError, IndexError):
            first = "see the logs"
        return f"rank {rank}: {first} ({self.run_dir}/logs)"

    def _fate(self, job, state: str, line: str) -> None:
        """What became of this job, for the launcher that follows it (not submitit's result files:
        a job Slurm requeued may still have a stale one)."""
        from .node_loss import fate_path, write_fate

        if state == "failed" and fate_path(self.run_dir, job.job_id).is_file():
            return  # the first failure's line stands
        try:
            write_fate(self.run_dir, str(job.job_id), state, line)
        except OSError:
            pass

    def _sized_for_other_nodes(self, job) -> bool:
        from omegaconf import OmegaConf

        snap = Path(self.snapshot)
        cfg = OmegaConf.load(snap / "config.yaml")
        if str(cfg.strategy.name) != "auto":
            return False
        nodes, _ = job_shape(Plan.load(snap / "plan.json"), int(cfg.cluster.devices_per_node))
        return nodes != job.num_nodes

    def _take_planned_rank(self, env, job) -> bool:
        """This task sits on device node × devices_per_node + local index; run the replica the plan
        placed there (ranks follow devices, runtime/grid.py), or stay idle if the plan leaves it free."""
        from omegaconf import OmegaConf

        from ..runtime.grid import ProcessGrid

        snap = Path(self.snapshot)
        plan = Plan.load(snap / "plan.json")
        k = int(OmegaConf.load(snap / "config.yaml").cluster.devices_per_node)
        grid = ProcessGrid.from_plan(plan)
        device = job.node * k + job.local_rank
        rank = grid.rank_of_device(device)
        if rank is None:
            get_logger().info(f"device {device} (node {job.node}, local {job.local_rank}) is idle in this plan")
            return False
        # rank 0 lives on the node of the plan's first device, which need not be the job's first node
        master = job.hostnames[grid.device_of(0) // k]
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(plan.world_size),
            LOCAL_RANK=str(job.local_rank),
            NODE_RANK=str(job.node),
            MASTER_ADDR=master,
            MASTER_PORT=str(env.master_port),
        )
        return True

    def successor(self) -> TrainTask:
        """The task of the job that replaces this one after a lost node (launch/node_loss.py)."""
        return TrainTask(self.run_dir, self.snapshot, self.ckpt_path, replan=True)

    def checkpoint(self, *args, **kwargs):
        """Preempted or timed out: come back on the newest complete checkpoint of this run."""
        import submitit

        return submitit.helpers.DelayedSubmission(TrainTask(self.run_dir, self.snapshot, self.ckpt_path))


def check_can_submit(cfg: DictConfig, plan: Plan, run_dir: Path) -> None:
    """Refuse before anything is submitted: no Slurm, a plan the cluster cannot hold, a live job."""
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
    if missing:
        raise ValueError(
            f"cluster={cfg.cluster.name} is reached through Slurm but there is no {' or '.join(missing)} "
            f"on PATH; run on "
            f"this machine with launcher=local (and a cluster that fits it, e.g. cluster=local), or "
            f"plan only with dry_run=true"
        )
    c = cfg.cluster
    if plan.world_size > c.nodes * c.devices_per_node:
        raise ValueError(
            f"the plan needs {plan.world_size} devices but cluster {c.name} offers {c.nodes} nodes × "
            f"{c.devices_per_node} = {c.nodes * c.devices_per_node}"
        )
    check_plan_runs_on(plan, topology_from_config(c))
    if 0 not in {d for st in plan.stages for d in st.devices}:
        raise ValueError(
            "the plan leaves device 0 idle, but under Slurm task 0 (device 0) is the one that requeues "
            "the job on preemption; renumber the plan's devices so that one stage uses device 0"
        )
    first_save_s = plan.estimate.iteration_s * cfg.trainer.checkpoint_every_n_steps
    if first_save_s > c.time_min * 60:
        get_logger().warning(
            f"the first checkpoint comes after about {first_save_s / 60:.0f} min (estimated "
            f"{plan.estimate.iteration_s:.3g} s per iteration × {cfg.trainer.checkpoint_every_n_steps} steps) but "
            f"the time limit is cluster.time_min={c.time_min}: a job that times out would start over each time; "
            f"lower trainer.checkpoint_every_n_steps or raise cluster.time_min"
        )
    previous = run_dir / JOB_ID_FILE
    if previous.is_file():
        job = previous.read_text().strip()
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
        if state:
            raise ValueError(
                f"run directory {run_dir} belongs to job {job}, which is still {state}; wait for it "
                f"(squeue -j {job}), cancel it (scancel {job}), or pick another hydra.run.dir"
            )


def submission_script(cfg: DictConfig, plan: Plan, run_dir: Path) -> str:
    """The sbatch script submitit submits for this config, rendered without submitting: the
    template for users who submit by hand, made by the same code so the two cannot drift."""
    inner: Any = executor(cfg, plan, run_dir)._executor  # (submitit's own renderer: not public API)
    return inner._make_submission_file_text(inner._submitit_command_str, "%j")


# Slurm's own words, and what usually causes them here
SLURM_HINTS = {
    "Invalid generic resource (gres) specification": "the partition has no GPUs of that kind (gres): for a CPU "
    "partition set cluster.device_kind=cpu, else check cluster.partition and cluster.devices_per_node",
    "Unable to contact slurm controller": "no Slurm controller answers: start the development one with "
    "`slurm/dev-cluster.sh start`, or check SLURM_CONF and that slurmctld runs",
    "invalid partition": "list the partitions with `sinfo -s` and set cluster.partition",
    "Invalid account": "set cluster.account to one of yours (`sacctmgr show assoc user=$USER`)",
    "Requested node configuration is not available": "no node has that many tasks or GPUs: lower "
    "cluster.devices_per_node or the plan's devices, or check `sinfo -N -l`",
}


def slurm_refusal(text: str) -> str:
    hint = next((h for k, h in SLURM_HINTS.items() if k.lower() in text.lower()), "")
    return f"Slurm refused the job: {text.strip()}" + (f" (likely: {hint})" if hint else "")


def launch_in_allocation(cfg: DictConfig, plan: Plan, run_dir: Path, snapshot: Path, ckpt_path: str | None) -> int:
    """cluster=from_slurm: the ranks start as one srun step of the allocation this command runs in."""
    import sys

    from ..allocation import allocation

    log = get_logger()
    a = allocation()
    nodes, tasks_per_node = job_shape(plan, cfg.cluster.devices_per_node)
    if nodes > a.nodes or tasks_per_node > a.devices_per_node:
        raise ValueError(
            f"the plan needs {nodes} node(s) × {tasks_per_node} tasks but job {a.job_id} holds {a.nodes} × "
            f"{a.devices_per_node}: plan for the allocation (cluster=from_slurm) or allocate more"
        )
    cmd = [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks-per-node={tasks_per_node}",
        f"--ntasks={nodes * tasks_per_node}",
        "--kill-on-bad-exit=1",
        "--cpu-bind=none",
        sys.executable,
        "-m",
        "dapple_launch.launch.slurm",
        str(run_dir),
        str(snapshot),
        ckpt_path or "",
    ]
    if str(cfg.cluster.device_kind) == "gpu":
        cmd.insert(4, f"--gpus-per-node={tasks_per_node}")
    log.info(f"step of job {a.job_id}: {' '.join(cmd[:5])} ... ({nodes} × {tasks_per_node} ranks)")
    code = subprocess.run(cmd).returncode
    if code:
        log.error(f"the step of job {a.job_id} failed (exit {code}); the ranks' lines are in {run_dir / 'logs'}")
        return 1
    return 0


def launch_slurm(cfg: DictConfig, plan: Plan, run_dir: Path, snapshot: Path, ckpt_path: str | None) -> int:
    log = get_logger()
    if cfg.launcher.script_only:
        text = submission_script(cfg, plan, run_dir)
        path = run_dir / "slurm" / "submit.sbatch"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        log.info(text)
        log.info(f"launcher.script_only=true: the script is in {path}; nothing was submitted")
        return 0
    ex = executor(cfg, plan, run_dir)
    try:
        job = ex.submit(TrainTask(str(run_dir), str(snapshot), ckpt_path))
    except Exception as exc:
        raise ValueError(slurm_refusal(" ".join(str(exc).split()))) from None
    (run_dir / JOB_ID_FILE).write_text(f"{job.job_id}\n")
    log.info(f"Submitted job {job.job_id}")
    log.info(f"  run directory: {run_dir} (plan.json, config.yaml, checkpoints/, logs/)")
    log.info(f"  Slurm logs:    {run_dir / 'slurm'}/{job.job_id}_0_log.out")
    log.info(f"  follow it:     squeue -j {job.job_id}; tail -f {run_dir / 'slurm'}/{job.job_id}_0_log.out")
    if cfg.launcher.wait:
        from .follow import follow

        return follow(run_dir, str(job.job_id))
    return 0


if __name__ == "__main__":  # one task of a step in the user's allocation (launch_in_allocation)
    import sys

    # the step's own nodes, in its order: the plan's node index counts within the step
    if os.environ.get("SLURM_STEP_NODELIST"):
        os.environ["SLURM_JOB_NODELIST"] = os.environ["SLURM_STEP_NODELIST"]
    os.environ["SUBMITIT_EXECUTOR"] = "slurm"  # submitit reads the task's place from Slurm's variables
    result = TrainTask(sys.argv[1], sys.argv[2], sys.argv[3] or None, in_allocation=True)()
    sys.exit(0 if result in ("idle", sys.argv[1]) else 1)
