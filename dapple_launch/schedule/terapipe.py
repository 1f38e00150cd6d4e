"""TeraPipe (Li et al., ICML'21): pipelining token slices inside each sequence of a causal model.

A sequence of L tokens is cut into slices l_1 … l_K; the unit of pipelining is (micro-batch, slice),
written in the action lists as unit u = m·K + i, so the validator, the simulator and the runtime
read them as they read micro-batches, and `Schedule.num_slices` says how to split a unit. Slice i of
a micro-batch needs the keys and values of its slices < i on the same stage (a per-stage cache, no
extra traffic), so on each stage the forwards of a micro-batch's slices run in token order and the
backwards in reverse (slice i's backward adds what later slices sent into its cached keys and
values). The order here is GPipe's over units (TeraPipe's own): every forward, then every
backward, micro-batches in order and each one's slices last to first.

Costs (for the simulator and the planner): of a micro-batch's whole-sequence compute on a stage, a
fraction `a` is causal attention (its work grows with the context). Slice (l, c) (c tokens before
it) costs (1 − a)·l/L + a·l·(2c + l)/L² of it: the projections and MLP per token, and the causal
attention of its queries over the c + l keys before them, so the slices' costs sum to the whole
sequence's (slicing adds no work under this model, and removes none). Its transfers scale as l/L;
its saved bytes are fitted from traces (profile/analytic.py: the keys and values of the context
and the attention over it grow with c).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .actions import Action, Kind, Schedule, with_communication


def bounds(lengths: tuple[int, ...]) -> list[tuple[int, int]]:
    """[start, stop) token range of each slice."""
    out, at = [], 0
    for n in lengths:
        out.append((at, at + n))
        at += n
    return out


def terapipe(num_stages: int, num_micro_batches: int, lengths: tuple[int, ...]) -> Schedule:
    """GPipe over (micro-batch, slice) units: forwards in token order, backwards last slice first."""
    K = len(lengths)
    if K < 1 or min(lengths) < 1:
        raise ValueError(f"token slices {list(lengths)}: need at least one slice, each of >= 1 token")
    units = num_micro_batches * K
    backward_order = [m * K + i for m in range(num_micro_batches) for i in reversed(range(K))]
    compute = [
        [Action(Kind.FORWARD, u) for u in range(units)] + [Action(Kind.BACKWARD, u) for u in backward_order]
        for _ in range(num_stages)
    ]
    sched = with_communication("terapipe", compute, units)
    return replace(sched, num_slices=K, slice_lengths=tuple(lengths))


def check_slice_order(schedule: Schedule) -> str | None:
    """The slice rules (None when kept): on each stage, a micro-batch's forwards in token order and
    its backwards (B or I) in reverse; the rule's text with the stage and step otherwise."""
    K = schedule.num_slices
    if K <= 1:
        return None
    for s, actions in enumerate(schedule.stage_actions):
        forward_next: dict[int, int] = {}
        backward_next: dict[int, int] = {}
        for step, a in enumerate(actions):
            m, i = divmod(a.micro_batch, K)
            if a.kind is Kind.FORWARD:
                want = forward_next.get(m, 0)
                if i != want:
                    return (
                        f"stage {s}, step {step}: forward of micro-batch {m} slice {i} runs before its slice {want} "
                        f"(a slice attends to the keys and values of the slices before it)"
                    )
                forward_next[m] = i + 1
            elif a.kind.sends_gradient:
                want = backward_next.get(m, K - 1)
                if i != want:
                    return (
                        f"stage {s}, step {step}: backward of micro-batch {m} slice {i} runs before its slice {want} "
                        f"(later slices send gradients into its cached keys and values first)"
                    )
                backward_next[m] = i - 1
    return None


@dataclass(frozen=True)
class SliceScale:
    """Per slice, multipliers of a stage's whole-sequence costs: compute (forward and backward), its
    transfers up and down, and saved bytes."""

    compute: tuple[float, ...]
    transfer: tuple[float, ...]  # the stage's activation sends (to the next stage)
    memory: tuple[float, ...]
    transfer_down: tuple[float, ...] = ()  # its gradient sends (to the previous stage); () = as transfer


def slice_scale(
    lengths: tuple[int, ...],
    compute: float,
    memory_kv: float = 0.0,
    memory_att: float = 0.0,
    fixed: float = 0.0,
    latency_up: float = 0.0,
    latency_down: float = 0.0,
) -> SliceScale:
    """A stage's multipliers from its shares (profile/model_profile.py: slice_compute, slice_memory_kv,
    slice_memory_att): slice (l, c) with stop = c + l costs (1 - a) l/L + a l·(2 stop - l)/L² of the
    whole sequence's variable compute, (1 - g_kv - g_att) l/L + g_kv stop/L + g_att l·stop/L² of its
    saved bytes, and l/L of its transfers' bytes. What every call or message costs whatever its size
    is paid by every slice: `fixed`, the share of the stage's compute that is per call (a measured
    profile's fixed parts), and `latency_up` / `latency_down`, the share of each send that is latency."""
    L = sum(lengths)
    a = min(max(compute, 0.0), 1.0)
    kv, att = min(max(memory_kv, 0.0), 1.0), min(max(memory_att, 0.0), 1.0)
    lin = max(0.0, 1.0 - kv - att)
    out_c, out_u, out_d, out_m = [], [], [], []
    for start, stop in bounds(lengths):
        n = stop - start
        out_c.append(fixed + (1 - fixed) * ((1 - a) * n / L + a * n * (2 * stop - n) / L**2))
        out_u.append(latency_up + (1 - latency_up) * n / L)
        out_d.append(latency_down + (1 - latency_down) * n / L)
        out_m.append(lin * n / L + kv * stop / L + att * n * stop / L**2)
    return SliceScale(tuple(out_c), tuple(out_u), tuple(out_m), tuple(out_d))


def unit_scales(scale: SliceScale, num_micro_batches: int) -> SliceScale:
    """The per-slice multipliers repeated for every micro-batch's units (unit u = m·K + i)."""
    return SliceScale(
        scale.compute * num_micro_batches,
        scale.transfer * num_micro_batches,
        scale.memory * num_micro_batches,
        scale.transfer_down * num_micro_batches,
    )
