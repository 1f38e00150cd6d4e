"""Slurm launcher: one task per device of the nodes the plan uses, submitted with submitit.

The plan and resolved config are written into the run directory before submission, and every
task reads them: ranks never re-plan. Each task takes the rank the plan gives its device (or exits
if the plan leaves the device idle) and exports the torch.distributed environment; Lightning sees
the plan's placement (runtime/placement.py), which installs no signal handler. On the preemption
signal the ranks save together (runtime/preemption.py) and task 0 hands over to submitit, which
calls `checkpoint()` and requeues: the job resumes the newest complete checkpoint with the same
plan and arguments.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from omegaconf import DictConfig

from ..plan_config import topology_from_config
from ..planner.plan import Plan
from ..runtime.placement import check_plan_runs_on, job_shape

JOB_ID_FILE = "slurm/job_id"


class TrainTask:
    """What submitit pickles and runs on every task of the job."""

    def __init__(self, run_dir: str, ckpt_path: str | None):
        self.run_dir, self.ckpt_path = run_dir, ckpt_path

    def __call__(self) -> str:
        import submitit
        from ..runtime.checkpoint import find_checkpoints
        from ..runtime.preemption import SIGNAL
        env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        if not self._take_planned_rank(env):
            return "idle"
        SIGNAL.install()  # after submitit's own handler, which it keeps for the hand-over
        # A requeued job (preempted, timed out, or `scontrol requeue`) runs this again: the run
        # directory was checked clean at submission, so any checkpoint in it is this job's own.
        found = find_checkpoints(Path(self.run_dir) / "checkpoints")
        os.environ["DAPPLE_CKPT"] = str(found[-1]) if found else (self.ckpt_path or "")
        if os.environ["DAPPLE_CKPT"]:
            print(f"resuming from {os.environ['DAPPLE_CKPT']}", flush=True)
        os.environ.setdefault("DAPPLE_THREADS", "1")
        from .worker import main
        main(self.run_dir)
        if SIGNAL.stopped:  # saved together on the signal: now submitit requeues (task 0) and exits
            SIGNAL.hand_over()
            return "preempted"
        return self.run_dir

    def _take_planned_rank(self, env) -> bool:
        """This task sits on device node × devices_per_node + local index; run the replica the plan
        placed there (ranks follow devices, runtime/grid.py), or stay idle if the plan leaves it free."""
        import submitit
        from omegaconf import OmegaConf
        from ..runtime.grid import ProcessGrid
        run = Path(self.run_dir)
        plan = Plan.load(run / "plan.json")
        k = int(OmegaConf.load(run / "config.yaml").cluster.devices_per_node)
        grid = ProcessGrid.from_plan(plan)
        job = submitit.JobEnvironment()
        device = job.node * k + job.local_rank
        rank = grid.rank_of_device(device)
        if rank is None:
            print(f"device {device} (node {job.node}, local {job.local_rank}) is idle in this plan")
            return False
        # rank 0 lives on the node of the plan's first device, which need not be the job's first node
        master = job.hostnames[grid.device_of(0) // k]
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(plan.world_size), LOCAL_RANK=str(job.local_rank),
                          NODE_RANK=str(job.node), MASTER_ADDR=master, MASTER_PORT=str(env.master_port))
        return True

    def checkpoint(self, *args, **kwargs):
        """Preempted or timed out: come back on the newest complete checkpoint of this run."""
        import submitit
        from ..runtime.checkpoint import find_checkpoints
        found = find_checkpoints(Path(self.run_dir) / "checkpoints")
        return submitit.helpers.DelayedSubmission(TrainTask(self.run_dir, str(found[-1]) if found else None))


def check_can_submit(cfg: DictConfig, plan: Plan, run_dir: Path) -> None:
    """Refuse before anything is submitted: no Slurm, a plan the cluster cannot hold, a live job."""
    if shutil.which("sbatch") is None:
        raise ValueError(f"cluster={cfg.cluster.name} is reached through Slurm but there is no sbatch on PATH; run on "
                         f"this machine with launcher=local (and a cluster that fits it, e.g. cluster=local), or "
                         f"plan only with dry_run=true")
    c = cfg.cluster
    if plan.world_size > c.nodes * c.devices_per_node:
        raise ValueError(f"the plan needs {plan.world_size} devices but cluster {c.name} offers {c.nodes} nodes × "
                         f"{c.devices_per_node} = {c.nodes * c.devices_per_node}")
    check_plan_runs_on(plan, topology_from_config(c))
    if 0 not in {d for st in plan.stages for d in st.devices}:
        raise ValueError("the plan leaves device 0 idle, but under Slurm task 0 (device 0) is the one that requeues "
                         "the job on preemption; renumber the plan's devices so that one stage uses device 0")
    first_save_s = plan.estimate.iteration_s * cfg.trainer.checkpoint_every_n_steps
    if first_save_s > c.time_min * 60:
        print(f"warning: the first checkpoint comes after about {first_save_s / 60:.0f} min (estimated "
              f"{plan.estimate.iteration_s:.3g} s per iteration × {cfg.trainer.checkpoint_every_n_steps} steps) but "
              f"the time limit is cluster.time_min={c.time_min}: a job that times out would start over each time; "
              f"lower trainer.checkpoint_every_n_steps or raise cluster.time_min")
    previous = run_dir / JOB_ID_FILE
    if previous.is_file():
        job = previous.read_text().strip()
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
        if state:
            raise ValueError(f"run directory {run_dir} belongs to job {job}, which is still {state}; wait for it "
                             f"(squeue -j {job}), cancel it (scancel {job}), or pick another hydra.run.dir")


def executor(cfg: DictConfig, plan: Plan, run_dir: Path):
    import submitit
    c = cfg.cluster
    # one task per device of the nodes the plan touches; tasks on devices it leaves idle exit at once
    nodes, tasks_per_node = job_shape(plan, c.devices_per_node)
    ex = submitit.AutoExecutor(folder=str(run_dir / "slurm"), cluster="slurm", slurm_max_num_timeout=c.max_num_timeout)
    params = dict(nodes=nodes, tasks_per_node=tasks_per_node, cpus_per_task=c.cpus_per_task,
                  timeout_min=c.time_min, name=f"dapple-{plan.model}", slurm_setup=list(c.setup))
    if c.device_kind == "gpu":
        params["gpus_per_node"] = c.devices_per_node
    for key, value in (("slurm_partition", c.partition), ("slurm_account", c.account), ("slurm_qos", c.qos),
                       ("slurm_constraint", c.constraint), ("mem_gb", c.mem_gb)):
        if value:
            params[key] = value
    ex.update_parameters(**params)
    return ex


def submission_script(cfg: DictConfig, plan: Plan, run_dir: Path) -> str:
    """The sbatch script submitit submits for this config, rendered without submitting: the
    template for users who submit by hand, made by the same code so the two cannot drift."""
    inner = executor(cfg, plan, run_dir)._executor
    return inner._make_submission_file_text(inner._submitit_command_str, "%j")


def launch_slurm(cfg: DictConfig, plan: Plan, run_dir: Path, ckpt_path: str | None) -> int:
    if cfg.launcher.script_only:
        text = submission_script(cfg, plan, run_dir)
        path = run_dir / "slurm" / "submit.sbatch"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(text)
        print(f"launcher.script_only=true: the script is in {path}; nothing was submitted")
        return 0
    ex = executor(cfg, plan, run_dir)
    try:
        job = ex.submit(TrainTask(str(run_dir), ckpt_path))
    except Exception as exc:  # noqa: BLE001 - sbatch's own words are the useful part
        raise ValueError(f"Slurm refused the job: {str(exc).strip()}") from None
    (run_dir / JOB_ID_FILE).write_text(f"{job.job_id}\n")
    print(f"Submitted job {job.job_id}")
    print(f"  run directory: {run_dir} (plan.json, config.yaml, checkpoints/, logs/)")
    print(f"  Slurm logs:    {run_dir / 'slurm'}/{job.job_id}_0_log.out")
    print(f"  follow it:     squeue -j {job.job_id}; tail -f {run_dir / 'slurm'}/{job.job_id}_0_log.out")
    if cfg.launcher.wait:
        try:
            job.results()
        except Exception as exc:  # noqa: BLE001 - report the job's own failure
            print(f"job {job.job_id} failed: {str(exc).strip().splitlines()[-1]}")
            return 1
        print(f"job {job.job_id} finished: outputs are in {run_dir}")
    return 0
