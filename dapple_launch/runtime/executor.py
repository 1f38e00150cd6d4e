"""Interprets one stage's action list for one iteration. It decides nothing: the Schedule does.

A micro-batch's state on a stage: what arrived (the wire tensors, whose gradients go back), what
the stage's layers returned (cast for the wire), and the gradient that came back for it. Every
action reads and writes that state; see models/contract.py for what a carry is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.distributed as dist
from torch import nn

from ..data.rank_batch import INPUTS, TARGETS, RankBatch, WholeBatch, rows_of
from ..models.contract import as_tuple, carry_map, run_layers
from ..models.split_backward import backward_input, watch_accumulation
from ..models.token_slices import KVCache, TokenSlice, running
from ..planner.allreduce import BUCKET_BYTES, bucket_layers
from ..schedule import Kind, Schedule
from ..schedule.ranks import from_stages
from .clock import now
from .grid import split_bounds
from .heartbeat import BEAT
from .layouts import ensure_layouts, program
from .p2p import StageLinks
from .precision import MixedPrecision
from .rank_rows import replica_rows
from .recompute import with_recomputation


class _NoWeights:
    """W of a micro-batch whose outputs carried no gradient: nothing to compute."""

    def run(self) -> None:
        pass


_NO_WEIGHTS = _NoWeights()


@dataclass
class StepResult:
    loss_sum: torch.Tensor  # this rank's share of sum(per-sample loss) / global batch (0 off the last stage)
    num_samples: int


@dataclass
class _Iteration:
    """What one run() keeps per micro-batch while its actions execute."""

    batch: RankBatch | WholeBatch
    n_total: int
    micro: tuple  # (lo, hi) sample range of each micro-batch
    train: bool
    received: dict  # m -> wire tensors that arrived (gradients are taken against them)
    outputs: dict  # m -> the stage's output as it leaves (or, on the last stage, the loss to backpropagate)
    loss_sum: torch.Tensor
    weights: dict = field(default_factory=dict)  # m -> what its W needs (split backward: between I and W)
    # token slicing (schedule/terapipe.py): actions name units u = m·K + i; per sequence micro-batch,
    # the stage's cache of keys and values (models/token_slices.py)
    slices: int = 1
    tokens: tuple = ()  # (start, stop) of each slice
    caches: dict = field(default_factory=dict)

    def unit(self, u: int) -> tuple[int, int]:
        """(micro-batch, slice) of unit u."""
        return divmod(u, self.slices)

    def rows(self, u: int) -> int:
        lo, hi = self.micro[u // self.slices]
        return hi - lo

    def variant(self, u: int) -> int | None:
        """What besides rows fixes a transfer's shapes: the slice's length."""
        if self.slices == 1:
            return None
        a, b = self.tokens[u % self.slices]
        return b - a

    @property
    def saved(self) -> int:
        """Micro-batches whose activations are alive: forward run, last backward action not yet."""
        return len(self.outputs) + len(self.weights or ())


class StageExecutor:
    def __init__(
        self,
        layers: Iterable[nn.Module],
        loss_fn: Callable,
        p2p: StageLinks,
        num_stages: int,
        replica_group=None,
        on_last_backward: Callable[[], None] | None = None,
        before_last_backward: Callable[[], None] | None = None,
        precision: MixedPrecision | None = None,
        recompute: Iterable[int] = (),
        slice_loss_fn: Callable | None = None,
    ):
        """`recompute`: indices into `layers` whose activations the backward recomputes (the plan's
        recompute_layers, local): consecutive ones run as one segment (runtime/recompute.py)."""
        self.layers, self.loss_fn, self.p2p = list(layers), loss_fn, p2p
        self.params = [p for layer in self.layers for p in layer.parameters()]  # what a split backward's W computes
        self.recompute = tuple(sorted(set(recompute)))
        self.slice_loss_fn = slice_loss_fn  # the model's slice_loss, for token-sliced schedules
        self.blocks = with_recomputation(self.layers, self.recompute)  # what the forward runs
        self.stage, self.replica, self.num_stages = p2p.stage, p2p.replica, num_stages
        self.device = p2p.device
        self.is_first, self.is_last = self.stage == 0, self.stage == num_stages - 1
        self.replicas = p2p.replicas_of(self.stage)  # (Chimera: the replicas of this copy)
        self.on_last_backward = on_last_backward
        self.before_last_backward = before_last_backward  # (a bucketed all-reduce arms its hooks)
        self.precision = precision or MixedPrecision()
        self.saved_peak = 0  # most micro-batches whose activations were alive at once (memory check)
        self.timeline: list | None = None  # set to a list to record (action, start, end) wall times

    def _slice(self, batch: RankBatch | WholeBatch, part: int, micro: tuple[int, int]):
        """This replica's share of a micro-batch's inputs or targets (what runtime/rank_rows.py reads)."""
        return batch.take(part, *replica_rows(micro, self.replicas, self.replica))

    def run(self, schedule: Schedule, batch: tuple, loss_scale: float = 1.0) -> StepResult:
        """One iteration over the global batch. Backward populates .grad of this stage's parameters;
        the last stage backpropagates its loss times `loss_scale` (16-mixed)."""
        it = self.begin(batch, schedule.sequences, not schedule.forward_only, schedule.slice_lengths)
        actions = schedule.stage_actions[self.stage]
        comms = self.p2p.comms
        grid = self.p2p.grid
        rows = tuple(it.rows(u) for u in range(schedule.num_micro_batches))
        groups = tuple(tuple(grid.stage_ranks(s)) for s in range(grid.num_stages))
        try:
            ensure_layouts(comms, {self.stage: self}, batch, schedule.slice_lengths)
            comms.begin(program(comms, _as_ranks(schedule), groups, rows, source=schedule), it.variant)
        except RuntimeError as exc:
            raise stopped_at(self.stage, self.replica, PREPARING, exc) from exc
        # the stage's gradients are complete after its last B or W: the all-reduce may start
        last_backward = max((i for i, a in enumerate(actions) if a.kind.frees_activations), default=-1)
        timeline = self.timeline
        step = 0  # compute steps so far: the lowered program's slots count them
        for i, a in enumerate(actions):
            if not a.kind.is_compute:
                continue  # transfers are the lowered program's: issued in its slots, waited for by the compute
            try:
                comms.issue_through(step)
                start = now(self.device) if timeline is not None else 0.0
                BEAT.action(a)  # (made a string only when the heartbeat writes it: not on every action)
                if i == last_backward and self.before_last_backward is not None:
                    self.before_last_backward()
                self.act(a, it, loss_scale)
                if i == last_backward and self.on_last_backward is not None:
                    self.on_last_backward()
                if timeline is not None:
                    timeline.append((schedule.label(a), start, now(self.device)))
            except RuntimeError as exc:
                raise stopped(self.stage, self.replica, a, i, len(actions), schedule.name, exc) from exc
            step += 1
        try:
            comms.finish()
        except RuntimeError as exc:
            raise stopped_at(self.stage, self.replica, SENDS_DRAINING, exc) from exc
        return StepResult(it.loss_sum, it.n_total)

    def begin(self, whole, sequences: int, train: bool, slice_lengths: tuple[int, ...] = ()) -> _Iteration:
        """The state of one iteration over batch `whole` (or this rank's rows of it) cut into `sequences`
        micro-batches (each into token slices of `slice_lengths` when given)."""
        batch = rows_of(whole)
        n_total = batch.n_total
        K = max(1, len(slice_lengths))
        micro = split_bounds(n_total, sequences)
        tokens = ()
        if K > 1:
            from ..schedule.terapipe import bounds

            tokens = tuple(bounds(slice_lengths))
            width = as_tuple(batch.first_row())[0].shape[1] if self.is_first else tokens[-1][1]
            if width != tokens[-1][1]:
                raise ValueError(
                    f"token slices {list(slice_lengths)} cover {tokens[-1][1]} tokens but the "
                    f"batch's sequences have {width}: the slices must sum to the sequence length"
                )
            if self.is_last and self.slice_loss_fn is None:
                raise ValueError("token slicing needs the model's slice_loss (models/token_slices.py)")
        stages = range(len(self.p2p.grid.replicas))  # this stage and its neighbours split each micro-batch
        widest = max(self.p2p.replicas_of(s) for s in (self.stage - 1, self.stage, self.stage + 1) if s in stages)
        if min(hi - lo for lo, hi in micro) < widest:
            raise ValueError(
                f"a batch of {n_total} samples split into {sequences * K} micro-batches leaves fewer "
                f"samples per micro-batch than a stage has replicas ({widest})"
            )
        device = self.device
        return _Iteration(batch, n_total, micro, train, {}, {}, torch.zeros((), device=device), {}, K, tokens, {})

    def act(self, a, it: _Iteration, loss_scale: float) -> None:
        """Carry out one compute action on the iteration's state: its input taken from the
        transfers, what it makes handed to them (they move as the lowered program says)."""
        kind = a.kind
        if kind is Kind.FORWARD:
            self._forward(a.micro_batch, it, loss_scale)
        elif kind is Kind.BACKWARD:
            self._backward(a.micro_batch, it)
        elif kind is Kind.INPUT_GRAD:
            self._backward(a.micro_batch, it, split=True)
        elif kind is Kind.WEIGHT_GRAD:
            it.weights.pop(a.micro_batch).run()

    def _forward(self, m: int, it: _Iteration, loss_scale: float) -> None:
        seq, i = it.unit(m)
        piece = None
        if it.slices > 1:
            start, stop = it.tokens[i]
            piece = TokenSlice(i, start, stop, it.caches.setdefault(seq, KVCache()))
        if self.is_first:
            x = self._slice(it.batch, INPUTS, it.micro[seq])
            if piece is not None:
                x = carry_map(lambda t: t[:, piece.start : piece.stop], x)
        else:
            got = self.p2p.recv_activation(m)
            wire = tuple(t.requires_grad_(it.train and t.is_floating_point()) for t in got.wire)
            if it.train:
                it.received[m] = wire
            # back to the dtypes the previous stage computed in (the wire carried the compute dtype)
            x = tuple(w.to(dt) if w.dtype != dt else w for w, dt in zip(wire, got.logical))
        with torch.set_grad_enabled(it.train), self.precision.autocast():
            if piece is None:  # (no token slice to publish: spare the context manager on every forward)
                y = run_layers(self.blocks, x)
            else:
                with running(piece):
                    y = run_layers(self.blocks, x)
            if self.is_last:
                target = self._slice(it.batch, TARGETS, it.micro[seq])
                if piece is None:
                    loss = self.loss_fn(y, target).sum() / it.n_total
                else:
                    assert self.slice_loss_fn is not None  # (begin() refuses slices without it)
                    loss = self.slice_loss_fn(y, target, piece.start, piece.stop).sum() / it.n_total
                it.loss_sum = it.loss_sum + loss.detach().float()
                if it.train:
                    it.outputs[m] = loss * loss_scale if loss_scale != 1.0 else loss
                    self.saved_peak = max(self.saved_peak, it.saved)
                return
            members = as_tuple(y)
            wire = tuple(self.precision.to_wire(t) for t in members)
            if it.train:
                it.outputs[m] = wire
        self.p2p.send_activation(tuple(t.detach() for t in wire), tuple(t.dtype for t in members), m)
        self.saved_peak = max(self.saved_peak, it.saved)

    def _backward(self, m: int, it: _Iteration, split: bool = False) -> None:
        """B, or with `split` I: the input gradients now, the weights' at this micro-batch's W."""
        y = it.outputs.pop(m)
        if self.is_last:
            outputs, grads = [y], None
        else:
            got = self.p2p.recv_gradient(m)
            floating = [t for t in y if t.is_floating_point()]
            pairs = [(t, g) for t, g in zip(floating, got) if t.requires_grad]
            outputs, grads = [t for t, _ in pairs], [g for _, g in pairs]
        wire = () if self.is_first else tuple(w for w in it.received.pop(m) if w.is_floating_point())
        if it.slices > 1:  # what later slices sent into this slice's cached keys and values
            seq, i = it.unit(m)
            roots, cached = it.caches[seq].cache_gradients(i)
            if outputs and grads is None:
                grads = [None] * len(outputs)
            outputs, grads = outputs + roots, (grads or []) + cached
            if i == 0:
                del it.caches[seq]  # the sequence's first slice: its cache is done with
        if split:
            if self.recompute:
                raise RuntimeError(
                    "a split backward (I/W) cannot run recomputed layers: plan with schedule 1f1b or gpipe"
                )
            if outputs:
                back, it.weights[m] = backward_input(outputs, grads, wire, self.params)
            else:
                back, it.weights[m] = [None] * len(wire), _NO_WEIGHTS
        else:
            if outputs:
                torch.autograd.backward(outputs, grads)
            back = [w.grad for w in wire]
        if not self.is_first:
            self.p2p.send_gradient(tuple(g if g is not None else torch.zeros_like(w) for w, g in zip(wire, back)), m)


@lru_cache(maxsize=64)
def _as_ranks(schedule: Schedule):
    """A stage-per-rank schedule as rank orders (what the lowering reads), once per schedule."""
    return from_stages(schedule)


def stopped(stage: int, replica: int, action, step: int, steps: int, schedule: str, exc: Exception) -> RuntimeError:
    """What a rank says when an action fails (a peer's death surfaces as a failed send or receive)."""
    return stopped_at(stage, replica, f"at action {action} (step {step + 1} of {steps} in schedule {schedule})", exc)


PREPARING = (
    "before its first action, preparing its transfers (what crosses stages and the pair groups: every rank takes part)"
)
SENDS_DRAINING = "after its last action, waiting for its sends to be received"


def stopped_at(stage: int, replica: int, where: str, exc: Exception) -> RuntimeError:
    rank = dist.get_rank() if dist.is_initialized() else 0
    return RuntimeError(
        f"stage {stage} replica {replica} (rank {rank}) stopped {where}: {str(exc).splitlines()[0]}. A peer stage "
        f"may have died or stalled; see its log (logs/rank-N.log)"
    )


class GradientSync:
    """All-reduce (sum) of a stage's gradients inside its replica group, in buckets that overlap the
    stage's last backward (planner/allreduce.py costs it the same way).

    `layers`: the stage's parameters per layer, first to last. Buckets take whole layers from the
    last, each closed once it holds BUCKET_BYTES of gradients. `arm()` before the stage's last
    gradient action (B, or W under a split backward) watches each parameter's accumulation; a bucket
    whose gradients are all in is all-reduced asynchronously at once, while the action still runs
    the layers below it. `start()` after the action sends what never reported (a parameter this
    iteration gave no gradient), `finish()` waits and writes the sums back."""

    def __init__(
        self,
        params: list[nn.Parameter],
        group,
        replicas: int,
        layers: list[list[nn.Parameter]] | None = None,
        bucket_bytes: int | None = None,
    ):
        self.params, self.group, self.replicas = params, group, replicas
        self.device = params[0].device if params else None  # (its span read after the device's work)
        mine = {id(p) for p in params}
        per_layer = [[p for p in layer if id(p) in mine] for layer in (layers if layers is not None else [params])]
        listed = {id(p) for layer in per_layer for p in layer}
        per_layer[-1] += [p for p in params if id(p) not in listed]  # (defensive: every parameter in a bucket)
        self.buckets = gradient_buckets(per_layer, bucket_bytes)
        self.bucket_of = {id(p): k for k, bucket in enumerate(self.buckets) for p in bucket}
        self.pending: list[int] = []  # per bucket, gradients still to come while armed (-1: sent)
        self.sent = 0  # buckets sent so far (always the first ones)
        self.works: list = []  # (bucket, flat buffer, async work) in launch order
        self.handles: list = []
        self.span: tuple[float, float] | None = None  # (first started, waited for) wall times of the last one

    def arm(self) -> None:
        """Before the stage's last gradient action: launch each bucket as soon as its gradients are in."""
        self.span, self.works = None, []
        if self.replicas == 1 or not self.params:
            return
        self.pending, self.sent = [len(b) for b in self.buckets], 0
        for p in self.params:
            self.handles.append(p.register_post_accumulate_grad_hook(self._ready))  # autograd's B
        self.handles.append(watch_accumulation(self.params, self._ready))  # a split backward's W

    def _ready(self, p) -> None:
        k = self.bucket_of.get(id(p))
        if k is None or self.pending[k] <= 0:
            return
        self.pending[k] -= 1
        # in bucket order, as every replica issues its collectives: which gradients a backward
        # reports first may differ between replicas (a layer unused on one replica's data)
        while self.sent < len(self.buckets) and self.pending[self.sent] == 0:
            self._launch(self.sent)

    def _launch(self, k: int) -> None:
        if self.span is None:
            self.span = (now(self.device), 0.0)
        self.pending[k], self.sent = -1, k + 1
        bucket = self.buckets[k]
        grads = []
        for p in bucket:
            if p.grad is None:  # (no gradient this iteration: its replicas' still sum with zeros)
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if len(grads) == 1 and grads[0].is_contiguous():
            # a bucket of one parameter (a large layer's weight) reduces its gradient in place: a copy
            # into a flat buffer and back would cost two passes over it, as much as gloo's own reduction
            flat = grads[0].view(-1)
        else:
            flat = torch.cat([g.reshape(-1) for g in grads])
        self.works.append((k, flat, dist.all_reduce(flat, group=self.group, async_op=True)))

    def start(self) -> None:
        """After the stage's last gradient action: stop watching, send the buckets not yet sent."""
        for h in self.handles:
            h.remove()
        self.handles = []
        if self.replicas == 1 or not self.params:
            return
        if not self.pending:  # never armed (a caller without the hook before its last action)
            self.span, self.works, self.pending, self.sent = None, [], [len(b) for b in self.buckets], 0
        for k in range(self.sent, len(self.buckets)):
            self._launch(k)
        self.pending = []

    def finish(self) -> None:
        if not self.works:
            return
        BEAT.action("AR (gradient all-reduce)")
        for k, flat, work in self.works:
            work.wait()
            bucket = self.buckets[k]
            grad = bucket[0].grad
            if len(bucket) == 1 and grad is not None and flat.data_ptr() == grad.data_ptr():
                continue  # reduced in place
            offset = 0
            for p in bucket:  # the sums as views of the reduced buffer: no second copy
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p)
                offset += n
        start = self.span[0] if self.span is not None else now(self.device)
        self.span = (start, now(self.device))
        self.works = []


def gradient_buckets(layers: list[list[nn.Parameter]], bucket_bytes: int | None = None) -> list[list[nn.Parameter]]:
    """The parameters of each bucket: the layers planner/allreduce.bucket_layers groups (whole layers
    from the last, closed at `bucket_bytes`, default BUCKET_BYTES), so the runtime sends the buckets
    the planner costs."""
    nbytes = [sum(p.numel() * p.element_size() for p in layer) for layer in layers]
    cap = BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    return [[p for i in bucket for p in layers[i]] for bucket in bucket_layers(nbytes, cap)]
