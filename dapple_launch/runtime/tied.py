"""Tied weights (models.contract `tied_parameters`): one weight that layers on several stages use.

On a rank, every local member of a group is one shared Parameter, initialised from the group's
first member (its owner, the lowest layer position), built with the owner layer's own seed, so
every stage starts from the same value. After each stage's gradients are all-reduced over its
replicas, the stages holding a copy sum their contributions (Megatron's embedding group, for any
layout): one all-reduce over all their ranks, where only each stage's replica 0 contributes, as
the replicas of a stage already hold the same sum. The copies then see the same gradient and
stay equal. A checkpoint stores the weight once, under the owner's name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..models.contract import PipelineModel, build_layer, parameter_layer, tied_owners


def tie_local(layers: nn.ModuleDict, model: PipelineModel, seed: int) -> None:
    """Make this rank's members of each tied group one Parameter holding the owner's initial value.
    `layers` maps global layer positions (as strings) to the built layers."""
    owners = tied_owners(model)
    groups: dict[str, list[str]] = {}
    for name, owner in owners.items():
        if str(parameter_layer(name)) in layers:
            groups.setdefault(owner, []).append(name)
    specs = model.layers()
    for owner, names in groups.items():
        where = str(parameter_layer(owner))
        if where in layers:
            source = _param(layers, owner)
        else:  # the owner's layer lives on another stage: build it here once, to read its initial value
            built = nn.ModuleDict({where: build_layer(specs[int(where)], int(where), seed)})
            source = _param(built, owner)
        names = sorted(names, key=lambda n: (parameter_layer(n), n))
        shared = _param(layers, names[0])
        if shared.shape != source.shape:
            raise ValueError(
                f"model {model.name}: tied parameters {owner} {list(source.shape)} and {names[0]} "
                f"{list(shared.shape)} differ in shape; tie only weights of the same shape"
            )
        with torch.no_grad():
            shared.copy_(source)
        for name in names[1:]:
            other = _param(layers, name)
            if other.shape != shared.shape:
                raise ValueError(
                    f"model {model.name}: tied parameters {names[0]} {list(shared.shape)} and {name} "
                    f"{list(other.shape)} differ in shape; tie only weights of the same shape"
                )
            module, _, leaf = name.split(".", 1)[1].rpartition(".")
            setattr(layers.get_submodule(module), leaf, shared)


def _param(layers: nn.ModuleDict, name: str) -> nn.Parameter:
    """Parameter `layers.<i>.<path>` of a ModuleDict keyed by layer position."""
    path = name.split(".", 1)[1]
    try:
        return layers.get_parameter(path)
    except AttributeError:
        raise ValueError(f"tied parameter {name} does not exist in layer {parameter_layer(name)}") from None


@dataclass
class TiedGroup:
    owner: str
    stages: tuple[int, ...]  # the stages holding a copy
    group: object = None  # the process group over all their ranks (created by every rank, in order)


def tied_groups(model: PipelineModel, stage_layers: list[tuple[int, int]]) -> list[TiedGroup]:
    """Every tied group that spans more than one stage of this layout, in a fixed order."""
    owners = tied_owners(model)
    members: dict[str, list[int]] = {}
    for name, owner in owners.items():
        members.setdefault(owner, []).append(parameter_layer(name))
    out = []
    for owner in sorted(members):
        stages = tuple(s for s, (a, b) in enumerate(stage_layers) if any(a <= i < b for i in members[owner]))
        if len(stages) > 1:
            out.append(TiedGroup(owner, stages))
    return out


class TiedSync:
    """Sums each spanning tied group's gradient over the stages that hold a copy."""

    def __init__(
        self, groups: list[TiedGroup], local: dict[str, nn.Parameter], stage: int | tuple[int, ...], replica: int
    ):
        """`stage`: this rank's stage, or its stages where its device group holds several."""
        stages = (stage,) if isinstance(stage, int) else tuple(stage)
        self.groups = [g for g in groups if any(s in g.stages for s in stages)]
        self.local, self.replica = local, replica

    def sync(self) -> None:
        for g in self.groups:
            p = self.local[g.owner]
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            contribution = grad if self.replica == 0 else torch.zeros_like(grad)
            dist.all_reduce(contribution, group=g.group)
            p.grad = contribution


def local_tied_parameters(layers: nn.ModuleDict, model: PipelineModel) -> dict[str, nn.Parameter]:
    """owner name -> this rank's shared copy, for the groups with a member here."""
    out = {}
    for name, owner in tied_owners(model).items():
        if str(parameter_layer(name)) in layers and owner not in out:
            out[owner] = _param(layers, name)
    return out
