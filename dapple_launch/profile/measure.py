"""Measured profile: run each layer of the real module forward and backward on this device.

Times are the median of a few repetitions after a warm-up, at the profile batch and at four times
it, which separates each layer's fixed cost per call from the part that grows with the samples;
output and saved-for-backward bytes are counted exactly. The repetitions run as passes over every
layer, apart in time, until two passes agree on each layer (settled_times). Results are cached on disk keyed by the model's description, the batch size
and the device, so a second plan of the same model costs nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import statistics
import time
from collections.abc import Callable

import torch

from ..cache import cache_dir, read_cached, write_cached
from ..models.contract import PipelineModel, as_tuple, build_layer, call_layer, carry_of
from ..models.split_backward import backward_input
from .analytic import MIXED, autocast, backward_roots, nbytes, per_call, wire_bytes
from .live_bytes import LiveBytes
from .model_profile import LayerProfile, ModelProfile, chain


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).replace(" ", "-")
    return f"cpu-{torch.get_num_threads()}t"


def cache_key(model: PipelineModel, batch_size: int, device: str, precision: str = "32") -> str:
    # "fit": profiles from before the per-call fit (times only) are not read back as if they had it;
    # "saved": from before parameters were left out of the saved bytes; "passes": from before the
    # passes apart in time (one pass kept a busy machine's slowdown); "workspace": from before the
    # loss was timed with the last layer and each layer's transient bytes were counted
    from ..models import identity

    ident = json.dumps(
        {
            "model": identity(model),
            "batch": batch_size,
            "device": device,
            "fit": "per-call",
            "precision": precision,
            "saved": "no-parameters, fixed part",
            "split": "I and W",
            "slices": "context shares",
            "passes": "until two agree",
            "workspace": "live bytes, loss on the last layer",
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


def built_on(dev: torch.device, spec, index: int, seed: int) -> torch.nn.Module:
    """Layer `index` made on `dev` directly: a layer's initialisation on the CPU (one thread, in
    this job) took most of a GPU profile's time (GPT xl: over two minutes for 50 layers timed in
    four passes, the GPU idle); a timing needs the shapes, not the CPU's values."""
    with torch.device(dev):
        return build_layer(spec, index, seed)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_layers(
    model: PipelineModel, batch_size: int, dev: torch.device, repeats: int, seed: int, precision: str = "32"
) -> list[tuple]:
    """Per layer: (name, forward s, backward s, output bytes, parameter bytes, saved bytes, W s,
    workspace bytes) on one batch; W s: the weight gradients' part of a split backward
    (models/split_backward.py), timed on a second forward of the same repetition. The last layer's
    figures include the loss, as its stage runs it (and as the analytic trace counts it); its bytes
    are counted exactly on the untimed first repetition (profile/live_bytes.py): the workspace is
    the most the forward and backward hold at once beyond the storages they save (the weights'
    gradients stay in it: a later micro-batch's backward holds a new gradient beside their sum)."""
    x, target = model.batch(batch_size, torch.Generator().manual_seed(seed), device=dev)
    x, target = as_tuple(x), as_tuple(target)
    out = []
    specs = model.layers()
    for i, spec in enumerate(specs):
        last = i == len(specs) - 1
        layer = built_on(dev, spec, i, seed)
        params = sum(nbytes(p) for p in layer.parameters())
        owned = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        fwd, bwd, wgt = [], [], []
        workspace = 0.0
        for rep in range(repeats + 1):
            x_in = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in x)
            saved, held = [], {}

            def pack(t):
                key = t.untyped_storage().data_ptr()
                if key not in owned:  # a weight is counted once, as a weight
                    saved.append(nbytes(t))
                    # the memory behind the saves: a storage two operators save (the loss's log-softmax) once
                    held[key] = t.untyped_storage().nbytes()
                return t

            live = LiveBytes() if rep == 0 else None  # (a dispatch mode slows the timing: the untimed first only)
            with live or contextlib.nullcontext():
                _sync(dev)
                t0 = time.perf_counter()
                with autocast(dev.type, precision), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    y = call_layer(layer, carry_of(x_in))
                    out_bytes = float(wire_bytes(y, MIXED.get(precision)))
                    if last:  # the loss runs on the last stage inside the same forward (the logits die in it)
                        y = model.loss(y, carry_of(target)).sum()
                _sync(dev)
                t1 = time.perf_counter()
                roots, ones = backward_roots(y)
                if roots:
                    torch.autograd.backward(roots, ones)
                _sync(dev)
                t2 = time.perf_counter()
            if live is not None:  # (the layer is fresh: its weights' gradients are made here, inside the count)
                workspace = max(0.0, float(live.peak - sum(held.values())))
            # the same backward split: I to the layer's inputs, then W from where the weights join
            with autocast(dev.type, precision):
                y2 = call_layer(layer, carry_of(x_in))
            roots2, ones2 = backward_roots(y2)
            _sync(dev)
            t3 = t4 = t5 = time.perf_counter()
            if roots2:
                _, weights = backward_input(
                    roots2, ones2, [t for t in x_in if t.requires_grad], list(layer.parameters())
                )
                _sync(dev)
                t4 = time.perf_counter()
                weights.run()
                _sync(dev)
                t5 = time.perf_counter()
            if rep:  # the first run warms up kernels and allocator
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
                if t5 > t3:  # W's share of this split backward (a ratio within one run: robust to noise)
                    wgt.append((t5 - t4) / (t5 - t3))
        b = statistics.median(bwd)
        out.append(
            (
                spec.name,
                statistics.median(fwd),
                b,
                out_bytes,
                float(params),
                float(sum(saved)),
                b * statistics.median(wgt) if wgt else 0.0,
                workspace,
            )
        )
        x = tuple(t.detach() for t in as_tuple(y))
    return out


def _slice_shares(
    model: PipelineModel,
    batch_size: int,
    dev: torch.device,
    repeats: int,
    seed: int,
    precision: str,
    profiled: list[LayerProfile],
) -> list[tuple[float, float, float]]:
    """Per layer of a sliceable model, the shares schedule/terapipe.py scales a slice by, measured:
    the layer timed (forward and backward) and its saved bytes counted on the sequence's second half
    after its first (a token slice with the first half cached) against the whole sequence. Compute:
    the second half costs 1/2 + a/4 of the whole's variable part (per-call fixed parts aside), so
    a = 4 r - 2; saved bytes as profile/analytic.py fits them (first half alone, second after it)."""
    from ..models.token_slices import KVCache, TokenSlice, running

    x, _ = model.batch(batch_size, torch.Generator().manual_seed(seed), device=dev)
    x = as_tuple(x)
    L = x[0].shape[1]
    half = L // 2
    out = []

    def run(layer, owned, carry, piece, cache_from=None):
        saved = []

        def pack(t):
            if t.untyped_storage().data_ptr() not in owned:
                saved.append(nbytes(t))
            return t

        times = []
        for rep in range(repeats + 1):
            cache = KVCache()
            if cache_from is not None:  # the first half runs first, untimed, to fill the cache
                with running(TokenSlice(0, 0, half, cache)), autocast(dev.type, precision):
                    call_layer(layer, *[tuple(t.detach() for t in cache_from)])
            x_in = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in carry)
            saved.clear()
            _sync(dev)
            t0 = time.perf_counter()
            with (
                running(piece(cache)),
                autocast(dev.type, precision),
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            ):
                y = call_layer(layer, carry_of(x_in))
            roots, ones = backward_roots(y)
            if roots:
                torch.autograd.backward(roots, ones)
            _sync(dev)
            if rep:
                times.append(time.perf_counter() - t0)
        return times, float(sum(saved))

    for i, (spec, prof) in enumerate(zip(model.layers(), profiled)):
        layer = built_on(dev, spec, i, seed)
        owned = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        first = tuple(t[:, :half] for t in x)
        second = tuple(t[:, half:] for t in x)
        _, head_m = run(layer, owned, first, lambda c: TokenSlice(0, 0, half, c))
        fixed = prof.forward_fixed_s + prof.backward_fixed_s
        ratios = []
        for _ in range(3):  # whole and second half in turns: a shared machine's drift cancels in each ratio
            whole_t, whole_m = run(layer, owned, x, lambda c: None)
            tail_t, tail_m = run(layer, owned, second, lambda c: TokenSlice(1, half, L, c), cache_from=first)
            w, t = statistics.median(whole_t), statistics.median(tail_t)
            ratios.append((t - fixed) / (w - fixed) if w > fixed else 0.5)
        r = statistics.median(ratios)
        r2, r3 = (head_m / whole_m, tail_m / whole_m) if whole_m else (0.5, 0.5)
        clamp = lambda v: min(max(v, 0.0), 1.0)
        out.append((clamp(4 * r - 2), clamp(2 * r3 - 1), clamp(2 - 4 * r2)))
        with torch.no_grad(), autocast(dev.type, precision):
            y = call_layer(layer, carry_of(x))
        x = tuple(t.detach() for t in as_tuple(y))
    return out


# A busy shared machine slows every repetition of the layers a pass times while the other work runs,
# so a median within one pass keeps the slowdown (one fresh profile put a stage's forward at 5.3 ms,
# 2.2 ms before and after). Passes apart in time do not share it: a layer is settled once two passes
# agree on its forward and its backward, and its times are the median over the passes.
AGREE = 0.2  # relative difference within which two passes agree
FLOOR_S = 50e-6  # absolute difference below which they agree (timer and call jitter on small layers)
MAX_PASSES = 4


def _agree(values: list[float]) -> bool:
    v = sorted(values)
    return any(hi - lo <= max(FLOOR_S, AGREE * hi) for lo, hi in zip(v, v[1:]))


def unsettled(passes: list[list[tuple]]) -> list[int]:
    """The layers on whose forward or backward time no two passes agree."""
    return [i for i in range(len(passes[0])) if not all(_agree([p[i][k] for p in passes]) for k in (1, 2))]


def combine_passes(passes: list[list[tuple]]) -> list[tuple]:
    """Per layer the median over passes of each time (the bytes are counted, alike in every pass)."""
    out = []
    for rows in zip(*passes):
        f, b, w = (statistics.median(r[k] for r in rows) for k in (1, 2, 6))
        out.append((*rows[0][:1], f, b, *rows[0][3:6], min(w, b), *rows[0][7:]))
    return out


def settled_times(run_pass: Callable[[], list[tuple]], max_passes: int = MAX_PASSES) -> tuple[list[tuple], list[int]]:
    """(per-layer times combined over passes, the layers still unsettled after `max_passes`)."""
    passes = [run_pass(), run_pass()]
    while len(passes) < max_passes and unsettled(passes):
        passes.append(run_pass())
    return combine_passes(passes), unsettled(passes)


def measure_profile(
    model: PipelineModel,
    batch_size: int,
    device: str | torch.device = "cpu",
    repeats: int = 5,
    use_cache: bool = True,
    seed: int = 0,
    precision: str = "32",
) -> ModelProfile:
    """Each layer timed at `batch_size` and at 4 × `batch_size`: the times at `batch_size` are the
    profile's, and the two together give each layer's fixed cost per call (Python, kernel
    launches), which small batches are made of and which does not scale with the samples."""
    dev = torch.device(device)
    name = device_name(dev)
    path = cache_dir() / f"{model.name}-b{batch_size}-{name}-{cache_key(model, batch_size, name, precision)}.json"
    cached = read_cached(path, ModelProfile.from_json) if use_cache else None
    if cached is not None:
        return cached
    small, large = batch_size, 4 * batch_size
    at_small, noisy = settled_times(lambda: _time_layers(model, small, dev, repeats, seed, precision))
    at_large, noisy_large = settled_times(lambda: _time_layers(model, large, dev, repeats, seed, precision))
    noisy = sorted({*noisy, *noisy_large})
    if noisy:
        from ..log import get_logger

        get_logger().warning(
            f"measured profile of {model.name} on {name}: no two of {MAX_PASSES} passes agreed within {AGREE:.0%} "
            f"on layers {noisy} (a busy machine?); their times are the median over the passes and an estimate "
            f"from them may be off as much; for a closer one, measure again on a quieter machine "
            f"(delete {cache_dir()})"
        )
    layers = [
        LayerProfile(
            name_,
            f,
            b,
            out,
            params,
            saved_bytes=saved,
            forward_fixed_s=per_call(f, f4, small, large),
            backward_fixed_s=per_call(b, b4, small, large),
            saved_fixed_bytes=per_call(saved, saved4, small, large),
            weight_grad_s=w,
            workspace_bytes=ws,
            workspace_fixed_bytes=per_call(ws, ws4, small, large),
        )
        for (name_, f, b, out, params, saved, w, ws), (_, f4, b4, _o, _p, saved4, _w, ws4) in zip(at_small, at_large)
    ]
    from ..models.token_slices import supports_slicing

    if supports_slicing(model):  # how a token slice's cost grows with its context: timed and counted here
        from dataclasses import replace

        layers = [
            replace(x, slice_compute=c, slice_memory_kv=kv, slice_memory_att=att)
            for x, (c, kv, att) in zip(layers, _slice_shares(model, batch_size, dev, repeats, seed, precision, layers))
        ]
    profile = chain(model.name, layers, batch_size, source=f"measured:{name}", device=name, precision=precision)
    if use_cache:
        write_cached(path, profile.to_json())
    return profile
