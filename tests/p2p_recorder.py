"""Records a process's real point-to-point calls for the NCCL model (schedule/nccl.py).

Inside `recording()`, every `torch.distributed` point-to-point call this process makes — a
`batch_isend_irecv` group, a single `isend`/`irecv`/`send`/`recv` — is written down as the model's
`Issue` (its channel: the communicator it runs on; its operations: peer, direction, and what it
carries), and every `wait()` on a returned work as the model's `Wait`. What an operation carries is
the transfer whose tensor it is (RankComms' `_send_pieces`/`_recv_buffers` made it) with the
member's dtype and shape, so a send and the receive NCCL would match with it must agree on both meaning and shape.
The calls themselves run unchanged.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist


class _RecordedWork:
    """A work whose wait() is written down before it waits."""

    def __init__(self, work, recorder: Recorder, issue: int):
        self._work, self._recorder, self._issue = work, recorder, issue

    def wait(self, *args, **kwargs):
        self._recorder.items.append(("wait", self._issue))
        return self._work.wait(*args, **kwargs)

    def is_completed(self):
        return self._work.is_completed()

    def __getattr__(self, name):
        return getattr(self._work, name)


class Recorder:
    def __init__(self):
        # ("issue", channel, [(peer, send, what, tag)]) | ("wait", issue index) | ("begin", the NCCL
        # model's program of the iteration begun: its items as below, ops without tags)
        self.items: list = []
        self.issues = 0
        self.labels: dict[int, str] = {}  # id(tensor) -> the transfer it belongs to

    def _channel(self, group, peer: int, batched: bool):
        """NCCL runs a batch on its group's communicator; a single op on the pair's (pytorch#132852)."""
        me = dist.get_rank()
        if batched:
            ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
            return ["group", sorted(ranks)]
        return ["pair", sorted((me, peer))]

    def _issue(self, channel, ops) -> int:
        self.items.append(("issue", channel, ops))
        self.issues += 1
        return self.issues - 1

    def _what(self, tensor) -> str:
        return f"{self.labels.get(id(tensor), '?')} {str(tensor.dtype).replace('torch.', '')}{list(tensor.shape)}"

    @contextlib.contextmanager
    def patched(self):
        from torch.distributed import distributed_c10d as c10d

        from dapple_launch.runtime import p2p as p2p_module

        names = ("batch_isend_irecv", "isend", "irecv", "send", "recv")
        real = {n: getattr(c10d, n) for n in names}
        comms = p2p_module.RankComms
        real_send, real_recv = comms._send_pieces, comms._recv_buffers
        real_begin = comms.begin
        rec = self
        inside_batch = [False]

        def batch(ops):
            # P2POp keeps the global peer in .peer; a batch runs on its group's communicator
            index = rec._issue(
                rec._channel(ops[0].group, ops[0].peer, True) if ops else ["none"],
                [(op.peer, op.op is wrapped["isend"], rec._what(op.tensor), op.tag) for op in ops],
            )
            inside_batch[0] = True
            try:
                works = real["batch_isend_irecv"](ops)
            finally:
                inside_batch[0] = False
            return [_RecordedWork(w, rec, index) for w in works]

        def single(name, is_send, blocking):
            def call(tensor, dst_or_src=None, group=None, tag=0, *args, **kw):
                if inside_batch[0]:  # (a batch's own ops: recorded with the batch)
                    return real[name](tensor, dst_or_src, group, tag, *args, **kw)
                index = rec._issue(
                    rec._channel(group, dst_or_src, False), [(dst_or_src, is_send, rec._what(tensor), tag)]
                )
                work = real[name](tensor, dst_or_src, group, tag, *args, **kw)
                if blocking:
                    rec.items.append(("wait", index))
                    return work
                return _RecordedWork(work, rec, index)

            return call

        def labelled(fn):
            def call(self_, t, *a, **kw):
                tensors = fn(self_, t, *a, **kw)
                for x in tensors:
                    rec.labels[id(x)] = str(t)
                return tensors

            return call

        wrapped = {
            "batch_isend_irecv": batch,
            "isend": single("isend", True, False),
            "irecv": single("irecv", False, False),
            "send": single("send", True, True),
            "recv": single("recv", False, True),
        }
        # both namespaces: P2POp checks its op against distributed_c10d's isend/irecv
        for n, f in wrapped.items():
            setattr(dist, n, f)
            setattr(c10d, n, f)

        def begin(self_, program, *a, **kw):
            from dapple_launch.schedule.nccl import Issue, lowered_programs

            # what the NCCL model proves this iteration issues (as data: the items go back as JSON)
            proven = [
                ("issue", list(x.channel), [(op.peer, op.send, op.what) for op in x.ops])
                if isinstance(x, Issue)
                else ("wait", x.issue)
                for x in lowered_programs({program.rank: program})[program.rank]
            ]
            rec.items.append(("begin", proven))
            return real_begin(self_, program, *a, **kw)

        comms._send_pieces, comms._recv_buffers = labelled(real_send), labelled(real_recv)
        comms.begin = begin
        try:
            yield self
        finally:
            for n, f in real.items():
                setattr(dist, n, f)
                setattr(c10d, n, f)
            comms._send_pieces, comms._recv_buffers = real_send, real_recv
            comms.begin = real_begin


def to_model(items: list, rank: int) -> list:
    """One rank's recorded calls as the NCCL model's program (ops' tags dropped: NCCL ignores them)."""
    from dapple_launch.schedule.nccl import Issue, Op, Wait

    out = []
    for item in items:
        if item[0] == "issue":
            out.append(
                Issue(
                    tuple(map(lambda c: tuple(c) if isinstance(c, list) else c, item[1])),
                    tuple(Op(peer, send, what) for peer, send, what, _ in item[2]),
                )
            )
        elif item[0] == "wait":
            out.append(Wait(item[1]))
    return out


def as_lowered(items: list, rank: int) -> tuple[list, list]:
    """(recorded, lowered): this rank's recorded calls and what schedule/nccl.py's
    `lowered_programs` says the programs it began issue, iteration after iteration, each as a list of
    (channel's ranks, operations, issues waited for before the next issue). The recorded waits may
    be fewer at the end of an iteration (a send seen complete is not waited for)."""
    from dapple_launch.schedule.nccl import Issue, Op, Wait

    lowered: list = []
    offset = 0
    for item in items:
        if item[0] == "begin":
            for kind, *rest in item[1]:
                if kind == "issue":
                    lowered.append(Issue(tuple(rest[0]), tuple(Op(*op) for op in rest[1])))
                else:
                    lowered.append(Wait(rest[0] + offset))
            offset += sum(kind == "issue" for kind, *_ in item[1])
    recorded = to_model([i for i in items if i[0] != "begin"], rank)

    def norm(program: list) -> list:
        out: list = [((), [], set())]
        for item in program:
            if isinstance(item, Issue):
                ops: list = []
                for op in item.ops:
                    what = op.what[: op.what.rindex(")") + 1]  # the transfer (a member's dtype and shape dropped)
                    if not ops or ops[-1] != (op.peer, op.send, what):
                        ops.append((op.peer, op.send, what))
                ranks = item.channel[1] if item.channel[0] == "group" else item.channel[1:]
                out.append((tuple(ranks), ops, set()))
            else:
                out[-1][2].add(item.issue)
        return out

    return norm(recorded), norm(lowered)
