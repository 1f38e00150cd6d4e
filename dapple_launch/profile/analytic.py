"""Analytic profile: FLOPs, bytes and saved activations per layer, from the model's shapes.

Each layer is built and run forward and backward on the meta device, or for a mixed-precision
run on fake tensors under autocast (shapes and dtypes, no memory, no compute), under torch's FLOP
counter, so dtypes are the ones the run will have; saved-for-backward tensors are counted exactly with
autograd's saved-tensor hooks (parameters themselves excluded: they are counted once, as weights;
their half-precision copies are activations of the micro-batch that made them). Times = FLOPs /
(device TFLOPS × efficiency), so `model=bert cluster=v100x16` plans on a laptop.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..models.contract import PipelineModel, as_tuple, call_layer, carry_of
from .live_bytes import LiveBytes
from .model_profile import LayerProfile, ModelProfile, chain

MIXED = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def wire_bytes(carry, compute_dtype: torch.dtype | None) -> int:
    """Bytes one carry moves between stages: floating members in the compute dtype (mixed
    precision sends them so), others as they are."""
    total = 0
    for t in as_tuple(carry):
        if compute_dtype is not None and t.is_floating_point() and t.element_size() > compute_dtype.itemsize:
            total += t.numel() * compute_dtype.itemsize
        else:
            total += nbytes(t)
    return total


def backward_roots(carry) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The members a backward starts from (floating, attached to the graph) and unit gradients."""
    roots = [t for t in as_tuple(carry) if t.is_floating_point() and t.requires_grad]
    return roots, [torch.ones_like(t) for t in roots]


def autocast(device_type: str, precision: str):
    import contextlib

    if precision in MIXED:
        return torch.autocast(device_type, dtype=MIXED[precision])
    return contextlib.nullcontext()


def trace_layers(model: PipelineModel, batch_size: int, precision: str = "32", alike: bool = True):
    """Yield (name, fwd flops, bwd flops, out bytes, saved bytes, param bytes, workspace bytes) per
    layer (workspace: the most the call holds at once beyond the storages it saves, counted by
    profile/live_bytes.py; its weights' gradients stay in it, as a later micro-batch's backward holds
    a new gradient beside their sum), traced on
    fake CPU tensors (shapes and dtypes, no memory): operators dispatch as on a real device, so what
    they save is what a real run saves (on the meta device, attention falls back to a kernel that
    keeps its whole score matrix: fp32 transformer blocks came out 25-40 % high), and autocast
    applies. The last layer's figures include the loss, whose saved tensors (the log-softmax over the
    vocabulary) its stage keeps with every micro-batch in flight. `alike`: a layer like one traced
    before takes its figures (below); False traces every layer."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        FakeTensorMode,
    )

    real, target = model.batch(batch_size, torch.Generator().manual_seed(0))  # real: a batch may read its values
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    compute = MIXED.get(precision)
    specs = model.layers()
    # layers alike (class, parameter shapes, input shapes and dtypes: a transformer's blocks) have
    # alike figures, so each kind is traced once and the rest only run forward to carry their output
    # on (GPT large's 36 blocks: most of a dry run's profile time), as trace_slice_shares does
    seen: dict = {}
    with mode:
        x = tuple(mode.from_tensor(t) for t in as_tuple(real))
        target = tuple(mode.from_tensor(t) for t in as_tuple(target))
        for index, spec in enumerate(specs):
            layer = spec.build()
            last = index == len(specs) - 1
            key = (
                type(layer).__qualname__,
                tuple((n, tuple(p.shape), p.dtype) for n, p in layer.named_parameters()),
                tuple((tuple(t.shape), t.dtype) for t in x),
                last,
            )
            if alike and key in seen:
                yield (spec.name, *seen[key])
                with torch.no_grad(), autocast("cpu", precision):
                    y = call_layer(layer, carry_of(x))
                x = tuple(t.detach() for t in as_tuple(y))
                continue
            params = sum(nbytes(p) for p in layer.parameters())
            owned = {id(p) for p in layer.parameters()}
            x_in = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in x)
            saved, held = [], {}

            def pack(t):
                if id(t) not in owned and (t._base is None or id(t._base) not in owned):
                    saved.append(nbytes(t))
                    # the memory behind the saves: a storage two operators save (the loss's log-softmax) once
                    held[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
                return t

            counter = FlopCounterMode(display=False)
            with LiveBytes() as live:
                with counter, autocast("cpu", precision), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    try:
                        y = call_layer(layer, carry_of(x_in))
                    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
                        raise ValueError(
                            f"the analytic profile traces shapes only, and layer {index} ({spec.name}, "
                            f"{type(layer).__name__}) computes by its values ({exc.func}: a mixture of experts "
                            f"routes each token by value); set strategy.profile_source=measured to time the "
                            f"layers on real tensors"
                        ) from None
                    out_bytes = wire_bytes(y, compute)
                    if last:  # the loss runs on the last stage inside the same forward (the logits die in it)
                        y = model.loss(y, carry_of(target)).sum()
                fwd = counter.get_total_flops()
                roots, ones = backward_roots(y)
                counter = FlopCounterMode(display=False)
                with counter:
                    if roots:
                        torch.autograd.backward(roots, ones)
            bwd = counter.get_total_flops()
            workspace = max(0.0, float(live.peak - sum(held.values())))
            seen[key] = (fwd, bwd, out_bytes, sum(saved), params, workspace)
            yield spec.name, fwd, bwd, out_bytes, sum(saved), params, workspace
            x = tuple(t.detach() for t in as_tuple(y))


def _trace_call(layer, x, owned: set, precision: str) -> tuple[float, float]:
    """(forward + backward flops, saved bytes) of one call on carry x."""
    saved = []

    def pack(t):
        if id(t) not in owned and (t._base is None or id(t._base) not in owned):
            saved.append(nbytes(t))
        return t

    x_in = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in x)
    counter = FlopCounterMode(display=False)
    with counter, autocast("cpu", precision), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = call_layer(layer, carry_of(x_in))
        roots, ones = backward_roots(y)
        if roots:
            torch.autograd.backward(roots, ones, retain_graph=True)
    return float(counter.get_total_flops()), float(sum(saved))


def trace_slice_shares(
    model: PipelineModel, batch_size: int, precision: str = "32"
) -> list[tuple[float, float, float]]:
    """Per layer of a model that supports token slicing (models/token_slices.py), how its cost grows
    with a slice's context: (compute share that is causal attention, l·(2c + l)/L² of it per slice; saved-bytes share that grows
    with c + l (the keys and values attended to), saved-bytes share that grows with l·(c + l)), all
    fractions of the whole sequence's (schedule/terapipe.py). Fitted exactly from three traced
    calls per layer on the meta device: the whole sequence (L, 0), its first half (L/2, 0) and its
    second half after the first (L/2, L/2)."""
    from ..models.token_slices import KVCache, TokenSlice, running

    real, _ = model.batch(batch_size, torch.Generator().manual_seed(0))
    x = tuple(t.to("meta") for t in as_tuple(real))
    L = x[0].shape[1]
    half = L // 2
    out = []
    seen: dict = {}  # layers alike (class, parameter shapes, input shapes) share their shares: one trace
    for spec in model.layers():
        with torch.device("meta"):
            layer = spec.build()
        key = (
            type(layer).__qualname__,
            tuple((n, tuple(p.shape)) for n, p in layer.named_parameters()),
            tuple((tuple(t.shape), t.dtype) for t in x),
        )
        if key in seen:
            out.append(seen[key])
            with torch.no_grad():
                y = call_layer(layer, carry_of(x))
            x = tuple(t.detach() for t in as_tuple(y))
            continue
        owned = {id(p) for p in layer.parameters()}
        whole_f, whole_m = _trace_call(layer, x, owned, precision)
        first = tuple(t[:, :half] for t in x)
        second = tuple(t[:, half:] for t in x)
        cache = KVCache()
        with running(TokenSlice(0, 0, half, cache)):
            head_f, head_m = _trace_call(layer, first, owned, precision)
        with running(TokenSlice(1, half, L, cache)):
            _, tail_m = _trace_call(layer, second, owned, precision)
        r = head_f / whole_f if whole_f else 0.5
        r2, r3 = (head_m / whole_m, tail_m / whole_m) if whole_m else (0.5, 0.5)
        clamp = lambda v: min(max(v, 0.0), 1.0)
        out.append((clamp(2 - 4 * r), clamp(2 * r3 - 1), clamp(2 - 4 * r2)))
        seen[key] = out[-1]
        with torch.no_grad():
            y = call_layer(layer, carry_of(x))
        x = tuple(t.detach() for t in as_tuple(y))
    return out


def per_call(small_s: float, large_s: float, small_n: int, large_n: int) -> float:
    """The part of a call's cost (seconds, or bytes) that does not grow with its samples: the
    intercept of the line through (small_n, small_s) and (large_n, large_s), kept within [0, small_s].
    The analytic trace and the measurement both fit their fixed parts with it."""
    slope = max(0.0, (large_s - small_s) / (large_n - small_n))
    return min(small_s, max(0.0, small_s - slope * small_n))


def analytic_profile(
    model: PipelineModel,
    batch_size: int,
    device_tflops: float,
    device: str,
    efficiency: float = 0.4,
    precision: str = "32",
) -> ModelProfile:
    """`device_tflops`: the device's speed at the run's precision."""
    if device_tflops <= 0:
        raise ValueError(f"analytic profile needs the device speed: device_tflops={device_tflops} must be > 0")
    rate = device_tflops * 1e12 * efficiency
    layers = []
    # Traced at two batch sizes: what each call saves whatever its samples (half-precision weight
    # copies under autocast) is the intercept of the saved bytes' line through both.
    twice = [(saved, ws) for *_, saved, _, ws in trace_layers(model, 2 * batch_size, precision)]
    for (name, fwd, bwd, out, saved, params, ws), (saved2, ws2) in zip(
        trace_layers(model, batch_size, precision), twice
    ):
        layers.append(
            LayerProfile(
                name,
                fwd / rate,
                bwd / rate,
                float(out),
                float(params),
                saved_bytes=float(saved),
                saved_fixed_bytes=per_call(float(saved), saved2, batch_size, 2 * batch_size),
                workspace_bytes=ws,
                workspace_fixed_bytes=per_call(ws, ws2, batch_size, 2 * batch_size),
            )
        )
    from ..models.token_slices import supports_slicing

    if supports_slicing(model):  # shares are ratios: traced in fp32 on the meta device at any precision
        from dataclasses import replace

        layers = [
            replace(layer, slice_compute=c, slice_memory_kv=kv, slice_memory_att=att)
            for layer, (c, kv, att) in zip(layers, trace_slice_shares(model, batch_size))
        ]
    return chain(
        model.name,
        layers,
        batch_size,
        source="analytic",
        device=device,
        device_tflops=device_tflops,
        precision=precision,
    )
