"""Moving activations and their gradients between stages, re-split across replica counts.

Micro-batch m holds n samples; replica j of a stage with r replicas owns the j-th contiguous
slice of them. Between stages with different replica counts, each sender sends every receiver
the overlap of their slices (many-to-many); the receiver concatenates the pieces in order.
Sends are non-blocking (gloo/NCCL isend), so a stage never blocks on its neighbour's progress,
which is the semantics the validator checks; a sent tensor is dropped as soon as its send
completes (`reap`). Receives are posted ahead of use (`post_*`): the executor posts the receives
of the next compute actions while the current one runs, so the data lands during compute and the
sender's isend completes early. Each piece travels as a small header (dtype, shape) and a payload;
the payload's shape for a given piece size is learned from the first header and reused, which is
what lets a receive be posted before its header arrives (the header is still checked).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .grid import ProcessGrid, split_bounds

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool]
_HEADER = 8  # ndim, dtype code, up to 6 dims
TAG_SPACE = {"activation": 0, "gradient": 1, "eval": 2}


def overlaps(n: int, src_replicas: int, dst_replicas: int, src: int | None = None, dst: int | None = None):
    """(src replica, dst replica, lo, hi) for each overlapping piece of an n-sample micro-batch."""
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
    return out


def _tag(space: str, micro_batch: int, part: int) -> int:
    return (micro_batch * 3 + TAG_SPACE[space]) * 2 + part


@dataclass
class _PostedPiece:
    header: torch.Tensor
    header_work: object
    payload: torch.Tensor | None  # None when the shape is not known yet: received after the header
    payload_work: object
    peer: int
    tag: int


@dataclass
class PointToPoint:
    grid: ProcessGrid
    stage: int
    replica: int
    device: torch.device = torch.device("cpu")
    pending: list = field(default_factory=list)  # (work, tensor) kept alive until the send completes
    posted: dict = field(default_factory=dict)  # (space, micro-batch) -> [_PostedPiece] of receives in flight
    shapes: dict = field(default_factory=dict)  # (space, rows) -> (trailing shape, dtype) seen in a header

    def _send_pieces(self, tensor: torch.Tensor, n: int, peer_stage: int, space: str, micro_batch: int) -> None:
        my_lo = split_bounds(n, self.grid.replicas[self.stage])[self.replica][0]
        peer_ranks = self.grid.stage_ranks(peer_stage)
        for _, k, lo, hi in overlaps(n, self.grid.replicas[self.stage], self.grid.replicas[peer_stage], src=self.replica):
            piece = tensor[lo - my_lo:hi - my_lo].contiguous()
            header = torch.zeros(_HEADER, dtype=torch.int64)
            header[0], header[1] = piece.dim(), _DTYPES.index(piece.dtype)
            header[2:2 + piece.dim()] = torch.tensor(piece.shape)
            for part, t in ((0, header.to(self.device)), (1, piece)):
                self.pending.append((dist.isend(t, peer_ranks[k], tag=_tag(space, micro_batch, part)), t))

    def _post(self, n: int, peer_stage: int, space: str, micro_batch: int) -> None:
        key = (space, micro_batch)
        if key in self.posted:
            return
        peer_ranks = self.grid.stage_ranks(peer_stage)
        posted = []
        for j, _, lo, hi in overlaps(n, self.grid.replicas[peer_stage], self.grid.replicas[self.stage], dst=self.replica):
            header = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
            tag = _tag(space, micro_batch, 0)
            header_work = dist.irecv(header, peer_ranks[j], tag=tag)
            payload, payload_work = None, None
            known = self.shapes.get((space, hi - lo))
            if known is not None:
                payload = torch.empty((hi - lo, *known[0]), dtype=known[1], device=self.device)
                payload_work = dist.irecv(payload, peer_ranks[j], tag=tag + 1)
            posted.append(_PostedPiece(header, header_work, payload, payload_work, peer_ranks[j], tag))
        self.posted[key] = posted

    def _recv_pieces(self, n: int, peer_stage: int, space: str, micro_batch: int) -> torch.Tensor:
        self._post(n, peer_stage, space, micro_batch)
        pieces = []
        for p in self.posted.pop((space, micro_batch)):
            p.header_work.wait()
            header = p.header.cpu()
            shape = header[2:2 + int(header[0])].tolist()
            dtype = _DTYPES[int(header[1])]
            if p.payload is None:
                p.payload = torch.empty(shape, dtype=dtype, device=self.device)
                p.payload_work = dist.irecv(p.payload, p.peer, tag=p.tag + 1)
                self.shapes[(space, shape[0])] = (tuple(shape[1:]), dtype)
            elif list(p.payload.shape) != shape or p.payload.dtype != dtype:
                raise RuntimeError(f"{space} piece of micro-batch {micro_batch} from rank {p.peer} is {dtype} "
                                   f"{shape} but {p.payload.dtype} {list(p.payload.shape)} was expected: the "
                                   f"stages disagree on the activation shape")
            p.payload_work.wait()
            pieces.append(p.payload)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def post_activation(self, n: int, micro_batch: int, eval_: bool = False) -> None:
        self._post(n, self.stage - 1, "eval" if eval_ else "activation", micro_batch)

    def post_gradient(self, n: int, micro_batch: int) -> None:
        self._post(n, self.stage + 1, "gradient", micro_batch)

    def reap(self) -> None:
        """Drop the sends that completed: a sent activation is not kept longer than its transfer."""
        self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]

    def send_activation(self, t: torch.Tensor, n: int, micro_batch: int, eval_: bool = False) -> None:
        self._send_pieces(t, n, self.stage + 1, "eval" if eval_ else "activation", micro_batch)

    def recv_activation(self, n: int, micro_batch: int, eval_: bool = False) -> torch.Tensor:
        return self._recv_pieces(n, self.stage - 1, "eval" if eval_ else "activation", micro_batch)

    def send_gradient(self, t: torch.Tensor, n: int, micro_batch: int) -> None:
        self._send_pieces(t, n, self.stage - 1, "gradient", micro_batch)

    def recv_gradient(self, n: int, micro_batch: int) -> torch.Tensor:
        return self._recv_pieces(n, self.stage + 1, "gradient", micro_batch)

    def wait_sends(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
