"""Stopping together: a signal only raises a flag; the ranks act on it at a step boundary.

A signal lands in one rank's main thread at an arbitrary point (inside a collective, a transfer,
a save), while stopping cleanly is a collective decision of all ranks at one step. So a handler
only records which signal came; at the end of every training step the ranks all-reduce what they
received (one tiny collective), and if any rank got one, all save the step's checkpoint together
(sharded, atomic, layout-independent) and stop:

- SIGINT, SIGTERM, SIGHUP (the local launcher forwards a Ctrl-C or a `kill` as SIGTERM; a
  scheduler's stop): save and end; the launcher says where the checkpoint is and how to resume.
- Slurm's warning signal (USR2 through submitit, before a time limit or on preemption): save and
  end, then task 0 hands the signal to submitit's own handler, which requeues the job; the
  requeued job resumes that checkpoint.

Lightning's own SIGTERM handler runs a collective inside the handler and deadlocks a rank caught
in another collective: the trainer gets a signal connector that installs nothing (train.py).
"""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

STOP, REQUEUE = 1, 2  # what the ranks agree on: the largest any of them received


class StopSignal:
    """Which signal this process received (the handler sets it and does nothing else)."""

    def __init__(self):
        self.received = 0  # 0, STOP or REQUEUE
        self.signame = ""
        self.requeue_signum: int | None = None
        self.previous: dict[int, object] = {}
        self.agreed = 0  # what the ranks decided at a step boundary: 0, STOP or REQUEUE

    def install(self, stop=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP), requeue: bool = False) -> None:
        for s in stop:
            self.previous[s] = signal.getsignal(s)
            signal.signal(s, self._flag)
        if requeue:  # under Slurm: submitit's handler stays for the hand-over
            name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
            signum = getattr(signal, f"SIG{name}")
            self.requeue_signum = signum
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._flag)

    def _flag(self, signum, frame) -> None:
        code = REQUEUE if signum == self.requeue_signum else STOP
        if code > self.received:
            self.received, self.signame = code, signal.Signals(signum).name

    def hand_over(self) -> None:
        """Let submitit's handler checkpoint the submission and requeue the job (it exits)."""
        if self.requeue_signum is None:
            return
        handler = self.previous.get(self.requeue_signum)
        if callable(handler):
            handler(self.requeue_signum, None)


SIGNAL = StopSignal()


class StopOnSignal(Callback):
    """At every step's end: did any rank receive a stop signal? If so, all save and stop."""

    def __init__(self, save, flag: StopSignal = SIGNAL):
        self.save, self.flag = save, flag  # save(trainer) -> the checkpoint path (runtime/checkpointing.py)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        received = torch.tensor([float(self.flag.received)], device=trainer.strategy.root_device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(received, op=dist.ReduceOp.MAX)
        agreed = int(received.item())
        if agreed == 0:
            return
        path = self.save(trainer)
        from ..log import get_logger

        if trainer.is_global_zero:
            what = "the job requeues and resumes from it" if agreed == REQUEUE else "stopping"
            saved = f"saved step {trainer.global_step} in {path}" if path else "this step was not saved (non-finite)"
            get_logger().info(f"stop requested: {saved}; {what}")
        self.flag.agreed = agreed
        trainer.should_stop = True


def keep_lightning_off_signals(trainer) -> None:
    """Lightning's signal connector would install a SIGTERM handler that broadcasts inside the
    handler; this tool's handlers (StopSignal) only raise flags, so Lightning installs none."""
    from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

    class _NoHandlers(_SignalConnector):
        def register_signal_handlers(self) -> None:
            pass

        def teardown(self) -> None:
            pass

    trainer._signal_connector = _NoHandlers(trainer)
