"""Mixed precision: which precision a cluster gets, the loss scale every rank shares, the skipped
step, the compute dtype on the wire and in the planner's bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dapple_launch.models import build_layer, build_model
from dapple_launch.plan_config import run_precision
from dapple_launch.profile import analytic_profile
from dapple_launch.runtime.checkpoint import find_checkpoints, read_shards
from dapple_launch.runtime.precision import LossScaler, MixedPrecision, grads_finite_everywhere

from .conftest import TINY_GPT, cli
from .custom_models.overflow import build as build_overflow
from .multiproc import run_ranks
from .test_cli import losses


@pytest.mark.parametrize(
    "device,bf16,expected", [("cpu", False, "32"), ("gpu", True, "bf16-mixed"), ("gpu", False, "16-mixed")]
)
def test_auto_precision_follows_the_cluster(device, bf16, expected):
    cfg = OmegaConf.create({"trainer": {"precision": "auto"}, "cluster": {"device_kind": device, "bf16": bf16}})
    assert run_precision(cfg) == expected
    cfg.trainer.precision = "32"
    assert run_precision(cfg) == "32"


def test_the_loss_scale_halves_on_overflow_and_grows_after_clean_steps():
    s = LossScaler(enabled=True, init_scale=1024.0, growth_interval=3)
    s.update(found_inf=True)
    assert s.scale == 512.0 and s.skipped == 1
    for _ in range(3):
        s.update(found_inf=False)
    assert s.scale == 1024.0
    t = LossScaler(enabled=True)
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()
    off = LossScaler(enabled=False)
    off.update(found_inf=True)
    assert off.scale == 1.0


def test_floating_tensors_cross_stages_in_the_compute_dtype():
    bf16 = MixedPrecision("bf16-mixed")
    assert bf16.to_wire(torch.ones(2)).dtype == torch.bfloat16
    assert bf16.to_wire(torch.ones(2, dtype=torch.int64)).dtype == torch.int64
    assert MixedPrecision("32").to_wire(torch.ones(2)).dtype == torch.float32


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_the_planner_sees_half_the_bytes_on_the_wire():
    model = build_model("gpt", "tiny", num_layers=2, hidden=64, seq_len=32)
    fp32 = analytic_profile(model, 2, 1.0, "x", precision="32")
    bf16 = analytic_profile(model, 2, 1.0, "x", precision="bf16-mixed")
    assert bf16.cut_bytes == tuple(c / 2 for c in fp32.cut_bytes)
    # and the weight copies autocast keeps per call are a fixed part of what a micro-batch keeps
    # (the embedding's position ids are one too, at any precision)
    assert fp32.layers[0].saved_fixed_bytes == 32 * 8 and fp32.layers[1].saved_fixed_bytes == 0
    assert bf16.layers[1].saved_fixed_bytes >= 3 * 64 * 64 * 2  # at least the bf16 copy of qkv


def _overflow_on_one_rank(rank, world):
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([1.0, float("inf") if rank == world - 1 else 1.0])
    return grads_finite_everywhere([p], torch.device("cpu"))


@pytest.mark.multiprocess
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    assert run_ranks(3, _overflow_on_one_rank, (), tmp_path) == [False, False, False]


ROOT = Path(__file__).resolve().parent.parent
RUN = [
    "trainer.progress_bar=false",
    "trainer.log_every_n_steps=1",
    "trainer.limit_val_batches=1",
    "data.num_train=256",
    "data.num_val=32",
]


@pytest.mark.multiprocess
def test_16_mixed_skips_every_overflowing_step_on_every_rank_and_keeps_the_weights(tmp_path):
    """A model whose fp16 forward overflows, on 2 stages: each step's inf/NaN is seen by every
    rank, the weights stay as built, each step still counts, the loss scale halves each time."""
    run = tmp_path / "run"
    out = cli(
        [
            "model=custom",
            "model.target=tests.custom_models.overflow:build",
            "trainer.precision=16-mixed",
            "cluster.devices_per_node=2",
            "strategy.replicas=[1]",
            "strategy.num_micro_batches=2",
            "global_batch_size=4",
            "trainer.max_steps=3",
            "trainer.checkpoint_every_n_steps=3",
            "trainer.val_check_interval=3",
            f"hydra.run.dir={run}",
            *RUN,
        ],
        ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (ckpt,) = find_checkpoints(run / "checkpoints")
    state, _ = read_shards(ckpt)
    model = build_overflow()
    for i, spec in enumerate(model.layers()):
        for name, value in build_layer(spec, i, 1234).state_dict().items():
            assert torch.equal(state[f"layers.{i}.{name}"], value), name
    meta = torch.load(ckpt / "meta.pt", weights_only=False)
    assert meta["global_step"] == 3
    assert meta["loss_scaler"]["skipped"] == 3 and meta["loss_scaler"]["scale"] == 2.0**16 / 8


@pytest.mark.multiprocess
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_trains_the_default_job(tmp_path, precision):
    run = tmp_path / "run"
    out = cli(
        [
            *TINY_GPT,
            f"trainer.precision={precision}",
            "trainer.max_steps=12",
            "trainer.val_check_interval=12",
            "trainer.checkpoint_every_n_steps=12",
            "trainer.lr_decay_steps=12",
            "trainer.warmup_steps=2",
            f"hydra.run.dir={run}",
            *RUN,
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    got = losses(run)
    assert got[max(got)] < got[min(got)] - 0.5, got  # half a nat in 12 steps
    meta = torch.load(find_checkpoints(run / "checkpoints")[-1] / "meta.pt", weights_only=False)
    assert meta["loss_scaler"]["skipped"] == 0 and (meta["loss_scaler"]["scale"] == 2.0**16) == (
        precision == "16-mixed"
    )
