"""Preemption: on Slurm's warning signal, every rank saves one checkpoint together, then the job requeues.

Slurm signals the tasks (submitit asks for USR2 shortly before the time limit; `scancel
--signal=USR2` or a preempting job does the same). A signal lands in one rank's main thread at
an arbitrary point, while a checkpoint is a collective of all ranks at one step. So the signal
only raises a flag; at the next step boundary the ranks all-reduce the flag (one tiny collective
per step, only under Slurm), all save the step's checkpoint (sharded, atomic, layout-independent),
and stop. Then the task that submitit makes responsible (rank 0) hands the signal to submitit's own
handler, which calls TrainTask.checkpoint and requeues: the requeued job resumes that checkpoint.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback


class PreemptionSignal:
    """Holds the flag the handler raises and the handler it displaced (submitit's)."""

    def __init__(self):
        self.signum: int | None = None
        self.previous = None
        self.received = False  # this process got the signal
        self.stopped = False  # the ranks saved a checkpoint together and stopped because of it

    def install(self) -> None:
        name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
        self.signum = getattr(signal, f"SIG{name}")
        self.previous = signal.getsignal(self.signum)
        signal.signal(self.signum, self._raise_flag)

    def _raise_flag(self, signum, frame) -> None:
        self.received = True
        print(f"received {signal.Signals(signum).name}: checkpointing at the end of this step", flush=True)

    @property
    def installed(self) -> bool:
        return self.signum is not None

    def hand_over(self) -> None:
        """Let submitit's handler checkpoint the submission and requeue the job (it exits)."""
        if callable(self.previous):
            self.previous(self.signum, None)


SIGNAL = PreemptionSignal()


class SaveOnPreemption(Callback):
    def __init__(self, dirpath: str | Path, flag: PreemptionSignal = SIGNAL):
        self.dirpath, self.flag = Path(dirpath), flag

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        raised = torch.tensor([1.0 if self.flag.received else 0.0], device=trainer.strategy.root_device)
        dist.all_reduce(raised, op=dist.ReduceOp.MAX)
        if raised.item() == 0:
            return
        path = self.dirpath / f"step{trainer.global_step:06d}.ckpt"
        if not path.exists():  # the periodic checkpoint of this very step may already be there
            trainer.save_checkpoint(str(path))
        if trainer.is_global_zero:
            print(f"preempted: saved {path}; the job requeues and resumes from it", flush=True)
        self.flag.stopped = True
        trainer.should_stop = True
