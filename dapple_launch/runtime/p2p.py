"""Moving activations and their gradients between ranks, as schedule/transfers.py lowered them.

What crosses a stage boundary is a carry: a tuple of tensors (models/contract.py), each with the
micro-batch's samples as its first dimension, re-split where the two stages have different
replica counts. One `RankComms` per rank carries out its lowered program (`RankProgram`), the
order the NCCL model (schedule/nccl.py) proved:

- before each compute step c it issues slot c: per peer, every transfer of the slot with that
  peer (sends and receives, in the pair's common order) as one `batch_isend_irecv` of their
  carries' members, on the communicator of that rank pair alone (never the one the gradient
  all-reduces use), with no tag: the pair's common order is what matches them. One group per
  peer and step, as torch.distributed.pipelining issues a step's operations: one launch and one
  completion to track where a transfer at a time paid for each (NCCL runs a group as one kernel);
- a compute step's inputs are waited for just before it runs; sends are waited for at the end of
  the iteration and dropped as soon as they complete (`reap`);
- the members' shapes and dtypes (the layouts) are known before the first step
  (runtime/layouts.py), so receive buffers are allocated without reading anything on the host.

`PointToPoint` is one stage's view of its rank's comms: the executor hands it what a compute made
and asks it for what a compute needs, by stage and micro-batch; the program decides when.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from ..schedule.transfers import RankProgram, Transfer, peer_groups
from .grid import ProcessGrid
from .groups import communicators
from .heartbeat import BEAT

# a layout: per member, (trailing shape, dtype on the wire, dtype the receiver restores)
Layout = tuple[tuple[tuple[int, ...], torch.dtype, torch.dtype], ...]


@dataclass
class Received:
    """A received carry: the wire tensors (what gradients are taken against) and the dtypes the
    sender's tensors had before they were cast for the wire."""

    wire: tuple
    logical: tuple


def gradient_layout(activation: Layout) -> Layout:
    """What goes back across a boundary: a gradient for each floating member, in its wire dtype."""
    return tuple((tail, wire, wire) for tail, wire, _ in activation if wire.is_floating_point)


@dataclass
class _Iteration:
    program: RankProgram
    variant: Callable[[int], int | None]
    incoming: dict  # (space, receiving stage, unit) -> its transfers, in sample order
    outgoing: dict  # (space, sending stage, unit) -> pieces still to send
    buffers: dict = field(default_factory=dict)  # transfer -> (receive buffers, works)
    issued: int = 0  # slots issued so far


class RankComms:
    """One rank's point-to-point traffic for one iteration at a time (see the module's docstring)."""

    def __init__(self, grid: ProcessGrid, rank: int | None = None, device: torch.device = torch.device("cpu")):
        self.grid, self.device = grid, device
        self.rank = dist.get_rank() if rank is None else rank
        self.layouts: dict[tuple[int, int | None], Layout] = {}  # (boundary, variant) -> activation layout
        self.outbox: dict = {}  # (space, sending stage, unit) -> (carry, logical)
        self.pending: list = []  # (works, tensors) of sends in flight
        self.bytes_sent = 0  # payload bytes this rank has sent (activations and gradients)
        self.programs: dict = {}  # lowered programs by (schedule, device groups, rows): runtime/layouts.program
        self._it: _Iteration | None = None

    def begin(self, program: RankProgram, variant: Callable[[int], int | None]) -> None:
        incoming, outgoing = {}, {}
        for slot in program.slots:
            for t, is_send in slot:
                if is_send:
                    key = (t.space, t.src_stage, t.unit)
                    outgoing[key] = outgoing.get(key, 0) + 1
                else:
                    incoming.setdefault((t.space, t.dst_stage, t.unit), []).append(t)
        for ts in incoming.values():
            ts.sort(key=lambda t: t.lo)
        self._it = _Iteration(program, variant, incoming, outgoing)

    @property
    def _now(self) -> _Iteration:
        """The iteration begun and not yet finished."""
        assert self._it is not None, "RankComms.begin() comes before the iteration's transfers"
        return self._it

    def layout(self, t: Transfer) -> Layout:
        act = self.layouts[(t.boundary, self._now.variant(t.unit))]
        return act if t.space == "A" else gradient_layout(act)

    def issue_through(self, step: int) -> None:
        """Issue every slot up to and including `step` (the one before compute step `step`)."""
        it = self._now
        slots = it.program.slots
        while it.issued <= step and it.issued < len(slots):
            self._issue(slots[it.issued])
            it.issued += 1

    def _group(self, peer: int) -> dist.ProcessGroup:
        return communicators().get((self.rank, peer), "p2p")

    def _issue(self, slot: tuple) -> None:
        """One slot: per peer, its transfers as one group (schedule/nccl.py's `lowered_programs`
        models exactly this)."""
        for peer, items in peer_groups(slot).items():
            group = self._group(peer)
            ops, owner, made = [], [], []
            for t, is_send in items:
                tensors = self._send_pieces(t) if is_send else self._recv_buffers(t)
                made.append(tensors)
                kind = dist.isend if is_send else dist.irecv
                ops += [dist.P2POp(kind, x, peer, group) for x in tensors]
                owner += [t] * len(tensors)
            works = dist.batch_isend_irecv(ops) if ops else []
            # gloo answers one work per operation, NCCL one for the whole group: a transfer waits for
            # its own where it can, else for the group (which the NCCL model assumes in any case)
            per_op = len(works) == len(ops)
            for (t, is_send), tensors in zip(items, made):
                mine = [w for w, o in zip(works, owner) if o is t] if per_op else list(works)
                if is_send:
                    self.pending.append((mine, tensors))
                else:
                    self._now.buffers[t] = (tensors, mine)

    def _send_pieces(self, t: Transfer) -> tuple:
        """The tensors of transfer `t` this rank sends: its samples of each member of the carry."""
        key = (t.space, t.src_stage, t.unit)
        carry, _ = self.outbox[key]
        n = t.hi - t.lo
        pieces = tuple((m if t.at == 0 and n == m.shape[0] else m[t.at : t.at + n]).contiguous() for m in carry)
        self.bytes_sent += sum(p.numel() * p.element_size() for p in pieces)
        left = self._now.outgoing[key] - 1
        self._now.outgoing[key] = left
        if left == 0:
            del self.outbox[key]  # every piece is on its way: the carry is kept by the sends alone
        return pieces

    def _recv_buffers(self, t: Transfer) -> list:
        """Fresh buffers for what transfer `t` brings: its samples of each member, in the wire dtype."""
        n = t.hi - t.lo
        return [torch.empty((n, *tail), dtype=wire, device=self.device) for tail, wire, _ in self.layout(t)]

    def put(self, space: str, stage: int, unit: int, carry: tuple, logical: tuple) -> None:
        """What stage `stage` made for unit `unit` and sends on (activation "A") or back (gradient "G")."""
        key = (space, stage, unit)
        if key not in self._now.outgoing:
            return  # nothing of it leaves this rank (a local hand-off took it)
        boundary = stage if space == "A" else stage - 1
        layout = self.layouts[(boundary, self._now.variant(unit))]
        if space == "G":
            layout = gradient_layout(layout)
        got = tuple((tuple(t.shape[1:]), t.dtype) for t in carry)
        if got != tuple((tail, wire) for tail, wire, _ in layout):
            what = "activation" if space == "A" else "gradient"
            raise RuntimeError(
                f"{what} of micro-batch {unit} from stage {stage} is {[(str(d), ['n', *s]) for s, d in got]} but the "
                f"layout learned before the first step is {[(str(w), ['n', *s]) for s, w, _ in layout]}: what a stage "
                f"passes on must keep its tensors, dtypes and shapes from batch to batch"
            )
        self.outbox[key] = (carry, logical)

    def take(self, space: str, stage: int, unit: int) -> Received:
        """The carry stage `stage` needs for unit `unit`, waited for (its receives were issued earlier)."""
        pieces, layout = [], ()
        incoming = self._now.incoming[(space, stage, unit)]
        doing = BEAT.state.get("action")
        BEAT.action(f"R{space}{unit}")  # only waiting on a peer (the launcher names the peer, not this rank)
        for t in incoming:
            bufs, works = self._now.buffers.pop(t)
            for w in works:
                w.wait()
            pieces.append(bufs)
            layout = self.layout(t)
        BEAT.action(doing)
        members = tuple(ps[0] if len(pieces) == 1 else torch.cat(ps) for ps in zip(*pieces)) if pieces else ()
        return Received(members, tuple(logical for _, _, logical in layout))

    def reap(self) -> None:
        """Drop the sends that completed: a sent activation is not kept longer than its transfer."""
        self.pending = [(ws, ts) for ws, ts in self.pending if not all(w.is_completed() for w in ws)]

    def finish(self) -> None:
        """Issue what is left (the slot after the last compute) and wait for every send."""
        if self._it is None:
            return
        self.issue_through(len(self._now.program.slots))
        BEAT.action("waiting for its sends to be received")
        for works, _ in self.pending:
            for w in works:
                w.wait()
        self.pending.clear()
        self.outbox.clear()
        self._it = None


class StageLinks(Protocol):
    """What a stage's executor moves its carries through: PointToPoint (to other ranks), or
    rank_executor.ChunkLinks (to a neighbouring stage on the same rank, or else the rank's comms)."""

    grid: ProcessGrid
    stage: int
    replica: int
    device: torch.device
    comms: RankComms

    def replicas_of(self, stage: int) -> int: ...
    def send_activation(self, carry: tuple, logical: tuple, micro_batch: int) -> None: ...
    def recv_activation(self, micro_batch: int) -> Received: ...
    def send_gradient(self, grads: tuple, micro_batch: int) -> None: ...
    def recv_gradient(self, micro_batch: int) -> tuple: ...
    @property
    def sent_layouts(self) -> dict: ...


@dataclass
class PointToPoint:
    """One stage's transfers on its rank's comms: activations down to the next stage, gradients back."""

    grid: ProcessGrid
    stage: int
    replica: int
    device: torch.device = torch.device("cpu")
    # stages on several device groups (Chimera's two pipelines, round-robin copies): (stage,
    # micro-batch) -> the ranks of the copy that runs it (the schedule's route); None: every rank
    # holding the stage (one copy per stage)
    route: Callable[[int, int], tuple[int, ...]] | None = None
    comms: RankComms = None  # type: ignore[assignment]  # (the rank's own, made below when not given)

    def __post_init__(self):
        if self.comms is None:
            self.comms = RankComms(self.grid, None, self.device)

    def replicas_of(self, stage: int) -> int:
        """The replicas of one copy of `stage` (its copies are alike)."""
        return len(self.route(stage, 0)) if self.route else self.grid.replicas[stage]

    @property
    def sent_layouts(self) -> dict:
        """The layouts of what this stage sends: its activations and the gradients it sends back."""
        out = {}
        for (b, v), layout in self.comms.layouts.items():
            if b == self.stage:
                out[("A", b, v)] = layout
            if b == self.stage - 1:
                out[("G", b, v)] = gradient_layout(layout)
        return out

    def send_activation(self, carry: tuple, logical: tuple, micro_batch: int) -> None:
        self.comms.put("A", self.stage, micro_batch, carry, logical)

    def recv_activation(self, micro_batch: int) -> Received:
        return self.comms.take("A", self.stage, micro_batch)

    def send_gradient(self, grads: tuple, micro_batch: int) -> None:
        self.comms.put("G", self.stage, micro_batch, grads, tuple(g.dtype for g in grads))

    def recv_gradient(self, micro_batch: int) -> tuple:
        return self.comms.take("G", self.stage, micro_batch).wire
