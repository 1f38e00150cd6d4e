"""Moving activations and their gradients between stages, re-split across replica counts.

Micro-batch m holds n samples; replica j of a stage with r replicas owns the j-th contiguous
slice of them. Between stages with different replica counts, each sender sends every receiver
the overlap of their slices (many-to-many); the receiver concatenates the pieces in order.
Sends are non-blocking (gloo/NCCL isend), so a stage never blocks on its neighbour's progress,
which is the semantics the validator checks; a sent tensor is dropped as soon as its send
completes (`reap`). Receives are posted ahead of use (`post_*`): the executor posts the receives
of the next compute actions while the current one runs, so the data lands during compute and the
sender's isend completes early. The first piece of each size between two ranks carries a small
header (dtype, shape); later ones are the payload alone, received into a buffer of the learned
shape, so a transfer costs one message, as in torch.distributed.pipelining after its shape inference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.distributed as dist

from .grid import ProcessGrid, split_bounds

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool]
_HEADER = 8  # ndim, dtype code, up to 6 dims
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


def _tag(space: str, micro_batch: int, part: int) -> int:
    return (micro_batch * 3 + TAG_SPACE[space]) * 2 + part


@dataclass
class _PostedPiece:
    header: torch.Tensor | None  # only the first transfer of a (space, peer, rows) key carries a header
    header_work: object
    payload: torch.Tensor | None  # None until the shape is known: posted after the header arrives
    payload_work: object
    peer: int
    tag: int
    key: tuple


@dataclass
class PointToPoint:
    grid: ProcessGrid
    stage: int
    replica: int
    device: torch.device = torch.device("cpu")
    pending: list = field(default_factory=list)  # (work, tensor) kept alive until the send completes
    posted: dict = field(default_factory=dict)  # (space, micro-batch) -> [_PostedPiece] of receives in flight
    # (space, peer rank, rows) -> (trailing shape, dtype). A key's first transfer sends a header
    # too; both sides move a key's pieces in the same (micro-batch) order, so both know which.
    sent_shapes: dict = field(default_factory=dict)
    shapes: dict = field(default_factory=dict)
    header_expected: set = field(default_factory=set)

    def _send_pieces(self, tensor: torch.Tensor, n: int, peer_stage: int, space: str, micro_batch: int) -> None:
        my_lo = split_bounds(n, self.grid.replicas[self.stage])[self.replica][0]
        peer_ranks = self.grid.stage_ranks(peer_stage)
        for _, k, lo, hi in overlaps(n, self.grid.replicas[self.stage], self.grid.replicas[peer_stage], src=self.replica):
            piece = tensor[lo - my_lo:hi - my_lo].contiguous()
            key, shape = (space, peer_ranks[k], hi - lo), (tuple(piece.shape[1:]), piece.dtype)
            tag = _tag(space, micro_batch, 0)
            known = self.sent_shapes.get(key)
            if known is None:
                self.sent_shapes[key] = shape
                header = torch.zeros(_HEADER, dtype=torch.int64)
                header[0], header[1] = piece.dim(), _DTYPES.index(piece.dtype)
                header[2:2 + piece.dim()] = torch.tensor(piece.shape)
                header = header.to(self.device)
                self.pending.append((dist.isend(header, peer_ranks[k], tag=tag), header))
            elif known != shape:
                raise RuntimeError(f"{space} of micro-batch {micro_batch} to rank {peer_ranks[k]} is {piece.dtype} "
                                   f"{list(piece.shape)} but earlier ones of {hi - lo} rows were {known[1]} "
                                   f"{[hi - lo, *known[0]]}: a stage's output shape must not change between batches")
            self.pending.append((dist.isend(piece, peer_ranks[k], tag=tag + 1), piece))

    def _post(self, n: int, peer_stage: int, space: str, micro_batch: int) -> None:
        if (space, micro_batch) in self.posted:
            return
        peer_ranks = self.grid.stage_ranks(peer_stage)
        posted = []
        for j, _, lo, hi in overlaps(n, self.grid.replicas[peer_stage], self.grid.replicas[self.stage], dst=self.replica):
            key, tag = (space, peer_ranks[j], hi - lo), _tag(space, micro_batch, 0)
            piece = _PostedPiece(None, None, None, None, peer_ranks[j], tag, key)
            if key not in self.header_expected:  # this key's first transfer: its header comes too
                self.header_expected.add(key)
                piece.header = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
                piece.header_work = dist.irecv(piece.header, piece.peer, tag=tag)
            elif key in self.shapes:
                self._post_payload(piece)
            posted.append(piece)
        self.posted[(space, micro_batch)] = posted

    def _post_payload(self, p: _PostedPiece) -> None:
        tail, dtype = self.shapes[p.key]
        p.payload = torch.empty((p.key[2], *tail), dtype=dtype, device=self.device)
        p.payload_work = dist.irecv(p.payload, p.peer, tag=p.tag + 1)

    def _recv_pieces(self, n: int, peer_stage: int, space: str, micro_batch: int) -> torch.Tensor:
        self._post(n, peer_stage, space, micro_batch)
        pieces = []
        for p in self.posted.pop((space, micro_batch)):
            if p.header is not None:
                p.header_work.wait()
                header = p.header.cpu()
                self.shapes[p.key] = (tuple(header[3:2 + int(header[0])].tolist()), _DTYPES[int(header[1])])
            if p.payload is None:  # the key's shape became known after this receive was posted
                self._post_payload(p)
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
