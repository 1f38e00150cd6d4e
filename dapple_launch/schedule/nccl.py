"""NCCL's point-to-point rules as a model: a rank's issue order is accepted only if it cannot hang
and cannot deliver a tensor into the wrong buffer on NCCL, whatever the message sizes.

The rules (NVIDIA/nccl#479, #783; pytorch/pytorch#132852, #74701):
- tags are ignored: on one communicator, the i-th send from A to B matches the i-th receive on B
  from A;
- what a rank issues on one channel (a communicator, or for single sends and receives a
  communicator's rank pair) runs on one stream, one kernel after another, in issue order, both
  directions alike;
- a send may wait until its receive runs (rendezvous: nothing is assumed buffered), a receive until
  its send runs;
- the operations of one group (`batch_isend_irecv`) form one kernel: they progress together, and
  the kernel ends when all of them have;
- an operation issued after a `wait()` on another is ordered after it (the host, or the stream
  the wait made dependent).

A program is each rank's list of `Issue(channel, ops)` and `Wait(k)` (k: the rank's k-th Issue).
`check` runs them under these rules and raises `NcclOrderError` naming the two ranks and the two
operations where a match is wrong or where the run cannot go on.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from .transfers import peer_groups


@dataclass(frozen=True)
class Op:
    peer: int
    send: bool
    what: str  # what it carries (its meaning and shape): a send and its receive must agree


@dataclass(frozen=True)
class Issue:
    channel: Hashable
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Wait:
    issue: int  # which of the rank's issues it waits for (all its operations)


class NcclOrderError(ValueError):
    pass


@dataclass
class _Kernel:
    rank: int
    index: int
    channel: Hashable
    ops: tuple[Op, ...]
    left: int = 0
    active: bool = False
    done: bool = False
    matched: list = field(default_factory=list)  # per op: its partner (kernel, op index), once issued
    finished: list = field(default_factory=list)  # per op: completed


def _describe(k: _Kernel, i: int) -> str:
    op = k.ops[i]
    return f"{'send' if op.send else 'receive'} of {op.what} {'to' if op.send else 'from'} rank {op.peer}"


def check(programs: dict[int, list]) -> int:
    """Run every rank's program under NCCL's rules; return the operations matched, or raise
    NcclOrderError (a wrong match, or a state where no rank can go on)."""
    kernels: dict[int, list[_Kernel]] = {r: [] for r in programs}
    queues: dict[tuple[int, Hashable], deque] = defaultdict(deque)
    # per (src, dst, channel): the sends issued on src and the receives issued on dst, in order
    sends: dict[tuple, list] = defaultdict(list)
    recvs: dict[tuple, list] = defaultdict(list)
    pc = {r: 0 for r in programs}
    matched = 0
    ready: deque = deque()  # kernels that may have become able to progress

    def issue(r: int, item: Issue) -> None:
        k = _Kernel(r, len(kernels[r]), item.channel, item.ops, len(item.ops))
        k.matched, k.finished = [None] * len(item.ops), [False] * len(item.ops)
        kernels[r].append(k)
        q = queues[(r, item.channel)]
        q.append(k)
        for i, op in enumerate(item.ops):
            if op.peer not in programs or op.peer == r:
                raise NcclOrderError(
                    f"rank {r} issues a {'send' if op.send else 'receive'} of {op.what} with rank "
                    f"{op.peer}, which is not another rank of the run"
                )
            key = (r, op.peer, item.channel) if op.send else (op.peer, r, item.channel)
            mine, theirs = (sends, recvs) if op.send else (recvs, sends)
            n = len(mine[key])
            mine[key].append((k, i))
            if n < len(theirs[key]):
                pk, pi = theirs[key][n]
                if pk.ops[pi].what != op.what:
                    s, rv = ((k, i), (pk, pi)) if op.send else ((pk, pi), (k, i))
                    raise NcclOrderError(
                        f"rank {s[0].rank}'s send #{n + 1} to rank {rv[0].rank} is {s[0].ops[s[1]].what} but rank "
                        f"{rv[0].rank}'s receive #{n + 1} from rank {s[0].rank} is {rv[0].ops[rv[1]].what}: NCCL "
                        f"matches a pair's transfers in issue order and ignores tags, so one would land in the other's "
                        f"buffer"
                    )
                k.matched[i], pk.matched[pi] = (pk, pi), (k, i)
                ready.append(pk)
        if len(q) == 1:
            k.active = True
            ready.append(k)

    def progress(k: _Kernel) -> None:
        nonlocal matched
        if not k.active or k.done:
            return
        for i in range(len(k.ops)):
            if k.finished[i] or k.matched[i] is None:
                continue
            pk, pi = k.matched[i]
            if pk.active:
                k.finished[i], pk.finished[pi] = True, True
                k.left, pk.left = k.left - 1, pk.left - 1
                matched += 1
                _maybe_done(pk)
        _maybe_done(k)

    def _maybe_done(k: _Kernel) -> None:
        if k.left == 0 and not k.done:
            k.done = True
            q = queues[(k.rank, k.channel)]
            q.popleft()
            if q:
                q[0].active = True
                ready.append(q[0])
            for pk, _ in filter(None, k.matched):
                ready.append(pk)

    def run_host(r: int) -> bool:
        moved = False
        prog = programs[r]
        while pc[r] < len(prog):
            item = prog[pc[r]]
            if isinstance(item, Wait):
                if item.issue >= len(kernels[r]):
                    raise NcclOrderError(f"rank {r} waits for its issue {item.issue}, which it has not issued")
                if not kernels[r][item.issue].done:
                    break
            else:
                issue(r, item)
            pc[r] += 1
            moved = True
        return moved

    moving = True
    while moving:
        moving = False
        for r in programs:
            moving |= run_host(r)
            while ready:
                progress(ready.popleft())
    stuck = {r for r in programs if pc[r] < len(programs[r])}
    pending = [k for ks in kernels.values() for k in ks if not k.done]
    if stuck or pending:
        raise NcclOrderError(_deadlock(programs, pc, kernels, queues, sends, recvs, stuck, pending))
    return matched


def _deadlock(programs, pc, kernels, queues, sends, recvs, stuck, pending) -> str:
    """Name the two ranks and the two operations at the heart of the hang."""
    for r in sorted(stuck) or sorted({k.rank for k in pending}):
        if r in stuck:
            waited = kernels[r][programs[r][pc[r]].issue]
        else:
            waited = next(k for k in kernels[r] if not k.done)
        head = queues[(waited.rank, waited.channel)][0]
        i = next(i for i in range(len(head.ops)) if not head.finished[i])
        op = head.ops[i]
        why = f"rank {r} waits for its {_describe(waited, next(j for j in range(len(waited.ops)) if not waited.finished[j]))}"
        if head is not waited:
            why += f", queued on its stream behind its {_describe(head, i)}"
        if head.matched[i] is None:
            peer_state = f"rank {op.peer} never issues the matching {'receive' if op.send else 'send'}" + (
                f" before it blocks at step {pc[op.peer]} of its program" if op.peer in stuck else ""
            )
            return f"NCCL would hang: {why}; {peer_state}"
        pk, pi = head.matched[i]
        peer_head = queues[(pk.rank, pk.channel)][0]
        j = next(j for j in range(len(peer_head.ops)) if not peer_head.finished[j])
        return (
            f"NCCL would hang: {why}; rank {pk.rank} has the matching {_describe(pk, pi)} queued behind its "
            f"{_describe(peer_head, j)} on the same stream: each stream's head waits for an operation the other "
            f"stream holds back"
        )
    return "NCCL would hang"


def lowered_programs(programs) -> dict[int, list]:
    """The model's view of schedule/transfers.py's RankPrograms as the runtime issues them: per slot
    and peer, the slot's transfers with that peer as one group on the pair's own communicator; before
    each compute step, a wait for the group of each receive it needs; at the end, a wait for every
    group that sends."""
    out: dict[int, list] = {}
    for r, prog in programs.items():
        items: list = []
        index: dict = {}  # transfer -> its group's place among the rank's issues
        issued = 0
        for c, slot in enumerate(prog.slots):
            for peer, group in peer_groups(slot).items():
                for t, _ in group:
                    index[t] = issued
                issued += 1
                ops = tuple(Op(peer, is_send, str(t)) for t, is_send in group)
                items.append(Issue(("pair", min(r, peer), max(r, peer)), ops))
            if c < len(prog.needs):
                items += [Wait(i) for i in dict.fromkeys(index[t] for t in prog.needs[c])]
        items += [Wait(i) for i in dict.fromkeys(index[t] for t in prog.sends)]
        out[r] = items
    return out


def check_lowered(programs) -> int:
    """`check` of schedule/transfers.py's programs, once per distinct component: ranks that exchange
    nothing with each other run independent programs, and data parallelism makes many components
    alike (each stage's replica j talking to the next stage's replica j), so each shape — ranks
    renamed in order, pieces by their rows — is run once. Returns the operations matched."""
    parent = {r: r for r in programs}

    def find(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for p in programs.values():
        for t in p.sends:
            a, b = find(t.src), find(t.dst)
            if a != b:
                parent[max(a, b)] = min(a, b)
    components: dict[int, list[int]] = defaultdict(list)
    for r in sorted(programs):
        components[find(r)].append(r)
    seen, matched = set(), 0
    for ranks in components.values():
        index = {r: i for i, r in enumerate(ranks)}
        shape = tuple(
            tuple(
                tuple(
                    (t.space, t.src_stage, t.dst_stage, t.unit, index[t.src], index[t.dst], t.hi - t.lo, send)
                    for t, send in slot
                )
                for slot in programs[r].slots
            )
            for r in ranks
        )
        if shape not in seen:
            seen.add(shape)
            matched += check(lowered_programs({r: programs[r] for r in ranks}))
    return matched
