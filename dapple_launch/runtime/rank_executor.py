"""Interprets one rank's order of a schedule whose ranks hold several stages (interleaved, ZB-V).

Each stage the rank holds has its own StageExecutor (its layers, its micro-batch state); a step
(kind, stage, micro-batch) is carried out by that stage's executor with the transfers the step
implies: a forward receives the previous stage's activation and sends its own on, a backward (B or
I) receives the next stage's gradient and sends its own back. Between two stages of the same rank
the hand-off is local — the tensors themselves, no copy, no process group — and the receiving
stage takes gradients against them exactly as against a received activation, so the numerics are
those of a transfer. Transfers to and from other ranks follow the rank's lowered program
(schedule/transfers.py), one for all the stages it holds, as StageExecutor's do.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch

from ..schedule import Action
from ..schedule.ranks import RankSchedule
from .clock import now
from .executor import PREPARING, SENDS_DRAINING, StageExecutor, StepResult, stopped, stopped_at
from .grid import group_ranks
from .heartbeat import BEAT
from .layouts import ensure_layouts, program
from .p2p import PointToPoint, RankComms, Received


class Mailbox:
    """What one stage hands another stage of the same rank, taken once."""

    def __init__(self):
        self.box: dict = {}

    def put(self, key: tuple, value) -> None:
        self.box[key] = value

    def take(self, key: tuple):
        return self.box.pop(key)


class ChunkLinks:
    """The transfer interface a stage's executor calls (PointToPoint's), each direction either the
    rank's comms or a local hand-off to the neighbouring stage on this rank."""

    def __init__(self, remote: PointToPoint, mailbox: Mailbox, local_prev: bool, local_next: bool):
        self.remote, self.mailbox = remote, mailbox
        self.local_prev, self.local_next = local_prev, local_next
        self.grid, self.stage, self.replica, self.device = remote.grid, remote.stage, remote.replica, remote.device
        self.comms = remote.comms

    @property
    def sent_layouts(self) -> dict:
        return self.remote.sent_layouts

    def replicas_of(self, stage: int) -> int:
        return self.remote.replicas_of(stage)

    def recv_activation(self, micro_batch: int) -> Received:
        if self.local_prev:
            return self.mailbox.take(("activation", self.stage, micro_batch))
        return self.remote.recv_activation(micro_batch)

    def send_activation(self, carry: tuple, logical: tuple, micro_batch: int) -> None:
        if self.local_next:
            self.mailbox.put(("activation", self.stage + 1, micro_batch), Received(carry, logical))
        else:
            self.remote.send_activation(carry, logical, micro_batch)

    def recv_gradient(self, micro_batch: int) -> tuple:
        if self.local_next:
            return self.mailbox.take(("gradient", self.stage, micro_batch))
        return self.remote.recv_gradient(micro_batch)

    def send_gradient(self, grads: tuple, micro_batch: int) -> None:
        if self.local_prev:
            self.mailbox.put(("gradient", self.stage - 1, micro_batch), grads)
        else:
            self.remote.send_gradient(grads, micro_batch)


@lru_cache(maxsize=64)
def _walk(order: tuple, several: bool) -> tuple:
    """What run() follows, derived from an order once rather than on every iteration: step index ->
    the stage whose gradients it completes (its last B or W), and each step's label (with its stage
    where the rank holds several)."""
    last = {}
    for i, a in enumerate(order):
        if a.kind.frees_activations:
            last[a.stage] = i
    finishing = {i: s for s, i in last.items()}
    labels = [
        f"{Action(a.kind, a.micro_batch)}·s{a.stage}" if several else str(Action(a.kind, a.micro_batch)) for a in order
    ]
    return finishing, labels


class RankExecutor:
    def __init__(
        self,
        chunks: dict[int, StageExecutor],
        group: int,
        on_last_backward: dict[int, Callable[[], None]] | None = None,
        before_last_backward: dict[int, Callable[[], None]] | None = None,
        routes: dict | None = None,
    ):
        """`chunks`: stage -> its executor (built on ChunkLinks); `group`: the device group (rank of the
        schedule's orders) this process belongs to; `on_last_backward`: stage -> what to start once
        that stage's gradients are complete (its all-reduce)."""
        self.chunks, self.group = chunks, group
        self.on_last_backward = on_last_backward or {}
        self.before_last_backward = before_last_backward or {}  # stage -> what to arm before it (its buckets)
        self.timeline: list | None = None  # set to a list to record (step, start, end) wall times
        self.saved_peak = 0  # most (stage, micro-batch) activations alive at once on this rank
        self.routes = routes  # where stages sit on several groups: the route table the transfers follow

    def run(self, schedule: RankSchedule, batch: tuple, loss_scale: float = 1.0) -> StepResult:
        """One iteration: this device group's order of `schedule`."""
        train = not schedule.forward_only
        if self.routes is not None:
            self.routes["table"] = schedule.route_table
        its = {s: ex.begin(batch, schedule.num_micro_batches, train) for s, ex in self.chunks.items()}
        order = schedule.orders[self.group]
        finishing, labels = _walk(order, len(self.chunks) > 1)
        comms = next(iter(self.chunks.values())).p2p.comms
        first_stage = next(iter(self.chunks))
        replica = self.chunks[first_stage].replica
        first = its[next(iter(its))]
        rows = tuple(first.rows(u) for u in range(schedule.num_micro_batches))
        groups = tuple(tuple(group_ranks(comms.grid, schedule, g)) for g in range(schedule.num_ranks))
        try:
            ensure_layouts(comms, self.chunks, batch, ())
            comms.begin(program(comms, schedule, groups, rows), first.variant)
        except RuntimeError as exc:
            raise stopped_at(first_stage, replica, PREPARING, exc) from exc
        timeline = self.timeline
        for i, step in enumerate(order):
            s = step.stage
            ex, it = self.chunks[s], its[s]
            a = Action(step.kind, step.micro_batch)
            try:
                comms.issue_through(i)
                start = now(ex.device) if timeline is not None else 0.0
                BEAT.action(labels[i])
                if i in finishing and finishing[i] in self.before_last_backward:
                    self.before_last_backward[finishing[i]]()
                ex.act(a, it, loss_scale)
                if i in finishing and finishing[i] in self.on_last_backward:
                    self.on_last_backward[finishing[i]]()
                if timeline is not None:
                    timeline.append((labels[i], start, now(ex.device)))
                self.saved_peak = max(self.saved_peak, sum(x.saved for x in its.values()))
            except RuntimeError as exc:
                raise stopped(s, ex.replica, a, i, len(order), schedule.name, exc) from exc
        try:
            comms.finish()
        except RuntimeError as exc:
            raise stopped_at(first_stage, replica, SENDS_DRAINING, exc) from exc
        losses = [it.loss_sum for it in its.values()]  # zero but on the stage holding the loss
        return StepResult(torch.stack(losses).sum(), first.n_total)


def build_rank_executor(
    plan,
    grid,
    rank: int,
    layers: dict[int, torch.nn.Module],
    loss_fn: Callable,
    stage_groups: dict[int, object],
    precision=None,
    device=None,
    bucket_bytes: int | None = None,
) -> tuple[RankExecutor, list]:
    """This rank's executor for a plan whose device groups hold several stages, and the gradient
    syncs to finish after each iteration (one per local stage, in the order they start).

    Each stage's all-reduce starts after its last backward on this rank. A parameter two local stages
    share (a tied weight on both ends of a V) is reduced once, by the stage whose backwards end last,
    when both stages' contributions are in. `bucket_bytes`: the all-reduce's bucket size (default
    planner/allreduce.BUCKET_BYTES, what the planner costs)."""
    from .executor import GradientSync

    schedule = plan.build_schedule()
    groups = [group_ranks(grid, schedule, g) for g in range(schedule.num_ranks)]
    group = next(g for g, ranks in enumerate(groups) if rank in ranks)  # the device group whose order it runs
    mailbox = Mailbox()
    comms = RankComms(grid, rank, device or torch.device("cpu"))  # one per rank: its stages' transfers in one order
    local = schedule.stages_of(group)
    chunks = {}
    replica = groups[group].index(rank)
    route: Callable[[int, int], tuple[int, ...]] | None = None
    routes: dict | None = None
    if any(len(p) > 1 for p in schedule.placement):  # (Chimera, copies): a micro-batch's copy of each stage
        table = {"table": schedule.route_table}  # the running schedule's (evaluation routes its own way)
        routes = table

        def by_table(stage: int, micro_batch: int) -> tuple[int, ...]:
            return tuple(groups[table["table"][stage][micro_batch]])

        route = by_table

    for s in local:
        a, b = plan.stages[s].layers
        remote = PointToPoint(grid, s, replica, device or torch.device("cpu"), route=route, comms=comms)
        links = ChunkLinks(
            remote, mailbox, local_prev=s - 1 in local and route is None, local_next=s + 1 in local and route is None
        )
        chunks[s] = StageExecutor(
            [layers[i] for i in range(a, b)],
            loss_fn,
            links,
            grid.num_stages,
            precision=precision,
            recompute=[i - a for i in plan.stages[s].recompute_layers],
        )
    order = schedule.orders[group]
    last = {s: max(i for i, x in enumerate(order) if x.stage == s and x.kind.frees_activations) for s in local}
    syncs, on_last, arm, seen = {}, {}, {}, set()
    for s in sorted(local, key=lambda s: -last[s]):  # latest-finishing first: it takes the shared parameters
        per_layer = [
            [p for p in layers[i].parameters() if p.requires_grad and id(p) not in seen]
            for i in range(*plan.stages[s].layers)
        ]
        params = [p for layer in per_layer for p in layer]
        seen |= {id(p) for p in params}
        syncs[s] = GradientSync(params, stage_groups[s], grid.replicas[s], per_layer, bucket_bytes)
        on_last[s], arm[s] = syncs[s].start, syncs[s].arm
    return RankExecutor(chunks, group, on_last, arm, routes), [syncs[s] for s in sorted(local, key=lambda s: last[s])]
