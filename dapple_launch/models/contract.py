"""The user's model contract: an ordered list of layers plus a per-sample loss.

- `layers()` returns LayerSpecs in execution order. A layer's `forward` takes the previous layer's
  output: a tensor, or a tuple of tensors passed as separate positional arguments; it returns a
  tensor or a tuple of tensors. The first layer gets the batch's inputs (a tensor, or a tuple of
  them), the last layer's output (as returned) goes to `loss(output, target)`. Between stages a
  tuple travels member by member: every floating-point member carries its gradient back, integer
  and bool members travel without one; shapes may differ per member, but a member's shape must
  not change from batch to batch (except the leading batch dimension). A layer is built by its
  `build()` only on the ranks whose stage holds it, under a seed derived from its position, so its
  initial weights are the same whatever the layout.
- `loss(output, target)` returns one loss per sample (shape [n]). The runtime sums and divides by
  the global batch, so any split into micro-batches and replicas gives the same loss and
  gradients as one process.
- `batch(n, generator, device)` makes an example (inputs, targets) pair: for profiling, tests and
  the synthetic data set (`data=default`).
- Optional:
  - `tied_parameters()`: groups of global parameter names (`layers.<position>.<name>`) that are one
    weight, e.g. the token embedding of layer 0 and the output projection of the last layer. Every
    stage holding a member keeps a copy, initialised from the first member's; their gradients are
    summed across those stages before the optimizer step; the checkpoint stores the weight once,
    under the first member's name.
  - `seq_len`, `vocab_size`: a token model's sequence length and vocabulary; file data
    (`data=text_file`, `data=tokens`) defaults its windows to `seq_len` and refuses token ids
    >= `vocab_size`.
  - `example_from_tokens(window, generator)`: one (inputs, targets) example from seq_len + 1 token
    ids; next-token prediction unless overridden (BERT masks).
  - `slice_loss(output, target, start, stop)`: a causal model's per-sample loss share of tokens
    [start, stop) (the shares over a sequence's slices sum to `loss`). Defining it declares that
    the model supports token slicing (TeraPipe): its layers then read
    `models.token_slices.current()` while a slice runs (absolute positions; attention through
    `TokenSlice.attend`, which keeps the earlier slices' keys and values).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, Union, runtime_checkable

import torch
from torch import nn

Carry = Union[torch.Tensor, tuple]  # what a layer passes to the next: a tensor or a tuple of tensors


@dataclass(frozen=True)
class LayerSpec:
    name: str
    build: Callable[[], nn.Module]


class PipelineModel(abc.ABC):
    name: str = "model"
    seq_len: int | None = None
    vocab_size: int | None = None
    factory: dict | None = None  # a model.target's factory and arguments (models/__init__.py)

    @abc.abstractmethod
    def layers(self) -> list[LayerSpec]: ...

    @abc.abstractmethod
    def loss(self, output: Carry, target: Carry) -> torch.Tensor: ...

    @abc.abstractmethod
    def batch(
        self, n: int, generator: torch.Generator | None = None, device: str | torch.device = "cpu"
    ) -> tuple[Carry, Carry]: ...

    def tied_parameters(self) -> Sequence[Sequence[str]]:
        return ()

    def example_from_tokens(self, window: torch.Tensor, generator: torch.Generator | None = None) -> tuple:
        """Next-token prediction: inputs are the first seq_len ids, targets the last seq_len."""
        return window[:-1], window[1:]

    def describe(self) -> dict:
        """Plain data identifying the architecture (checkpoint compatibility checks use it)."""
        return {"name": self.name}


# The random fills an initialisation makes. On the meta device they have no values to write, yet
# torch runs several of them (normal_, erfinv_, exponential_) through its Python decompositions,
# whose first call imports torch._dynamo: 3 s of a launch that only wants the shapes. nn.init's
# fills are caught whole: the tensor method they call inside runs under this mode's own call,
# which the mode no longer sees.
_FILLS = frozenset(
    {
        *(getattr(torch.Tensor, f) for f in ("normal_", "uniform_", "erfinv_", "exponential_", "log_normal_")),
        *(getattr(torch.Tensor, f) for f in ("cauchy_", "geometric_", "bernoulli_", "random_")),
        *(getattr(nn.init, f) for f in ("normal_", "uniform_", "trunc_normal_", "xavier_normal_", "xavier_uniform_")),
        *(getattr(nn.init, f) for f in ("kaiming_normal_", "kaiming_uniform_", "orthogonal_", "sparse_")),
    }
)


class _NoFillsOnMeta(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FILLS:
            t = args[0] if args else kwargs.get("tensor")  # (nn.init passes its tensor by name)
            if isinstance(t, torch.Tensor) and t.is_meta:
                return t  # (a fill returns the tensor it filled)
        return func(*args, **kwargs)


@contextmanager
def on_meta():
    """Build on the meta device for the shapes alone (parameters, sizes): layers come out as under
    `torch.device("meta")`, their random initialisation skipped rather than decomposed."""
    with torch.device("meta"), _NoFillsOnMeta():
        yield


def build_layer(spec: LayerSpec, index: int, seed: int) -> nn.Module:
    """Build layer `index` with its own seed, so weights do not depend on which layers a rank holds."""
    devices = [] if not torch.cuda.is_available() else [torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed * 100_003 + index)
        return spec.build()


# ---- carries: a tensor or a tuple of tensors -----------------------------------------------------
def as_tuple(x: Carry) -> tuple:
    """A carry as a tuple of its members (a data loader hands tuples over as lists)."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def call_layer(layer: nn.Module, x: Carry) -> Carry:
    return layer(*x) if isinstance(x, (tuple, list)) else layer(x)


def run_layers(layers: Sequence[nn.Module], x: Carry) -> Carry:
    for layer in layers:
        x = call_layer(layer, x)
    return x


def carry_of(xs: tuple) -> Carry:
    """Members as the layers take them: one tensor alone, several as a tuple."""
    return xs[0] if len(xs) == 1 else xs


def carry_map(fn: Callable[[torch.Tensor], torch.Tensor], x: Carry) -> Carry:
    """Apply fn to every member, keeping the carry's form (a tensor stays a tensor)."""
    return tuple(fn(t) for t in x) if isinstance(x, (tuple, list)) else fn(x)


@runtime_checkable
class HFNamed(Protocol):
    """A model whose weights have Hugging Face names (model=hf, model=llama): what export.py writes."""

    def hf_name(self, position: int, name: str) -> str: ...
    def hf_expected(self) -> set[str]: ...
    def hf_config(self) -> Any: ...


def batch_size(x: Carry) -> int:
    return as_tuple(x)[0].shape[0]


# ---- tied parameters -----------------------------------------------------------------------------
def parameter_layer(name: str) -> int:
    """The layer position of a global parameter name `layers.<position>.<...>`."""
    parts = name.split(".")
    if len(parts) < 3 or parts[0] != "layers" or not parts[1].isdigit():
        raise ValueError(
            f"parameter {name!r} is not under layers.<position>: the model contract keeps every weight inside a layer"
        )
    return int(parts[1])


def tied_owners(model: PipelineModel) -> dict[str, str]:
    """Each tied member's name -> the name it is stored under (its group's first member by layer
    position). Members of no group are absent."""
    owners: dict[str, str] = {}
    for group in model.tied_parameters():
        members = sorted(dict.fromkeys(group), key=lambda n: (parameter_layer(n), n))
        if len(members) < 2:
            continue
        for name in members:
            if name in owners:
                raise ValueError(f"model {model.name}: parameter {name} is in two tied groups; merge them into one")
            owners[name] = members[0]
    return owners
