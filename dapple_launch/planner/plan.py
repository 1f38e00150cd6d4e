"""The Plan: the one contract between planner and runtime. Frozen, JSON/YAML round-trip."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

from ..schedule import SPLIT_BACKWARD
from ..schedule.ranks import RankSchedule


@dataclass(frozen=True)
class StagePlan:
    layers: tuple[int, int]  # [start, stop) positions in the model's layer order
    layer_names: tuple[str, ...]
    replicas: int
    devices: tuple[int, ...]  # one per replica: node × devices_per_node + local index
    # positions (as in `layers`) whose activations are recomputed in the backward rather than kept:
    # () = none, every position of the stage = full (runtime/recompute.py)
    recompute_layers: tuple[int, ...] = ()
    # round-robin copies (schedules 1f1b_rr, zb_h1_rr): the stage's devices form this many copies of
    # replicas / copies devices each, micro-batch m running whole on copy m mod copies (its devices
    # listed copy by copy); 1 = every replica takes a share of every micro-batch
    copies: int = 1


@dataclass(frozen=True)
class Estimate:
    iteration_s: float
    samples_per_s: float
    peak_memory_bytes: tuple[float, ...]  # per device of each stage
    speedup_over_data_parallel: float | None = None
    simulated_iteration_s: float | None = None  # the discrete-event simulator's figure
    # per stage, the cost model's figures the estimate was made from (schedule.StageCosts fields):
    # forward_s, backward_s, send_activation_s, send_gradient_s, allreduce_s (and what of it is left
    # after the last B or W: allreduce_after_b_s, allreduce_after_w_s), activation_bytes, ...
    stage_costs: tuple[dict, ...] = ()
    # token slices: per stage, how a slice's costs scale from the whole sequence's
    # (schedule/terapipe.py slice_scale's arguments), so an outside tool can re-simulate the plan
    slice_shares: tuple[dict, ...] = ()


@dataclass(frozen=True)
class RunnerUp:
    summary: str  # e.g. "2 stages 15:1, mb 8 × 16"
    iteration_s: float
    peak_memory_bytes: float
    note: str = ""


@dataclass(frozen=True)
class Plan:
    model: str
    cluster: str
    global_batch_size: int
    micro_batch_size: int  # samples of one micro-batch before it is split across a stage's replicas
    num_micro_batches: int
    schedule: str  # the family: "1f1b" | "gpipe" | "zb_h1"; `orders` in plan.json spells it out
    stages: tuple[StagePlan, ...]
    estimate: Estimate
    device_memory_bytes: float = 0.0
    runners_up: tuple[RunnerUp, ...] = ()
    planner: str = "fixed"  # how the layout was chosen
    devices_per_node: int = 0  # of the cluster it was planned for (device id = node × this + local); 0 = unstated
    # 1F1B: forwards each stage runs before its first backward; () = DAPPLE's minimum, S - s - 1
    warmup: tuple[int, ...] = ()
    # TeraPipe (schedule "terapipe"): the lengths of the token slices each sequence is cut into
    token_slices: tuple[int, ...] = ()
    # stages per device group (interleaved_1f1b's v; zbv: 2): stages sharing a group list the same devices
    chunks: int = 1
    # strategy=auto's proof, as data: {gap (0: optimal under the cost model), families, candidates, seconds}
    # (not compared: two plans are the same plan whatever the search's time)
    proof: dict | None = field(default=None, compare=False)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def world_size(self) -> int:
        """Devices the plan runs on (a device group holding several stages counts once)."""
        return (
            len({d for s in self.stages for d in s.devices})
            if all(s.devices for s in self.stages)
            else sum(s.replicas for s in self.stages)
        )

    @property
    def num_layers(self) -> int:
        return self.stages[-1].layers[1]

    @property
    def recomputes(self) -> bool:
        return any(s.recompute_layers for s in self.stages)

    def device_samples(self) -> tuple[int, ...]:
        """Per stage, the samples one of its devices runs per micro-batch (the largest share): the
        micro-batch split across the devices that share it, which are a copy's (round-robin copies)
        or a pipeline's (Chimera's two pipelines each hold half of a stage's devices)."""
        ways = [2 if self.schedule == "chimera" else s.copies for s in self.stages]
        return tuple(-(-self.micro_batch_size // max(1, s.replicas // w)) for s, w in zip(self.stages, ways))

    def layout(self) -> str:
        return ":".join(str(s.replicas) for s in self.stages)

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        for s in d["stages"]:
            s["layers"], s["layer_names"], s["devices"] = list(s["layers"]), list(s["layer_names"]), list(s["devices"])
            s["recompute_layers"] = list(s["recompute_layers"])
        d["estimate"]["peak_memory_bytes"] = list(d["estimate"]["peak_memory_bytes"])
        d["estimate"]["stage_costs"] = [dict(c) for c in d["estimate"]["stage_costs"]]
        d["estimate"]["slice_shares"] = [dict(c) for c in d["estimate"]["slice_shares"]]
        d["runners_up"] = [dict(r) for r in d["runners_up"]]
        d["warmup"] = list(d["warmup"])
        d["token_slices"] = list(d["token_slices"])
        d["orders"] = self.orders()
        return d

    def orders(self) -> list[dict]:
        """What each device group runs, in order, for an outside tool to re-simulate the plan without
        knowing the schedule's name: one entry per group of devices running one order,
        {"devices": [...], "actions": [[kind, stage, micro_batch], ...]}, kind "F", "B" (whole
        backward), "I" or "W" (split); `stage` indexes `stages`. Transfers are implied: a stage's F
        needs the previous stage's F of that micro-batch, its B or I the next stage's B or I."""
        schedule = self.build_schedule()
        if isinstance(schedule, RankSchedule):  # device groups holding several stages: one order per group
            return [
                {"devices": list(self.group_devices(schedule, r)), "actions": [a.to_json() for a in order]}
                for r, order in enumerate(schedule.orders)
            ]
        K = schedule.num_slices
        if K > 1:  # token slices: [kind, stage, micro_batch, slice]
            return [
                {
                    "devices": list(st.devices),
                    "actions": [[a.kind.value, s, *divmod(a.micro_batch, K)] for a in schedule.compute_order(s)],
                }
                for s, st in enumerate(self.stages)
            ]
        return [
            {
                "devices": list(st.devices),
                "actions": [[a.kind.value, s, a.micro_batch] for a in schedule.compute_order(s)],
            }
            for s, st in enumerate(self.stages)
        ]

    def group_devices(self, schedule, group: int) -> tuple[int, ...]:
        """The devices of the device group running orders[group]: its first stage's, or where a stage
        sits on two groups (Chimera) the half of that stage's devices that group holds (a stage lists
        its down pipeline's copy first)."""
        return dict(self.devices_by_group(schedule, schedule.stages_of(group)[0]))[group]

    def devices_by_group(self, schedule, stage: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """(group, its devices) for each device group holding `stage`, in the stage's device order:
        a stage's devices split evenly among its groups (Chimera: the down copy's first)."""
        groups, devices = schedule.placement[stage], self.stages[stage].devices
        part = len(devices) // len(groups)
        return tuple((g, tuple(devices[j * part : (j + 1) * part])) for j, g in enumerate(groups))

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        d = dict(d)
        d["stages"] = tuple(
            StagePlan(
                tuple(s["layers"]),
                tuple(s["layer_names"]),
                int(s["replicas"]),
                tuple(s["devices"]),
                tuple(int(i) for i in s.get("recompute_layers", ())),
                int(s.get("copies", 1)),
            )
            for s in d["stages"]
        )
        e = dict(d["estimate"])
        e["peak_memory_bytes"] = tuple(e["peak_memory_bytes"])
        e["stage_costs"] = tuple(dict(c) for c in e.get("stage_costs", ()))
        e["slice_shares"] = tuple(dict(c) for c in e.get("slice_shares", ()))
        d["estimate"] = Estimate(**e)
        d["runners_up"] = tuple(RunnerUp(**r) for r in d.get("runners_up", ()))
        d["warmup"] = tuple(int(w) for w in d.get("warmup", ()))
        d["token_slices"] = tuple(int(n) for n in d.get("token_slices", ()))
        d["proof"] = dict(d["proof"]) if d.get("proof") else None
        orders = d.pop("orders", None)  # derived from schedule and warm-up: checked, never trusted
        plan = cls(**d)
        for k, st in enumerate(plan.stages):
            outside = [i for i in st.recompute_layers if not st.layers[0] <= i < st.layers[1]]
            if outside:
                raise ValueError(
                    f"stage {k}'s recompute_layers {outside} are not among its layers "
                    f"[{st.layers[0]}, {st.layers[1]}): list positions of the stage's own layers"
                )
        if plan.token_slices and plan.recomputes:
            raise ValueError(
                "recompute_layers with token_slices: a recomputed forward would not see the slice's "
                "cached keys and values; use one or the other"
            )
        if plan.recomputes and plan.schedule in SPLIT_BACKWARD:
            raise ValueError(
                f"recompute_layers with schedule {plan.schedule}: a split backward's W would run the "
                f"recomputed forward a second time; use schedule 1f1b, gpipe, interleaved_1f1b or "
                f"chimera, or empty recompute_layers"
            )
        # (their devices follow `stages`: an edited placement is checked against the cluster elsewhere)
        if orders is not None and [o.get("actions") for o in orders] != [o["actions"] for o in plan.orders()]:
            raise ValueError(
                f"its orders are not what schedule {plan.schedule!r} (warm-up {list(plan.warmup)}) runs "
                f"on its {plan.num_stages} stages, devices and {plan.num_micro_batches} micro-batches: "
                f"orders are written from those for outside tools, never read; delete the orders entry "
                f"after editing the plan (or change schedule and warmup, not orders)"
            )
        return plan

    def build_schedule(self):
        """The action lists every reader of this plan uses: runtime, simulator, timeline."""
        from ..schedule import CHUNKED_SCHEDULES, build_rank_schedule, build_schedule, num_groups
        from ..schedule.round_robin import RR_FAMILIES, round_robin

        if self.schedule in RR_FAMILIES:
            return round_robin(
                self.schedule, tuple(s.copies for s in self.stages), self.num_micro_batches, self.warmup or None
            )
        if any(s.copies != 1 for s in self.stages):
            raise ValueError(
                f"stage copies are a setting of schedules {sorted(RR_FAMILIES)}; schedule "
                f"{self.schedule!r} splits every micro-batch across a stage's replicas: set copies to 1"
            )
        if self.schedule in CHUNKED_SCHEDULES:
            return build_rank_schedule(
                self.schedule,
                num_groups(self.schedule, self.num_stages, self.chunks),
                self.num_micro_batches,
                self.chunks,
            )
        return build_schedule(self.schedule, self.num_stages, self.num_micro_batches, self.warmup, self.token_slices)

    def group_ranks(self, schedule) -> tuple[tuple[int, ...], ...]:
        """The ranks of each device group running one of `schedule`'s orders (a stage-per-rank schedule:
        each stage's), ranks numbered by device as the runtime numbers them (runtime/grid.py)."""
        devices = [s.devices if s.devices else () for s in self.stages]
        if not all(devices):  # unstated: stage-major
            first = 0
            for k, s in enumerate(self.stages):
                devices[k], first = tuple(range(first, first + s.replicas)), first + s.replicas
        rank = {d: r for r, d in enumerate(sorted({d for ds in devices for d in ds}))}
        if hasattr(schedule, "orders"):
            by_group = {}
            for k in range(len(self.stages)):
                groups, ds = schedule.placement[k], devices[k]
                part = len(ds) // len(groups)
                for j, g in enumerate(groups):
                    by_group.setdefault(g, tuple(rank[d] for d in ds[j * part : (j + 1) * part]))
            return tuple(by_group[g] for g in range(schedule.num_ranks))
        return tuple(tuple(rank[d] for d in ds) for ds in devices)

    def transfer_programs(self) -> dict:
        """Every rank's transfers of one training iteration, as the runtime issues them
        (schedule/transfers.py), for micro-batches of `micro_batch_size` samples."""
        from ..schedule.ranks import from_stages
        from ..schedule.transfers import lower

        schedule = self.build_schedule()
        x = schedule if isinstance(schedule, RankSchedule) else from_stages(schedule)
        return lower(x, self.group_ranks(schedule), (self.micro_batch_size,) * x.num_micro_batches)

    def check_transfers(self) -> None:
        """Raise ValueError unless every rank's transfers pass the NCCL model (schedule/nccl.py)."""
        from ..schedule.nccl import NcclOrderError, check_lowered
        from ..schedule.transfers import LoweringError

        try:
            check_lowered(self.transfer_programs())
        except (NcclOrderError, LoweringError) as exc:
            raise ValueError(f"the plan's transfers break NCCL's point-to-point rules: {exc}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(loads(text))

    def to_yaml(self) -> str:
        from omegaconf import OmegaConf

        return OmegaConf.to_yaml(OmegaConf.create(self.to_dict()))

    @classmethod
    def from_yaml(cls, text: str) -> Plan:
        from omegaconf import OmegaConf

        return cls.from_dict(cast(dict, OmegaConf.to_container(OmegaConf.create(text))))

    def save(self, path: str | Path) -> Path:
        """Atomic write: a reader never sees half a plan."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_json(Path(path).read_text())

    def explain(self, full: bool = False) -> str:
        """A headline of two lines, the layout's table, the runners-up; `full`: and how it was chosen
        (families tried, bounds, why not the others), as plan.json's `planner` holds it."""
        from .explain import explain

        return explain(self, full)


def loads(text: str):
    """A plan.json's (or a pareto.json's) data, refusing NaN and Infinity, which json reads as numbers:
    a plan holding one (a hand edit, a damaged file) would print a NaN estimate or fail deep in the
    runtime, so it is refused where it is read."""
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a finite number; every number in a plan is finite")
