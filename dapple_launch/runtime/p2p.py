"""Moving activations and their gradients between stages, re-split across replica counts.

What crosses a stage boundary is a carry: a tuple of tensors (models/contract.py), each with the
micro-batch's samples as its first dimension. Micro-batch m holds n samples; replica j of a stage
with r replicas owns the j-th contiguous slice of them. Between stages with different replica
counts, each sender sends every receiver the overlap of their slices (many-to-many); the receiver
concatenates the pieces of each member in order.

Sends are non-blocking (gloo/NCCL isend), so a stage never blocks on its neighbour's progress; a
sent tensor is dropped as soon as its send completes (`reap`). Receives are posted ahead of use
(`post_*`): the executor posts the receives of the next compute action while the current one runs.
Transfers between two ranks are matched in order (NCCL ignores tags; the validator makes every
schedule send and receive in the same order, schedule/validate.py). The first transfer of each
(direction, peer, rows) carries a header (per member: the dtype on the wire, the dtype the receiver
restores, the shape); later ones are the payloads alone, received into buffers of the learned
shapes, so a transfer costs one message per member.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import torch
import torch.distributed as dist

from .grid import ProcessGrid, split_bounds

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool,
           torch.int16, torch.uint8, torch.int8]
MAX_MEMBERS = 16
_DIMS = 6
_PER_MEMBER = 3 + _DIMS  # wire dtype, logical dtype, ndim, dims
_HEADER = 1 + MAX_MEMBERS * _PER_MEMBER
TAG_SPACE = {"activation": 0, "gradient": 1, "eval": 2}


@lru_cache(maxsize=4096)
def overlaps(n: int, src_replicas: int, dst_replicas: int, src: int | None = None, dst: int | None = None):
    """(src replica, dst replica, lo, hi) for each overlapping piece of an n-sample micro-batch.
    Cached: every transfer of every iteration asks the same few questions."""
    out = []
    for j, (a0, a1) in enumerate(split_bounds(n, src_replicas)):
        if src is not None and j != src:
            continue
        for k, (b0, b1) in enumerate(split_bounds(n, dst_replicas)):
            if dst is not None and k != dst:
                continue
            lo, hi = max(a0, b0), min(a1, b1)
            if lo < hi:
                out.append((j, k, lo, hi))
    return tuple(out)


MAX_CHUNKS = 8  # stages one device group may hold (interleaved 1F1B's v)


def _tag(space: str, micro_batch: int, part: int, chunk: int = 0) -> int:
    """part 0: the header; 1 + i: member i's payload. `chunk`: which of the sending rank's stages
    sent it, so two ranks that exchange for several stage pairs (interleaved, ZB-V) keep them apart."""
    return ((micro_batch * 3 + TAG_SPACE[space]) * MAX_CHUNKS + chunk) * (1 + MAX_MEMBERS) + part


def _header(pieces: tuple[torch.Tensor, ...], logical: tuple[torch.dtype, ...]) -> torch.Tensor:
    if len(pieces) > MAX_MEMBERS:
        raise RuntimeError(f"a layer passes {len(pieces)} tensors to the next stage; at most {MAX_MEMBERS} can cross")
    h = torch.zeros(_HEADER, dtype=torch.int64)
    h[0] = len(pieces)
    for i, (t, dt) in enumerate(zip(pieces, logical)):
        if t.dim() > _DIMS:
            raise RuntimeError(f"a tensor crossing stages has {t.dim()} dimensions; at most {_DIMS} can cross")
        o = 1 + i * _PER_MEMBER
        h[o], h[o + 1], h[o + 2] = _DTYPES.index(t.dtype), _DTYPES.index(dt), t.dim()
        h[o + 3:o + 3 + t.dim()] = torch.tensor(t.shape)
    return h


def _read_header(h: torch.Tensor) -> tuple:
    """((trailing shape, wire dtype, logical dtype) per member)."""
    h = h.cpu().tolist()
    out = []
    for i in range(h[0]):
        o = 1 + i * _PER_MEMBER
        out.append((tuple(h[o + 4:o + 3 + h[o + 2]]), _DTYPES[h[o]], _DTYPES[h[o + 1]]))
    return tuple(out)


@dataclass
class _PostedPiece:
    header: torch.Tensor | None  # only the first transfer of a (space, peer, rows) key carries a header
    header_work: object
    payloads: list | None  # None until the members are known: posted after the header arrives
    works: list
    peer: int
    tag: int
    key: tuple


@dataclass
class Received:
    """A received carry: the wire tensors (what gradients are taken against) and the dtypes the
    sender's tensors had before they were cast for the wire."""
    wire: tuple
    logical: tuple


@dataclass
class PointToPoint:
    grid: ProcessGrid
    stage: int
    replica: int
    device: torch.device = torch.device("cpu")
    pending: list = field(default_factory=list)  # (work, tensor) kept alive until the send completes
    posted: dict = field(default_factory=dict)  # (space, micro-batch) -> [_PostedPiece] of receives in flight
    # (space, peer rank, rows) -> member layout. A key's first transfer sends a header too; both
    # sides move a key's pieces in the same order (schedule/validate.py), so both know which.
    sent_layouts: dict = field(default_factory=dict)
    layouts: dict = field(default_factory=dict)
    header_expected: set = field(default_factory=set)
    bytes_sent: int = 0  # payload bytes this rank has sent (activations and gradients), headers aside
    # stages on several device groups (Chimera's two pipelines, round-robin copies): (stage,
    # micro-batch) -> the ranks of the copy that runs it (the schedule's route); None: every rank
    # holding the stage (one copy per stage)
    route: Callable[[int, int], tuple[int, ...]] | None = None

    def ranks_of(self, stage: int, micro_batch: int = 0) -> list[int]:
        return list(self.route(stage, micro_batch)) if self.route else self.grid.stage_ranks(stage)

    def replicas_of(self, stage: int) -> int:
        """The replicas of one copy of `stage` (its copies are alike)."""
        return len(self.route(stage, 0)) if self.route else self.grid.replicas[stage]

    def _send_pieces(self, carry: tuple, logical: tuple, n: int, peer_stage: int, space: str,
                     micro_batch: int, variant: int | None = None) -> None:
        my_lo = split_bounds(n, self.replicas_of(self.stage))[self.replica][0]
        peer_ranks = self.ranks_of(peer_stage, micro_batch)
        for _, k, lo, hi in overlaps(n, self.replicas_of(self.stage), self.replicas_of(peer_stage), src=self.replica):
            a, b = lo - my_lo, hi - my_lo
            # (a whole carry goes as it is: no view made per member and transfer)
            pieces = tuple((t if a == 0 and b == t.shape[0] else t[a:b]).contiguous() for t in carry)
            key = (space, peer_ranks[k], hi - lo, variant, self.stage)
            layout = tuple((tuple(p.shape[1:]), p.dtype, dt) for p, dt in zip(pieces, logical))
            tag = _tag(space, micro_batch, 0, self.grid.chunk_of(self.stage))
            known = self.sent_layouts.get(key)
            if known is None:
                self.sent_layouts[key] = layout
                header = _header(pieces, logical).to(self.device)
                self.pending.append((dist.isend(header, peer_ranks[k], tag=tag), header))
            elif known != layout:
                raise RuntimeError(
                    f"{space} of micro-batch {micro_batch} to rank {peer_ranks[k]} is "
                    f"{[(str(d), [hi - lo, *s]) for s, d, _ in layout]} but earlier ones of {hi - lo} rows were "
                    f"{[(str(d), [hi - lo, *s]) for s, d, _ in known]}: what a stage passes on must keep its tensors, "
                    f"dtypes and shapes from batch to batch")
            for i, piece in enumerate(pieces):
                self.pending.append((dist.isend(piece, peer_ranks[k], tag=tag + 1 + i), piece))
                self.bytes_sent += piece.numel() * piece.element_size()

    def _post(self, n: int, peer_stage: int, space: str, micro_batch: int, variant: int | None = None) -> None:
        if (space, micro_batch) in self.posted:
            return
        peer_ranks = self.ranks_of(peer_stage, micro_batch)
        posted = []
        for j, _, lo, hi in overlaps(n, self.replicas_of(peer_stage), self.replicas_of(self.stage), dst=self.replica):
            key = (space, peer_ranks[j], hi - lo, variant, peer_stage)
            tag = _tag(space, micro_batch, 0, self.grid.chunk_of(peer_stage))
            piece = _PostedPiece(None, None, None, [], peer_ranks[j], tag, key)
            if key not in self.header_expected:  # this key's first transfer: its header comes too
                self.header_expected.add(key)
                piece.header = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
                piece.header_work = dist.irecv(piece.header, piece.peer, tag=tag)
            elif key in self.layouts:
                self._post_payloads(piece)
            posted.append(piece)
        self.posted[(space, micro_batch)] = posted

    def _post_payloads(self, p: _PostedPiece) -> None:
        p.payloads = []
        for i, (tail, wire, _) in enumerate(self.layouts[p.key]):
            buf = torch.empty((p.key[2], *tail), dtype=wire, device=self.device)
            p.payloads.append(buf)
            p.works.append(dist.irecv(buf, p.peer, tag=p.tag + 1 + i))

    def _recv_pieces(self, n: int, peer_stage: int, space: str, micro_batch: int,
                     variant: int | None = None) -> Received:
        self._post(n, peer_stage, space, micro_batch, variant)
        pieces, layout = [], ()
        for p in self.posted.pop((space, micro_batch)):
            if p.header is not None:
                p.header_work.wait()
                self.layouts[p.key] = _read_header(p.header)
            if p.payloads is None:  # the key's layout became known after this receive was posted
                self._post_payloads(p)
            for w in p.works:
                w.wait()
            pieces.append(p.payloads)
            layout = self.layouts[p.key]
        members = tuple(ps[0] if len(pieces) == 1 else torch.cat(ps) for ps in zip(*pieces)) if pieces else ()
        return Received(members, tuple(dt for _, _, dt in layout))

    # `variant`: what else fixes a transfer's shapes besides its rows (a token slice's length): each
    # (rows, variant) learns its member layout once
    def post_activation(self, n: int, micro_batch: int, eval_: bool = False, variant: int | None = None) -> None:
        self._post(n, self.stage - 1, "eval" if eval_ else "activation", micro_batch, variant)

    def post_gradient(self, n: int, micro_batch: int, variant: int | None = None) -> None:
        self._post(n, self.stage + 1, "gradient", micro_batch, variant)

    def reap(self) -> None:
        """Drop the sends that completed: a sent activation is not kept longer than its transfer."""
        self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]

    def send_activation(self, carry: tuple, logical: tuple, n: int, micro_batch: int, eval_: bool = False,
                        variant: int | None = None) -> None:
        self._send_pieces(carry, logical, n, self.stage + 1, "eval" if eval_ else "activation", micro_batch, variant)

    def recv_activation(self, n: int, micro_batch: int, eval_: bool = False, variant: int | None = None) -> Received:
        return self._recv_pieces(n, self.stage - 1, "eval" if eval_ else "activation", micro_batch, variant)

    def send_gradient(self, grads: tuple, n: int, micro_batch: int, variant: int | None = None) -> None:
        self._send_pieces(grads, tuple(g.dtype for g in grads), n, self.stage - 1, "gradient", micro_batch, variant)

    def recv_gradient(self, n: int, micro_batch: int, variant: int | None = None) -> tuple:
        return self._recv_pieces(n, self.stage + 1, "gradient", micro_batch, variant).wire

    def wait_sends(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
