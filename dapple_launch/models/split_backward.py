"""The backward split in two for zero-bubble schedules: I (input gradient) now, W (weights) later.

Used by the runtime (runtime/executor.py) and timed per layer by the measuring profiler.

I runs autograd from the stage's outputs to its inputs only; the engine then skips every weight
gradient (a node computes only the outputs some requested input needs). On the way it records, at
each node where a weight's branch joins that path (an *anchor*: e.g. the matmul whose other operand
is the weight), the gradient arriving there. W then starts at those anchors with the recorded
gradients and runs only the weights' branches: no part of the backward is computed twice. The
graph is kept between the two (its saved tensors are what W needs) and released after W, so a
micro-batch's activations live from its F to its W (the simulator's accounting).

Weights whose branch reaches the outputs without meeting the input path (a stage whose input needs
no gradient, the first stage; a weight used only on a side output) have no anchor: W computes them
from the outputs directly, as a whole backward would. Where every weight has an anchor, I lets go of the
outputs: what only the input gradient needed above the anchors (a last stage's loss, which saved
its own input) is freed at I, as torch.distributed.pipelining's stage_backward_input does.
"""

from __future__ import annotations

from collections import defaultdict, deque

import torch
from torch.autograd.graph import GradientEdge


def _node(t: torch.Tensor):
    """The autograd node a tensor's gradient flows into: its grad_fn, or a leaf's accumulator."""
    if t.grad_fn is not None:
        return t.grad_fn
    view = t.view_as(t).grad_fn  # (a leaf's accumulator exists once viewed)
    assert view is not None, "a tensor that requires no gradient has no autograd node"
    return view.next_functions[0][0]


def _consumers(roots) -> dict:
    """node -> the nodes whose backward feeds it (its consumers in the forward), over the graph below roots."""
    up: dict = defaultdict(list)
    seen, todo = set(roots), deque(roots)
    while todo:
        n = todo.popleft()
        for child, _ in n.next_functions:
            if child is None:
                continue
            up[child].append(n)
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return up


class _Group:
    """Weights that share anchors: one autograd call computes them all."""

    def __init__(self):
        self.params: list[torch.Tensor] = []
        self.anchors: list = []
        self.grads: dict = {}  # anchor -> the gradients that reached it during I


class PendingWeights:
    """What W of one micro-batch needs: the graph (through its outputs), the anchors' recorded
    gradients, and the weights that have no anchor."""

    def __init__(self, outputs, grad_outputs, groups: list[_Group], unanchored: list[torch.Tensor]):
        self.outputs, self.grad_outputs = outputs, grad_outputs
        self.groups, self.unanchored = groups, unanchored  # (emptied once run: the graph is dropped)

    def run(self) -> None:
        """Accumulate this micro-batch's weight gradients into .grad, then drop the graph. The groups
        run from the stage's last weights to its first, as a whole backward reaches them: a bucketed
        all-reduce (runtime GradientSync) sends the last layers' gradients while W computes the rest."""
        for g in reversed(self.groups):
            edges, grads = [], []
            for a in g.anchors:
                for i, gr in enumerate(g.grads.get(a, ())):
                    if gr is not None:
                        edges.append(GradientEdge(a, i))
                        grads.append(gr)
            if not edges:
                continue
            # An anchor below another of the group would receive the upper one's gradient again on
            # top of its recorded total: pin every anchor to what it recorded.
            pins = (
                [a.register_prehook(lambda _g, rec=g.grads[a]: rec) for a in g.anchors if a in g.grads]
                if len(g.anchors) > 1
                else []
            )
            try:
                got = torch.autograd.grad(edges, g.params, grads, retain_graph=True, allow_unused=True)
            finally:
                for h in pins:
                    h.remove()
            _accumulate(g.params, got)
        if self.unanchored:
            assert self.outputs is not None  # (kept whenever a weight has no anchor)
            got = torch.autograd.grad(
                self.outputs, self.unanchored, self.grad_outputs, retain_graph=True, allow_unused=True
            )
            _accumulate(self.unanchored, got)
        self.outputs = self.grad_outputs = None
        self.groups, self.unanchored = [], []


def _accumulate(params, grads) -> None:
    """Into .grad in place, as autograd's own accumulation does (a new tensor per micro-batch
    would cost an allocation and a copy of every weight gradient); then, as autograd's post-
    accumulate hooks would, tell whoever watches that parameter (a bucketed all-reduce)."""
    for p, g in zip(params, grads):
        if g is not None:
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)
            watcher = _WATCHERS.get(id(p))
            if watcher is not None:
                watcher(p)


_WATCHERS: dict = {}  # id(parameter) -> callback, while watched (watch_accumulation)


class _Unwatch:
    def __init__(self, keys):
        self.keys = keys

    def remove(self) -> None:
        for k in self.keys:
            _WATCHERS.pop(k, None)


def watch_accumulation(params, callback) -> _Unwatch:
    """Call `callback(p)` each time W accumulates a gradient into p.grad (what
    Tensor.register_post_accumulate_grad_hook does for autograd's own accumulation); `.remove()` stops."""
    keys = [id(p) for p in params]
    for p in params:
        _WATCHERS[id(p)] = callback
    return _Unwatch(keys)


def backward_input(outputs, grad_outputs, inputs, params) -> tuple[list, PendingWeights]:
    """I: the gradients of `inputs` (None where one needs none) and what W needs later.
    `outputs`: tensors that require grad; `grad_outputs`: theirs (None for a scalar loss)."""
    outputs = [t for t in outputs]
    grad_outputs = None if grad_outputs is None else list(grad_outputs)
    roots = [_node(t) for t in outputs]
    want = [x for x in inputs if x.requires_grad]
    params = list({id(p): p for p in params if p.requires_grad}.values())  # a tied weight once
    up = _consumers(roots)
    # The input path: every node from an input up to the outputs (what I executes).
    path: set = set()
    todo = deque(_node(x) for x in want)
    while todo:
        n = todo.popleft()
        if n in path:
            continue
        path.add(n)
        todo.extend(up.get(n, ()))
    # Each weight's branch up to the input path; weights whose branches meet share a group.
    owner: dict = {}  # anchor -> group
    groups: list[_Group] = []
    unanchored = []
    for p in params:
        start = _node(p)
        if start not in up:  # not used by this stage's forward
            continue
        anchors, reached_root, seen, todo = set(), False, {start}, deque([start])
        while todo:
            n = todo.popleft()
            if not up.get(n):
                reached_root = True
            for c in up.get(n, ()):
                if c in path:
                    anchors.add(c)
                elif c not in seen:
                    seen.add(c)
                    todo.append(c)
        if reached_root or not anchors:
            unanchored.append(p)
            continue
        mine = {owner[a] for a in anchors if a in owner}
        group = mine.pop() if mine else _Group()
        if not mine and group not in groups:
            groups.append(group)
        for other in mine:  # merge groups this weight joins
            group.params += other.params
            group.anchors += [a for a in other.anchors if a not in group.anchors]
            groups.remove(other)
            for a in other.anchors:
                owner[a] = group
        group.params.append(p)
        for a in anchors:
            if a not in group.anchors:
                group.anchors.append(a)
            owner[a] = group
    hooks = []
    for a, g in owner.items():
        hooks.append(a.register_prehook(lambda grads, a=a, g=g: g.grads.__setitem__(a, tuple(grads))))
    try:
        got = torch.autograd.grad(outputs, want, grad_outputs, retain_graph=True, allow_unused=True) if want else ()
    finally:
        for h in hooks:
            h.remove()
    by_input = dict(zip(map(id, want), got))
    if not unanchored:  # W starts at the anchors: the graph above them (a loss, say) and what it saved goes now
        outputs = grad_outputs = None
    return [by_input.get(id(x)) for x in inputs], PendingWeights(outputs, grad_outputs, groups, unanchored)
