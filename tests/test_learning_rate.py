"""trainer.lr=null (the default): Adam's peak rate by the model's size, settled once at launch."""

from __future__ import annotations

import math

import pytest
import yaml

from dapple_launch.runtime.lr import GPT3_LEARNING_RATES, SMALL_MODEL_LR, default_lr

from .conftest import cli


def test_the_default_rate_follows_gpt3s_table_and_falls_with_size():
    for n, lr in GPT3_LEARNING_RATES:
        assert default_lr(n) == pytest.approx(lr)
    sizes = [10 ** (k / 4) for k in range(8 * 4, 12 * 4)]  # 100 M .. 1 T, four per decade
    rates = [default_lr(n) for n in sizes]
    assert all(a >= b for a, b in zip(rates, rates[1:])), rates
    assert default_lr(2e5) == default_lr(5e6) == SMALL_MODEL_LR  # the CPU presets: as before
    assert 2.4e-4 < default_lr(774e6) < 2.6e-4  # GPT-2 large (it diverged at 3e-3 on an H200)
    assert default_lr(1e12) == pytest.approx(0.6e-4)
    # between two of the table's sizes, between their rates (log-log)
    assert 3.0e-4 > default_lr(math.sqrt(350e6 * 760e6)) > 2.5e-4


@pytest.mark.slow
def test_the_launcher_settles_the_rate_for_the_models_size_in_the_run_files(tmp_path):
    """A GPT of 13.8 M parameters (a 50257-token vocabulary at width 256) gets its rate from the table,
    written into config.yaml (what every rank reads) and said once; a rate set stays as set."""
    shape = ["model.num_layers=2", "model.hidden=256", "model.heads=4", "model.seq_len=64", "model.vocab_size=50257"]
    out = cli([*shape, "dry_run=true", f"hydra.run.dir={tmp_path}/auto"], tmp_path)
    assert out.returncode == 0, out.stderr
    lr = yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())["trainer"]["lr"]
    (line,) = [x for x in (out.stdout + out.stderr).splitlines() if "trainer.lr=" in x]
    n = float(line.split("for ")[1].split(" M parameters")[0]) * 1e6
    assert 13e6 < n < 15e6 and lr == pytest.approx(default_lr(n), rel=1e-2) and lr < SMALL_MODEL_LR, (line, lr)
    out = cli([*shape, "trainer.lr=1e-3", "dry_run=true", f"hydra.run.dir={tmp_path}/set"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load((tmp_path / "set" / "config.yaml").read_text())["trainer"]["lr"] == 1e-3
    assert "trainer.lr=" not in out.stdout + out.stderr
