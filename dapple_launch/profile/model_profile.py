"""ModelProfile: plain per-layer data the planner reads. Knows nothing of torch.distributed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from itertools import accumulate


def kept_of(fixed, saved, received, samples, batch_size):
    """What one micro-batch of `samples` keeps until its backward: `fixed`, each call's part of the
    layers' saves whatever its batch, and the rest of `saved` and the `received` input, both given
    at `batch_size`, scaled to the samples. The one formula, in one order of operations, that the
    simulator's memory (ModelProfile.kept_bytes) and the planner's bounds (floats or numpy arrays of
    spans) compute, so that a bound's memory test agrees with the plan's to the last bit."""
    return fixed + (saved - fixed + received) * samples / batch_size


@dataclass(frozen=True)
class LayerProfile:
    name: str  # the id plans show (a profile file's node id, or the model's layer name)
    forward_s: float  # one batch of the profile batch size
    backward_s: float
    activation_bytes: float  # output activation at the profile batch size
    parameter_bytes: float  # fp32 parameters
    inputs: tuple[int, ...] = ()  # positions of the layers feeding this one (a chain: the previous)
    description: str = ""
    saved_bytes: float | None = None  # tensors kept for backward, when known; else ≈ activation_bytes
    # The part of forward_s / backward_s that a call costs whatever its batch (kernel launches,
    # Python): a layer on n samples takes fixed + (time - fixed) × n / profile batch. Measured
    # profiles fit it from two batch sizes; profile files and analytic estimates scale linearly (0).
    forward_fixed_s: float = 0.0
    backward_fixed_s: float = 0.0
    # The part of saved_bytes that a call keeps whatever its batch: under mixed precision, the
    # half-precision copies of the weights each micro-batch's forward makes and its backward reads.
    saved_fixed_bytes: float = 0.0
    # Of backward_s, the weight gradients' part when the backward is split (zero-bubble schedules:
    # I then W), as measured (profile/measure.py); None: not measured, the cost model's rule applies.
    weight_grad_s: float | None = None
    # Token slicing (schedule/terapipe.py), for a causal model that supports it: of the whole sequence's
    # time, the share that is causal attention (a slice of l tokens after c costs l·(2c + l)/L² of it); of its
    # saved bytes, the share that grows with c + l (the keys and values attended to) and with l·(c + l)
    slice_compute: float = 0.0
    slice_memory_kv: float = 0.0
    slice_memory_att: float = 0.0
    # The most a call holds at once beyond the storages it saves (at the profile batch; the part any
    # batch holds, as for saved_bytes): its weights' gradients, gradients in flight, the loss's
    # log-softmax and its gradient on the last layer. Its stage holds it during one layer's backward
    # on top of every micro-batch in flight (ModelProfile.workspace). Measured and analytic profiles
    # count it exactly (profile/live_bytes.py); profile files do not state it (0).
    workspace_bytes: float = 0.0
    workspace_fixed_bytes: float = 0.0

    @property
    def memory_bytes(self) -> float:
        """What one batch of this layer keeps alive until its backward."""
        return self.activation_bytes if self.saved_bytes is None else max(self.saved_bytes, self.activation_bytes)


@dataclass(frozen=True)
class ModelProfile:
    name: str
    layers: tuple[LayerProfile, ...]
    batch_size: int  # the profile batch size the times and activations are stated at
    source: str = ""  # "file:...", "analytic", "measured:<device>"
    device: str = ""  # the device the times hold for
    device_tflops: float | None = None  # that device's speed, to rescale to another device
    meta: dict = field(default_factory=dict, compare=False)
    precision: str = "32"  # what the times and bytes were taken at: 32, bf16-mixed or 16-mixed
    # weights that several layers share (models.contract tied_parameters): per group, the layer
    # positions holding a copy and the weight's bytes. Stages that hold copies all-reduce its gradient.
    tied: tuple[tuple[tuple[int, ...], float], ...] = ()

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError(f"profile {self.name!r} has no layers")
        if self.batch_size < 1:
            raise ValueError(f"profile {self.name!r}: profile batch size must be >= 1, got {self.batch_size}")
        if not sum(x.forward_s + x.backward_s for x in self.layers) > 0:
            # the planner balances stages by time and states its plans as shares of the total
            raise ValueError(
                f"profile {self.name!r}: all {len(self.layers)} layers have forward and backward time 0; "
                f"give each layer its measured time (forward_compute_time, backward_compute_time)"
            )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @cached_property
    def cut_bytes(self) -> tuple[float, ...]:
        """cut_bytes[i]: bytes crossing the cut between positions i and i+1 (per profile batch):
        every activation of a layer <= i that feeds a layer > i, each counted once."""
        last_use = [-1] * self.num_layers
        for j, layer in enumerate(self.layers):
            for p in layer.inputs:
                last_use[p] = max(last_use[p], j)
        out = []
        live = 0.0
        starts: dict[int, list[int]] = {}
        for i in range(self.num_layers):
            # layer i's output is live across cuts i .. last_use[i]-1
            if last_use[i] > i:
                live += self.layers[i].activation_bytes
                starts.setdefault(last_use[i], []).append(i)
            for p in starts.pop(i, []):
                live -= self.layers[p].activation_bytes
            out.append(live)
        return tuple(out[:-1])

    @cached_property
    def _prefix(self) -> dict[str, tuple[float, ...]]:
        def pre(xs):
            return (0.0, *accumulate(xs))

        return {
            "f": pre(layer.forward_s for layer in self.layers),
            "b": pre(layer.backward_s for layer in self.layers),
            "a": pre(layer.activation_bytes for layer in self.layers),
            "p": pre(layer.parameter_bytes for layer in self.layers),
            "m": pre(layer.memory_bytes for layer in self.layers),
            "mf": pre(min(layer.saved_fixed_bytes, layer.memory_bytes) for layer in self.layers),
            "ff": pre(layer.forward_fixed_s for layer in self.layers),
            "bf": pre(layer.backward_fixed_s for layer in self.layers),
        }

    @cached_property
    def _workspace_tables(self) -> tuple[list[list[float]], list[list[float]]]:
        """Sparse tables of the layers' fixed workspace and workspace per sample: range maxima in O(1)."""
        fixed = [min(x.workspace_fixed_bytes, x.workspace_bytes) for x in self.layers]
        slope = [(x.workspace_bytes - f) / self.batch_size for x, f in zip(self.layers, fixed)]
        tables = []
        for row in (fixed, slope):
            table = [row]
            k = 1
            while 2 * k <= len(row):
                prev = table[-1]
                table.append([max(prev[i], prev[i + k]) for i in range(len(row) - 2 * k + 1)])
                k *= 2
            tables.append(table)
        return tables[0], tables[1]

    def workspace(self, start: int, stop: int, samples: float) -> float:
        """The most one layer of [start, stop) holds beyond its saves during a call on `samples`
        samples, at most: the largest fixed part plus the largest part per sample (two range
        maxima; they may come from different layers, so this never falls short)."""
        if stop <= start:
            return 0.0
        k = (stop - start).bit_length() - 1
        fixed, slope = self._workspace_tables
        top = [max(t[k][start], t[k][stop - (1 << k)]) for t in (fixed, slope)]
        return top[0] + top[1] * samples

    def span(self, start: int, stop: int) -> tuple[float, float, float, float]:
        """(forward s, backward s, bytes kept for backward, parameter bytes) of layers [start, stop)."""
        p = self._prefix
        return (
            p["f"][stop] - p["f"][start],
            p["b"][stop] - p["b"][start],
            p["m"][stop] - p["m"][start],
            p["p"][stop] - p["p"][start],
        )

    def kept_bytes(self, start: int, stop: int, samples: float) -> float:
        """Bytes one micro-batch of `samples` keeps on layers [start, stop) until its backward: what
        the layers save (the part that scales with the samples, and each call's fixed part) and
        the input the stage received."""
        p = self._prefix
        received = self.cut_bytes[start - 1] if start > 0 else 0.0
        return kept_of(p["mf"][stop] - p["mf"][start], p["m"][stop] - p["m"][start], received, samples, self.batch_size)

    def layer_bytes(self, i: int, samples: float) -> float:
        """What layer i saves for backward on `samples` samples (its fixed part once)."""
        layer = self.layers[i]
        fixed = min(layer.saved_fixed_bytes, layer.memory_bytes)
        return fixed + (layer.memory_bytes - fixed) * samples / self.batch_size

    def recompute_bytes(self, start: int, stop: int, recomputed, samples: float) -> tuple[float, float]:
        """(kept, extra) for one micro-batch of `samples` on layers [start, stop) when the layers at
        positions `recomputed` keep nothing but each segment's input (runtime/recompute.py):
        kept = kept_bytes with the recomputed layers' saves replaced by the inputs of the segments
        that start inside the stage (a segment at the stage's start reuses the received input);
        extra = the most the micro-batch holds above `kept` during its backward: segments are
        recomputed last to first, each when the layers after it have freed theirs, alongside the
        saves of the layers before it and the kept inputs of the segments up to it."""
        marks = sorted(i for i in set(recomputed) if start <= i < stop)
        received = self.cut_bytes[start - 1] * samples / self.batch_size if start > 0 else 0.0
        if not marks:
            return self.kept_bytes(start, stop, samples), 0.0
        runs: list[list[int]] = []
        for i in marks:
            if runs and runs[-1][1] == i:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1])
        mark = set(marks)
        kept = received + sum(self.layer_bytes(i, samples) for i in range(start, stop) if i not in mark)
        inputs = [self.cut_bytes[a - 1] * samples / self.batch_size if a > start else 0.0 for a, _ in runs]
        kept += sum(inputs)
        peak, before, held = kept, received, 0.0
        i = start
        for (a, z), inp in zip(runs, inputs):
            before += sum(self.layer_bytes(j, samples) for j in range(i, a))
            held += inp
            peak = max(peak, before + held + sum(self.layer_bytes(j, samples) for j in range(a, z)))
            i = z
        return kept, peak - kept

    def bytes_between(self, start: int, stop: int, samples: float) -> float:
        """Σ layer_bytes over [start, stop), from prefix sums."""
        p = self._prefix
        return kept_of(p["mf"][stop] - p["mf"][start], p["m"][stop] - p["m"][start], 0.0, samples, self.batch_size)

    def first_layers_recomputed(self, start: int, stop: int, k: int, samples: float) -> tuple[float, float, float]:
        """recompute_bytes and recompute_seconds for the stage's first k layers, in O(1): the
        planner's choice (recompute=auto). One segment at the stage's start keeps no input of its
        own, so kept = received + the rest's saves and extra = max(0, the segment's saves - the rest's)."""
        received = self.cut_bytes[start - 1] * samples / self.batch_size if start > 0 else 0.0
        head = self.bytes_between(start, start + k, samples)
        tail = self.bytes_between(start + k, stop, samples)
        return received + tail, max(0.0, head - tail), self.seconds(start, start + k, samples)[0]

    def recompute_seconds(self, start: int, stop: int, recomputed, samples: float) -> float:
        """The forward the backward runs again: of the recomputed layers among [start, stop)."""
        return sum(self.seconds(i, i + 1, samples)[0] for i in set(recomputed) if start <= i < stop)

    def seconds(self, start: int, stop: int, samples: float) -> tuple[float, float]:
        """(forward, backward) seconds of layers [start, stop) on `samples` samples: each layer's
        fixed part once, the rest in proportion to the samples."""
        p, n = self._prefix, samples / self.batch_size
        ff, bf = p["ff"][stop] - p["ff"][start], p["bf"][stop] - p["bf"][start]
        f, b = p["f"][stop] - p["f"][start], p["b"][stop] - p["b"][start]
        return ff + (f - ff) * n, bf + (b - bf) * n

    def layer_seconds(self, samples: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Each layer's (forward, backward) seconds on `samples` samples: seconds(l, l + 1, samples)
        layer by layer, the fixed part and the rest taken from the prefix sums as the bounds' tables
        take them (the same floats wherever a bound reads a layer alone)."""
        p, pbs = self._prefix, self.batch_size

        def each(fixed: tuple[float, ...], total: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(
                (fixed[l + 1] - fixed[l]) + (total[l + 1] - total[l] - (fixed[l + 1] - fixed[l])) * samples / pbs
                for l in range(self.num_layers)
            )

        return each(p["ff"], p["f"]), each(p["bf"], p["b"])

    def weight_share(self, start: int, stop: int) -> float | None:
        """W's share of the backward of layers [start, stop) when every one was measured split, else None."""
        layers = self.layers[start:stop]
        if any(x.weight_grad_s is None for x in layers):
            return None
        total = sum(x.backward_s for x in layers)
        return min(1.0, sum(x.weight_grad_s or 0.0 for x in layers) / total) if total > 0 else None

    def least_input_share(self) -> float:
        """The least share of any stage's backward its input gradient (a split backward's I) takes:
        1 less the largest measured W share of a layer, and a half (the simulator's rule) where some
        layer's W was not measured (a stage holding it splits its backward in halves)."""
        shares = [
            x.weight_grad_s / x.backward_s for x in self.layers if x.backward_s > 0 and x.weight_grad_s is not None
        ]
        if any(x.weight_grad_s is None for x in self.layers):
            shares.append(0.5)
        return 1.0 - min(1.0, max(shares, default=1.0))

    def slice_shares(self, start: int, stop: int) -> tuple[float, float, float]:
        """Layers [start, stop)'s token-slicing shares (LayerProfile.slice_*): compute weighted by
        each layer's time, memory by its saved bytes."""
        layers = self.layers[start:stop]
        time = sum(x.forward_s + x.backward_s for x in layers)
        kept = sum(x.memory_bytes for x in layers)
        c = sum((x.forward_s + x.backward_s) * x.slice_compute for x in layers) / time if time > 0 else 0.0
        kv = sum(x.memory_bytes * x.slice_memory_kv for x in layers) / kept if kept > 0 else 0.0
        att = sum(x.memory_bytes * x.slice_memory_att for x in layers) / kept if kept > 0 else 0.0
        return c, kv, att

    @property
    def slices_tokens(self) -> bool:
        """Whether any layer's cost grows with a token slice's context (a sliceable causal model)."""
        return any(x.slice_compute > 0 for x in self.layers)

    @property
    def parameter_bytes(self) -> float:
        return self._prefix["p"][-1]

    def to_json(self) -> str:
        d = asdict(self)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> ModelProfile:
        d = json.loads(text)
        d["layers"] = tuple(LayerProfile(**{**x, "inputs": tuple(x["inputs"])}) for x in d["layers"])
        d["tied"] = tuple((tuple(layers), float(nbytes)) for layers, nbytes in d.get("tied", ()))
        return cls(**d)


def chain(name: str, layers: list[LayerProfile], batch_size: int, **kw) -> ModelProfile:
    """A profile whose layers form a chain: each layer feeds the next."""
    linked = tuple(LayerProfile(**{**asdict(layer), "inputs": (i - 1,) if i else ()}) for i, layer in enumerate(layers))
    return ModelProfile(name=name, layers=linked, batch_size=batch_size, **kw)
