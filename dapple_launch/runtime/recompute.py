"""Activation recomputation: a run of a stage's layers keeps only its input per micro-batch and runs
its forward again inside the backward (the plan's `recompute_layers`).

One autograd node per recomputed segment (a maximal run of consecutive recomputed layers): its
forward runs the layers without a graph and keeps the segment's input; its backward runs them
again with a graph (same RNG state, same autocast) and backpropagates through that graph at once,
so the recomputed activations live only while the segment's backward runs. The segment's
parameters are inputs of the node, so their gradients flow whatever the segment's inputs are (an
embedding fed integer tokens included), into `.grad` by the engine like any other layer's.

What it keeps is what the cost model charges (profile.ModelProfile.recompute_bytes): a segment in
the middle of the stage saves its input through autograd (save_for_backward: what saved-tensor
hooks count); a segment at the start of the stage keeps a reference to the stage's input, which
the executor holds until the backward anyway (the received wire tensors, or the batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from ..models.contract import as_tuple, carry_of, run_layers


def segments(recomputed: Iterable[int], count: int) -> list[tuple[int, int]]:
    """[start, stop) runs of consecutive recomputed local layer indices."""
    marks = sorted(set(recomputed))
    if marks and (marks[0] < 0 or marks[-1] >= count):
        raise ValueError(f"recomputed layers {marks} are not all among this stage's {count} layers")
    runs: list[tuple[int, int]] = []
    for i in marks:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def with_recomputation(layers: Sequence[nn.Module], recomputed: Iterable[int]) -> list:
    """The stage's layers to run in order, each recomputed segment replaced by one callable."""
    runs = segments(recomputed, len(layers))
    if not runs:
        return list(layers)
    out, i = [], 0
    for a, z in runs:
        out += layers[i:a]
        out.append(RecomputedSegment(list(layers[a:z]), stage_input=a == 0))
        i = z
    return out + list(layers[i:])


class RecomputedSegment:
    """Callable like a layer: positional members of the carry in, the segment's output out."""

    def __init__(self, layers: list[nn.Module], stage_input: bool):
        self.layers, self.stage_input = layers, stage_input
        seen, params = set(), []
        for layer in layers:  # a tied weight appears once
            for p in layer.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        self.params = params
        self.tuple_out = False  # the segment's output form (a tuple carry or one tensor), seen at forward

    def __call__(self, *inputs):
        if not torch.is_grad_enabled():  # evaluation: nothing to keep, nothing to recompute
            return run_layers(self.layers, carry_of(inputs))
        out = _Recompute.apply(self, len(inputs), *inputs, *self.params)
        out = as_tuple(out)
        return out if self.tuple_out else out[0]


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, segment: RecomputedSegment, n_inputs: int, *args):
        inputs = args[:n_inputs]
        ctx.segment, ctx.n_inputs = segment, n_inputs
        ctx.devices = sorted({t.device.index for t in inputs if t.is_cuda})
        ctx.rng = torch.get_rng_state()
        ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in ctx.devices]
        device_type = next((t.device.type for t in inputs), "cpu")
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        ctx.grad_mask = tuple(t.requires_grad for t in inputs)
        if segment.stage_input:  # held by the executor until this backward anyway: no second copy counted
            ctx.inputs = tuple(t.detach() for t in inputs)
        else:
            ctx.save_for_backward(*inputs)
        with torch.no_grad():
            raw = run_layers(segment.layers, carry_of(inputs))
        segment.tuple_out = isinstance(raw, (tuple, list))
        out = as_tuple(raw)
        ctx.mark_non_differentiable(*[t for t in out if not t.is_floating_point()])
        return out

    @staticmethod
    def backward(ctx, *grads):
        segment = ctx.segment
        saved = ctx.inputs if segment.stage_input else ctx.saved_tensors
        inputs = tuple(t.detach().requires_grad_(need) for t, need in zip(saved, ctx.grad_mask))
        device_type, enabled, dtype = ctx.autocast
        with torch.random.fork_rng(devices=ctx.devices):
            torch.set_rng_state(ctx.rng)
            for d, state in zip(ctx.devices, ctx.cuda_rng):
                torch.cuda.set_rng_state(state, d)
            with torch.enable_grad(), torch.autocast(device_type, dtype=dtype, enabled=enabled):
                out = as_tuple(run_layers(segment.layers, carry_of(inputs)))
        pairs = [(o, g) for o, g in zip(out, grads) if o.requires_grad and g is not None]
        wanted = [t for t in inputs if t.requires_grad] + list(segment.params)
        got = (
            torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
            if pairs and wanted
            else [None] * len(wanted)
        )
        got = iter(got)
        input_grads = [next(got) if t.requires_grad else None for t in inputs]
        return (None, None, *input_grads, *got)
