"""DappleStrategy: a Lightning strategy that runs a Plan with its schedule.

It subclasses DDPStrategy for the process-group set-up, launchers, barrier and broadcast, but
never wraps the module in DDP: each rank keeps only its stage's layers (global names), runs the
stage's action list inside one training step, and all-reduces gradients inside its own stage's
replica group. Registered as "dapple"; with no plan given it reads the one named by $DAPPLE_PLAN.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from ..data.rank_batch import global_size
from ..models import identity
from ..models.contract import parameter_layer, tied_owners
from ..planner.plan import Plan
from ..schedule import RANK_ORDER_SCHEDULES
from . import checkpoint as ckpt
from .clock import perf
from .executor import GradientSync, StageExecutor
from .grid import ProcessGrid
from .groups import communicators
from .heartbeat import BEAT
from .p2p import PointToPoint
from .placement import PlannedEnvironment, check_world_size
from .rank_executor import RankExecutor, build_rank_executor
from .rank_rows import eval_micro_batches, eval_schedule, read_table
from .tied import TiedSync, local_tied_parameters, tied_groups

if TYPE_CHECKING:
    from .module import PipelineModule

PLAN_ENV = "DAPPLE_PLAN"


class DappleStrategy(DDPStrategy):
    strategy_name = "dapple"

    def __init__(
        self,
        plan: Plan | str | Path | None = None,
        timeout_s: float = 300.0,
        profile_steps: range | None = None,
        timeline_dir: str | Path | None = None,
        **kwargs: Any,
    ):
        kwargs.setdefault("process_group_backend", None)
        super().__init__(timeout=timedelta(seconds=timeout_s), **kwargs)
        if plan is None:
            if PLAN_ENV not in os.environ:
                raise ValueError(
                    f'strategy "dapple" needs a plan: pass DappleStrategy(plan=...) or set ${PLAN_ENV} to a plan.json'
                )
            plan = os.environ[PLAN_ENV]
        self.plan = plan if isinstance(plan, Plan) else Plan.load(plan)
        self.grid = ProcessGrid.from_plan(self.plan)
        self.train_schedule = self.plan.build_schedule()
        # interleaved 1F1B, ZB-V: each device group holds several stages (runtime/rank_executor.py)
        self.chunked = self.plan.schedule in RANK_ORDER_SCHEDULES
        self._executor: StageExecutor | RankExecutor | None = None
        self._syncs: list[GradientSync] = []
        self._tied: TiedSync | None = None
        self.skip_next_step = False  # 16-mixed: an inf/NaN gradient somewhere skips this step everywhere
        # trainer.profile_pipeline: the steps whose actions every rank records (timeline.py)
        self.profile_steps, self.timeline_dir = profile_steps or range(0), timeline_dir
        self._recorded: list[dict] = []
        # per training step, this rank's pipeline span: from its first action until the loss all-reduce,
        # which returns once every rank has finished its actions and gradient all-reduces: the span the
        # plan's estimate describes (the optimizer step, data and Lightning's hooks are outside it)
        self.pipeline_s: list[float] = []

    @property
    def module(self) -> PipelineModule:
        """The LightningModule this strategy trains: always a PipelineModule (runtime/module.py)."""
        return cast("PipelineModule", self.lightning_module)

    @property
    def executor(self) -> Any:
        """This rank's StageExecutor or RankExecutor (their run() takes the schedule kind they hold)."""
        assert self._executor is not None, "setup() builds the executor"
        return self._executor

    # ---- the grid ------------------------------------------------------------------------
    @property
    def stage(self) -> int:
        return self.grid.position(self.global_rank)[0]

    @property
    def replica(self) -> int:
        return self.grid.position(self.global_rank)[1]

    @property
    def local_stages(self) -> tuple[int, ...]:
        """The stages this rank holds: one, or its device group's chunks."""
        return self.grid.stages_at(self.global_rank)

    @property
    def local_layer_indices(self) -> list[int]:
        return [i for s in self.local_stages for i in range(*self.plan.stages[s].layers)]

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # Every rank draws the whole global batch's indices and reads only its own rows (data/rank_batch.py).
        return {"num_replicas": 1, "rank": 0}

    def set_world_ranks(self) -> None:
        # Ranks follow the planned devices (placement.py), not Lightning's node × devices + local.
        env = self.cluster_environment
        if not isinstance(env, PlannedEnvironment):
            super().set_world_ranks()
            return
        from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero_only
        from lightning.pytorch.utilities.rank_zero import rank_zero_only

        rank_zero_only.rank = fabric_rank_zero_only.rank = env.global_rank()

    @property
    def root_device(self) -> torch.device:
        env = self.cluster_environment
        if isinstance(env, PlannedEnvironment) and self.parallel_devices and self.parallel_devices[0].type == "cuda":
            # the device the planner placed this replica on; where the scheduler gives each task only
            # its own GPU (CUDA_VISIBLE_DEVICES per task, Slurm's --gpus-per-task), that is the one it sees
            return torch.device("cuda", 0 if torch.cuda.device_count() == 1 else env.place.local)
        return super().root_device

    def setup_environment(self) -> None:
        env = self.cluster_environment
        if isinstance(env, PlannedEnvironment) and self.parallel_devices and self.parallel_devices[0].type == "cuda":
            visible = torch.cuda.device_count()
            if visible != 1 and env.place.local >= visible:
                raise ValueError(
                    f"rank {env.place.rank} is planned on device {env.place.device} = node {env.place.node}, local "
                    f"GPU {env.place.local}, but this node shows {visible} GPU(s); cluster.devices_per_node says "
                    f"more GPUs per node than the nodes have: set it to {visible} and re-plan"
                )
        super().setup_environment()

    def setup_distributed(self) -> None:
        check_world_size(self.plan, self.world_size)
        super().setup_distributed()
        # Every rank creates every group, in the same order (torch.distributed's rule); one communicator
        # per distinct set of ranks (stages sharing their devices share it), apart from the transfers'
        comms = communicators()
        self._stage_groups = [comms.get(self.grid.stage_ranks(s)) for s in range(self.grid.num_stages)]
        model = self.module.model
        self._tied_groups = tied_groups(model, [s.layers for s in self.plan.stages])
        for g in self._tied_groups:
            g.group = comms.get({r for s in g.stages for r in self.grid.stage_ranks(s)})

    def configure_ddp(self) -> None:
        """No DDP wrapper: gradients are reduced per stage by GradientSync."""

    def setup(self, trainer) -> None:
        super().setup(trainer)
        module = self.module
        local = self.local_stages
        tied = local_tied_parameters(module.layers, module.model)
        self._tied = TiedSync(self._tied_groups, tied, local, self.replica)
        # a tied weight's gradient norm counts once: on the first stage holding it
        self._norm_excluded = {
            id(tied[g.owner]) for g in self._tied_groups if set(local) & set(g.stages) and g.stages[0] not in local
        }
        if self.chunked:
            self._executor, self._syncs = build_rank_executor(
                self.plan,
                self.grid,
                self.global_rank,
                {i: module.layers[str(i)] for i in self.local_layer_indices},
                module.model.loss,
                dict(enumerate(self._stage_groups)),
                module.mixed_precision(),
                self.root_device,
            )
            return
        p2p = PointToPoint(self.grid, self.stage, self.replica, self.root_device)
        params = [p for p in module.parameters() if p.requires_grad]
        per_layer = [[p for p in layer.parameters() if p.requires_grad] for layer in module.local_stack()]
        self._syncs = [GradientSync(params, self._stage_groups[self.stage], self.grid.replicas[self.stage], per_layer)]
        first = self.plan.stages[self.stage].layers[0]
        self._executor = StageExecutor(
            module.local_stack(),
            module.model.loss,
            p2p,
            self.grid.num_stages,
            on_last_backward=self._syncs[0].start,
            before_last_backward=self._syncs[0].arm,
            precision=module.mixed_precision(),
            recompute=[i - first for i in self.plan.stages[self.stage].recompute_layers],
            slice_loss_fn=getattr(module.model, "slice_loss", None),
        )

    # ---- one iteration ---------------------------------------------------------------------
    def _broadcast_loss(self, loss_sum: torch.Tensor) -> torch.Tensor:
        # The last stage's replicas hold the loss in parts; one all-reduce gives it to every rank.
        loss = loss_sum.detach().clone().float()
        BEAT.action("collective (the loss)")  # blocked here is waiting on a peer (launch names the culprit)
        dist.all_reduce(loss)
        return loss

    def pipeline_train_step(self, batch, loss_scale: float = 1.0) -> torch.Tensor:
        step = self.module.trainer.global_step
        recording = step in self.profile_steps
        self.executor.timeline = [] if recording else None
        t0 = perf(self.root_device)  # (on a GPU: after the previous step's queued work)
        result = self.executor.run(self.train_schedule, batch, loss_scale=loss_scale)
        for sync in self._syncs:
            sync.finish()
        assert self._tied is not None, "setup() makes the tied-weight sync"
        self._tied.sync()
        loss = self._broadcast_loss(result.loss_sum)
        self.pipeline_s.append(perf(self.root_device) - t0)  # the work done, not its enqueueing
        if recording:
            self._record(step)
        return loss

    def finish_gradients(self, loss_scale: float, clip: float | None, loss: torch.Tensor) -> tuple[bool, float]:
        """After the pipeline: (whether every rank's loss and gradients are finite, the whole model's
        gradient norm). One fused pass and one host sync per step: per-parameter norms in one
        foreach kernel, one all-reduce of [squared norm, any non-finite], one read; then, if finite,
        the loss scale undone and the clip applied in one foreach multiply. A tied weight counts
        once (on its first stage), a stage's replicas once (replica 0), so every rank holds the
        same norm and takes the same decision."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        grads = [g for g in (p.grad for p in params) if g is not None]  # (all of them: the filter above)
        device = self.root_device
        zero = torch.zeros((), device=device)
        # each gradient's norm once; the whole set says whether any is non-finite, the counted ones the norm
        squares = torch.stack([n.float() for n in torch._foreach_norm(grads)]).square() if grads else zero[None]
        everything = squares.sum()
        counted = torch.tensor([id(p) not in self._norm_excluded for p in params] or [False], device=squares.device)
        sq = torch.where(counted, squares, torch.zeros_like(squares)).sum()
        bad = (~torch.isfinite(everything)).float() + (~torch.isfinite(loss.detach().float())).float()
        sq = torch.where(torch.isfinite(sq), sq, zero) * (1.0 if self.replica == 0 else 0.0)
        both = torch.stack([sq, bad]).to(device)
        BEAT.action("collective (gradient norm and finite check)")
        dist.all_reduce(both)
        total_sq, bad_ranks = both.tolist()  # the step's one host sync
        if bad_ranks:
            return False, math.inf
        norm = math.sqrt(total_sq) / loss_scale
        coef = 1.0 / loss_scale
        if clip and clip / (norm + 1e-6) < 1:  # (the rule clip_grad_norm_ had here)
            coef *= clip / (norm + 1e-6)
        if coef != 1.0 and grads:
            torch._foreach_mul_(grads, coef)
        return True, norm

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        if self.skip_next_step:  # counted as a step, weights untouched (as torch.amp skips)
            self.skip_next_step = False
            closure()
            return None
        return super().optimizer_step(optimizer, closure, model, **kwargs)

    def _record(self, step: int) -> None:
        from .timeline import measured_iteration, write_timeline

        events = self.executor.timeline
        several = len(self._syncs) > 1
        for sync, s in zip(self._syncs, self.local_stages if several else (None,)):
            if sync.span:
                events.append((f"AR·s{s}" if several else "AR", *sync.span))
        self.executor.timeline = None
        gathered: list = [None] * self.world_size
        dist.gather_object(events, gathered if self.is_global_zero else None, dst=0)
        if not self.is_global_zero:
            return
        self._recorded.append(measured_iteration(step, gathered, self.grid))
        if step == self.profile_steps[-1] and self.timeline_dir is not None:
            json_path, svg_path = write_timeline(Path(self.timeline_dir), self.plan, self._recorded)
            print(f"pipeline timeline of steps {self.profile_steps[0]}..{step}: {svg_path} (numbers: {json_path})")

    def pipeline_eval_step(self, batch) -> torch.Tensor:
        micro = eval_micro_batches(self.plan.num_micro_batches, global_size(batch), max(self.grid.replicas))
        result = self.executor.run(eval_schedule(self.train_schedule, self.grid.num_stages, micro), batch)
        return self._broadcast_loss(result.loss_sum)

    def batch_reads(self, train_sizes, eval_sizes) -> tuple[dict, dict]:
        """What this rank reads of training and evaluation batches of the sizes given
        (data/rank_batch.RankView): its stages' rows and tensors only."""
        return read_table(
            self.grid, self.train_schedule, self.global_rank, train_sizes, eval_sizes, self.plan.num_micro_batches
        )

    # ---- checkpoints: every layout writes and reads the same named tensors ----------------------
    @property
    def _owners(self) -> dict[str, str]:
        """Tied member -> the name its weight is stored under (models.contract.tied_owners)."""
        return tied_owners(self.module.model)

    def _param_names(self) -> list[list[str]]:
        """The optimizer's parameters by stored name (a tied copy answers to its owner's name)."""
        owners = self._owners
        ids = {id(p): owners.get(n, n) for n, p in self.module.named_parameters()}
        return [[ids[id(p)] for p in group["params"]] for group in self.optimizers[0].param_groups]

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        """All ranks: shards into a fresh temporary directory; once every rank reports its shard
        written, rank 0 commits. A failed write (a full disk) anywhere fails the save on every rank
        with that rank's reason, and the previous checkpoint stays as it was."""
        import secrets

        BEAT.action("checkpoint save")
        state = checkpoint["state_dict"]
        optim = checkpoint.get("optimizer_states", [])
        # every rank's weights and optimizer values finite, or no rank writes anything (one all-reduce)
        values = list(state.values()) + [v for o in optim for st in o.get("state", {}).values() for v in st.values()]
        bad = torch.tensor([0.0 if ckpt.all_finite(values) else 1.0], device=self.root_device)
        BEAT.action("collective (checkpoint save: finite check)")
        dist.all_reduce(bad)
        if bad.item():
            raise ckpt.NonFiniteState(
                f"{int(bad.item())} rank(s) hold an inf or NaN weight or optimizer value; "
                f"the checkpoints saved before are kept"
            )
        checkpoint.pop("state_dict")
        checkpoint.pop("optimizer_states", None)
        # the save's collectives wait on every rank: labelled as such, so a rank stopped meanwhile is
        # named with the others only waiting on it (launch/local.py)
        BEAT.action("collective (checkpoint save: its directory)")
        token = self.broadcast(secrets.token_hex(4) if self.is_global_zero else "")
        BEAT.action("checkpoint save")
        tmp = ckpt.fresh_tmp(filepath, token)
        error = ""
        try:
            if self.replica == 0:
                # a tied weight is stored once, by the stage holding its owner's layer
                owners = self._owners
                state = {k: v for k, v in state.items() if owners.get(k, k) == k}
                by_name = ckpt.optimizer_state_by_name(optim[0], self._param_names()) if optim else {}
                for s in self.local_stages:  # one shard per stage, whatever rank holds it
                    a, b = self.plan.stages[s].layers
                    shard_optim = (
                        dict(by_name, state={k: v for k, v in by_name["state"].items() if a <= parameter_layer(k) < b})
                        if by_name
                        else {}
                    )
                    ckpt.write_shard(
                        tmp, a, b, {k: v for k, v in state.items() if a <= parameter_layer(k) < b}, shard_optim
                    )
        except OSError as exc:
            error = storage_error(exc, tmp)
        BEAT.action("collective (checkpoint save: every shard written)")
        self._agree_or_fail(error, tmp)
        BEAT.action("checkpoint save")
        if self.is_global_zero:
            checkpoint["dapple"] = {
                "model": identity(self.module.model),
                "plan": self.plan.to_dict(),
                "num_layers": self.plan.num_layers,
            }
            try:
                ckpt.commit(filepath, tmp, checkpoint, self.module.trainer.global_step)
            except OSError as exc:
                error = storage_error(exc, tmp)
        BEAT.action("collective (checkpoint save: committed)")  # every rank waits for rank 0's commit here
        self._agree_or_fail(error, tmp)

    def _agree_or_fail(self, error: str, tmp: Path) -> None:
        """Every rank learns every rank's save error; with one, all raise it (rank 0 removes the
        unfinished directory)."""
        errors = [None] * self.world_size
        dist.all_gather_object(errors, error)
        first = next((e for e in errors if e), "")
        if first:
            if self.is_global_zero:
                import shutil

                shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"{first}; the save was abandoned and the checkpoints saved before are intact")

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        meta = ckpt.read_meta(checkpoint_path)
        module = self.module
        ckpt.check_compatible(meta, identity(module.model), checkpoint_path)
        owners = self._owners
        wanted = module.state_dict().keys()
        keep = set(self.local_layer_indices) | {parameter_layer(owners[k]) for k in wanted if k in owners}
        state, optim = ckpt.read_shards(checkpoint_path, keep)
        meta["state_dict"] = {k: state[owners.get(k, k)] for k in wanted if owners.get(k, k) in state}
        meta["optimizer_states"] = [optim] if optim["param_groups"] else []
        return meta

    def load_optimizer_state_dict(self, checkpoint) -> None:
        for opt, saved in zip(self.optimizers, checkpoint["optimizer_states"]):
            opt.load_state_dict(ckpt.optimizer_state_by_index(saved, opt.state_dict(), self._param_names()))


def storage_error(exc: OSError, where) -> str:
    """A failed write as one line: the path and what the errno means (no space left on device, ...)."""
    import errno

    what = os.strerror(exc.errno) if exc.errno else str(exc)
    hint = "; free space there" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return f"cannot write {exc.filename or where}: {what}{hint}"


StrategyRegistry.register("dapple", DappleStrategy, description="DAPPLE pipeline + data parallel", override=True)
