"""Interprets one stage's action list for one iteration. It decides nothing: the Schedule does."""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ..schedule import Kind, Schedule
from .grid import split_bounds
from .p2p import PointToPoint


@dataclass
class StepResult:
    loss_sum: torch.Tensor  # this rank's share of sum(per-sample loss) / global batch (0 off the last stage)
    num_samples: int


class StageExecutor:
    def __init__(self, layers: nn.Module, loss_fn: Callable, p2p: PointToPoint, num_stages: int,
                 replica_group=None, on_last_backward: Callable[[], None] | None = None):
        self.layers, self.loss_fn, self.p2p = layers, loss_fn, p2p
        self.stage, self.replica, self.num_stages = p2p.stage, p2p.replica, num_stages
        self.is_first, self.is_last = self.stage == 0, self.stage == num_stages - 1
        self.replicas = p2p.grid.replicas[self.stage]
        self.on_last_backward = on_last_backward
        self.saved_peak = 0  # most micro-batches whose activations were alive at once (memory check)
        self.timeline: list | None = None  # set to a list to record (action, start, end) wall times

    def _slice(self, t: torch.Tensor, micro: tuple[int, int]) -> torch.Tensor:
        lo, hi = split_bounds(micro[1] - micro[0], self.replicas)[self.replica]
        return t[micro[0] + lo: micro[0] + hi]

    def run(self, schedule: Schedule, batch: tuple[torch.Tensor, torch.Tensor]) -> StepResult:
        """One iteration over the global batch. Backward populates .grad of this stage's parameters."""
        inputs_all, targets_all = batch
        n_total = inputs_all.shape[0]
        micro = split_bounds(n_total, schedule.num_micro_batches)
        if min(hi - lo for lo, hi in micro) < max(self.p2p.grid.replicas):
            raise ValueError(
                f"a batch of {n_total} samples split into {schedule.num_micro_batches} micro-batches leaves fewer "
                f"samples per micro-batch than a stage has replicas ({max(self.p2p.grid.replicas)})")
        train = not schedule.forward_only
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        grads: dict[int, torch.Tensor] = {}
        loss_sum = torch.zeros((), device=inputs_all.device)
        last_backward = max((i for i, a in enumerate(schedule.stage_actions[self.stage]) if a.kind is Kind.BACKWARD),
                            default=-1)
        actions = schedule.stage_actions[self.stage]
        ahead = _receives_ahead(actions)
        for i, a in enumerate(actions):
            try:
                for r in ahead.get(i, ()):  # the next compute's inputs arrive while this one runs
                    n_r = micro[r.micro_batch][1] - micro[r.micro_batch][0]
                    if r.kind is Kind.RECV_ACTIVATION:
                        self.p2p.post_activation(n_r, r.micro_batch, eval_=not train)
                    else:
                        self.p2p.post_gradient(n_r, r.micro_batch)
                start = time.time()
                loss_sum = self._act(i, a, micro, inputs_all, targets_all, n_total, train, inputs, outputs, grads,
                                     loss_sum, last_backward)
                if self.timeline is not None:
                    self.timeline.append((str(a), start, time.time()))
            except RuntimeError as exc:
                rank = dist.get_rank() if dist.is_initialized() else 0
                raise RuntimeError(
                    f"stage {self.stage} replica {self.replica} (rank {rank}) stopped at action {a} (step {i + 1} of "
                    f"{len(actions)} in schedule {schedule.name}): {str(exc).splitlines()[0]}. A peer stage may have "
                    f"died or stalled; see its log (logs/rank-N.log)") from exc
        if not train and self.is_last:
            outputs.clear()
        self.p2p.wait_sends()
        return StepResult(loss_sum, n_total)

    def _act(self, i, a, micro, inputs_all, targets_all, n_total, train, inputs, outputs, grads, loss_sum,
             last_backward):
        """Carry out one action; returns the running loss sum."""
        m = a.micro_batch
        n = micro[m][1] - micro[m][0]
        if a.kind is Kind.RECV_ACTIVATION:
            x = self.p2p.recv_activation(n, m, eval_=not train)
            inputs[m] = x.requires_grad_(train and x.is_floating_point())
        elif a.kind is Kind.FORWARD:
            x = inputs[m] if m in inputs else self._slice(inputs_all, micro[m])
            inputs[m] = x
            with torch.set_grad_enabled(train):
                y = self.layers(x)
                if self.is_last:
                    y = self.loss_fn(y, self._slice(targets_all, micro[m])).sum() / n_total
                    loss_sum = loss_sum + y.detach()
            outputs[m] = y
            if not train and not self.is_first:
                del inputs[m]
            self.saved_peak = max(self.saved_peak, len(outputs))
        elif a.kind is Kind.SEND_ACTIVATION:
            self.p2p.reap()
            self.p2p.send_activation(outputs[m].detach(), n, m, eval_=not train)
            if not train:
                del outputs[m]
        elif a.kind is Kind.RECV_GRADIENT:
            grads[m] = self.p2p.recv_gradient(n, m)
        elif a.kind is Kind.BACKWARD:
            y = outputs.pop(m)
            if self.is_last:
                y.backward()
            else:
                y.backward(grads.pop(m))
            x = inputs.pop(m)
            if not self.is_first:
                grads[m] = x.grad
            if i == last_backward and self.on_last_backward is not None:
                self.on_last_backward()
        elif a.kind is Kind.SEND_GRADIENT:
            self.p2p.reap()
            self.p2p.send_gradient(grads.pop(m), n, m)
        return loss_sum


@lru_cache(maxsize=64)
def _receives_ahead(actions: tuple) -> dict[int, list]:
    """For each compute action's index, the receives the *next* compute action will need: posted
    before this compute runs, so they overlap it (one micro-batch of look-ahead keeps memory bounded)."""
    compute = [i for i, a in enumerate(actions) if a.kind.is_compute]
    out = {}
    for here, nxt in zip(compute, compute[1:]):
        recvs = [a for a in actions[here + 1:nxt] if a.kind in (Kind.RECV_ACTIVATION, Kind.RECV_GRADIENT)]
        if recvs:
            out[here] = recvs
    return out


class GradientSync:
    """All-reduce (sum) of a stage's gradients inside its replica group, started asynchronously
    right after the stage's last backward so it overlaps the other stages' remaining work."""

    def __init__(self, params: list[nn.Parameter], group, replicas: int):
        self.params, self.group, self.replicas = params, group, replicas
        self.work = None
        self.flat = None
        self.span: tuple[float, float] | None = None  # (started, waited for) wall times of the last one

    def start(self) -> None:
        self.span = None
        if self.replicas == 1 or not self.params:
            return
        self.span = (time.time(), 0.0)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self.flat = torch.cat([g.reshape(-1) for g in grads])
        self.work = dist.all_reduce(self.flat, group=self.group, async_op=True)

    def finish(self) -> None:
        if self.work is None:
            return
        self.work.wait()
        self.span = (self.span[0], time.time())
        offset = 0
        for p in self.params:
            k = p.numel()
            p.grad = self.flat[offset:offset + k].view_as(p).clone()
            offset += k
        self.work, self.flat = None, None
