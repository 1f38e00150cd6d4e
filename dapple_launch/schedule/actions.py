"""A schedule is data: for each stage, the ordered actions of one iteration.

The same lists are read by the validator, the simulator and the runtime; nothing else
decides what a stage does next. A micro-batch's backward on a stage is either one action (B) or
split (zero-bubble schedules): I computes the gradient of the stage's input (what the previous
stage waits for), W the gradients of its weights (what nobody waits for until the all-reduce).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import lru_cache


class Kind(str, enum.Enum):
    FORWARD = "F"
    BACKWARD = "B"  # the whole backward: input and weight gradients
    INPUT_GRAD = "I"  # the input gradient only; its W follows later
    WEIGHT_GRAD = "W"  # the weight gradients of a micro-batch whose I ran
    SEND_ACTIVATION = "SA"  # to the next stage
    RECV_ACTIVATION = "RA"  # from the previous stage
    SEND_GRADIENT = "SG"  # to the previous stage
    RECV_GRADIENT = "RG"  # from the next stage

    @property
    def is_compute(self) -> bool:
        return self in _COMPUTE

    @property
    def sends_gradient(self) -> bool:
        """B or I: needs the next stage's gradient and produces the one the previous stage needs."""
        return self is Kind.BACKWARD or self is Kind.INPUT_GRAD

    @property
    def frees_activations(self) -> bool:
        """B or W: the last action of a micro-batch on a stage; what its forward saved is released."""
        return self is Kind.BACKWARD or self is Kind.WEIGHT_GRAD


_COMPUTE = frozenset({Kind.FORWARD, Kind.BACKWARD, Kind.INPUT_GRAD, Kind.WEIGHT_GRAD})
# The simulators walk compute kinds as small ints (encoded orders): F 0, B 1, I 2, W 3 (B and W,
# the odd codes, end a micro-batch on a stage)
COMPUTE_CODES = (Kind.FORWARD, Kind.BACKWARD, Kind.INPUT_GRAD, Kind.WEIGHT_GRAD)
CODE_OF = {kind: code for code, kind in enumerate(COMPUTE_CODES)}


@dataclass(frozen=True, order=True)
class Action:
    kind: Kind
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.kind.value}{self.micro_batch}"


@lru_cache(maxsize=64)
def actions_of(kind: Kind, num_micro_batches: int) -> tuple[Action, ...]:
    """Every micro-batch's action of one kind, shared (an Action is frozen): each stage's order of a
    generator picks from these rather than making its own."""
    return tuple(Action(kind, m) for m in range(num_micro_batches))


@dataclass(frozen=True)
class Schedule:
    name: str
    num_stages: int
    num_micro_batches: int
    stage_actions: tuple[tuple[Action, ...], ...]
    forward_only: bool = False
    # token slicing (schedule/terapipe.py): each micro-batch is num_slices units, unit u = m·K + i is
    # slice i of micro-batch m; num_micro_batches counts units. 1 = no slicing.
    num_slices: int = 1
    slice_lengths: tuple[int, ...] = ()

    @property
    def sequences(self) -> int:
        """Micro-batches of whole sequences (units / slices)."""
        return self.num_micro_batches // self.num_slices

    def label(self, a: Action) -> str:
        """An action as the timelines show it: F3, or with token slices F1.2 (micro-batch 1, slice 2)."""
        if self.num_slices == 1:
            return str(a)
        m, i = divmod(a.micro_batch, self.num_slices)
        return f"{a.kind.value}{m}.{i}"

    def compute_order(self, stage: int) -> list[Action]:
        return [a for a in self.stage_actions[stage] if a.kind.is_compute]

    def grid(self, marks: dict[int, int] | None = None) -> str:
        """Stage × step grid of compute actions; `marks` maps stage -> action index to flag."""
        marks = marks or {}
        rows = []
        for s, actions in enumerate(self.stage_actions):
            cells = []
            for i, a in enumerate(actions):
                text = str(a)
                cells.append(f">{text}<" if marks.get(s) == i else text)
            rows.append(f"stage {s}: " + " ".join(cells))
        return "\n".join(rows)


def with_communication(
    name: str, compute: list[list[Action]], num_micro_batches: int, forward_only: bool = False
) -> Schedule:
    """Insert the point-to-point actions around each compute action.

    A receive sits right before the compute that needs it and a send right after the compute
    that produced it; the runtime posts receives ahead of time, so this order is the order of
    *use*, not of posting.
    """
    num_stages = len(compute)
    last = num_stages - 1
    # one instance per (kind, micro-batch), shared by every stage: deep schedules build fast
    comm = {
        k: [Action(k, m) for m in range(num_micro_batches)]
        for k in (Kind.RECV_ACTIVATION, Kind.SEND_ACTIVATION, Kind.RECV_GRADIENT, Kind.SEND_GRADIENT)
    }
    recv_act, send_act = comm[Kind.RECV_ACTIVATION], comm[Kind.SEND_ACTIVATION]
    recv_grad, send_grad = comm[Kind.RECV_GRADIENT], comm[Kind.SEND_GRADIENT]
    stage_actions = []
    for s, order in enumerate(compute):
        actions: list[Action] = []
        for a in order:
            m = a.micro_batch
            if a.kind is Kind.FORWARD:
                if s > 0:
                    actions.append(recv_act[m])
                actions.append(a)
                if s < last:
                    actions.append(send_act[m])
            elif a.kind is Kind.WEIGHT_GRAD:  # local: nothing arrives, nothing leaves
                actions.append(a)
            else:
                if s < last:
                    actions.append(recv_grad[m])
                actions.append(a)
                if s > 0:
                    actions.append(send_grad[m])
        stage_actions.append(tuple(actions))
    return Schedule(name, num_stages, num_micro_batches, tuple(stage_actions), forward_only)
