"""The install a user makes: build the wheel, install it (not editable) into a fresh environment,
and run the tool from a directory outside the checkout: a dry run of a shipped profile and
recipe, the `dapple-launch` command, and a few training steps of the default job and of the
custom-model recipe on a text file. Marked `wheel` (it installs packages: about a minute)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel
ROOT = Path(__file__).resolve().parent.parent
LICENSE = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"


def run(cmd, cwd, timeout=900, env=None):
    # as a user's environment runs: nothing of the checkout on the path, and modules compiled once,
    # on first import, and kept (a machine with PYTHONDONTWRITEBYTECODE=1 recompiled torch, Lightning
    # and transformers in each of the run's processes: ~10 s each)
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
    e = {k: v for k, v in os.environ.items() if k not in drop}
    e.update({"WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", **(env or {})})
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_the_wheel_installs_and_runs_from_anywhere(tmp_path):
    # built from a copy of the tracked files, as from a clean clone (and leaving no build/ behind)
    src, dist = tmp_path / "src", tmp_path / "dist"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name, follow_symlinks=False)
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        tmp_path,
    )
    (wheel,) = dist.glob("dapple_launch-*.whl")
    venv = tmp_path / "venv"
    # A fresh environment, filled by this environment's pip (`pip --python`) rather than a copy of
    # pip installed into it first, and without compiling every installed file up front (the
    # modules a run imports are compiled as it imports them): the same packages; the test took
    # 94 s alone, 155 s with pip compiling every file.
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-compile"]
    # torch first, pinned to the version this machine holds (the range would pull a CUDA build)
    import torch

    run([*pip, f"torch=={torch.__version__.split('+')[0]}"], tmp_path)
    run([*pip, str(wheel)], tmp_path)
    away = tmp_path / "elsewhere"
    away.mkdir()
    # nothing of the checkout is on the path: the package is the installed one
    out = run([str(py), "-c", "import dapple_launch, sys; print(dapple_launch.__file__)"], away)
    assert str(venv) in out.stdout and str(ROOT) not in out.stdout
    out = run(
        [
            str(venv / "bin" / "dapple-launch"),
            "model=from_profile",
            "model.profile=bert-48-pbs-2",
            "cluster=v100x16",
            "global_batch_size=128",
            "strategy=auto",
            "dry_run=true",
            "hydra.run.dir=p",
        ],
        away,
    )
    assert json.loads((away / "p" / "plan.json").read_text())["stages"]
    # a shipped recipe, with GPT-2 token ids to read (enough windows for its global batch of 512)
    ids = away / "ids.bin"
    run(
        [
            str(py),
            "-c",
            "import numpy as np; np.random.default_rng(0).integers(1, 50257, 540 * 1024 + 1, "
            f"dtype=np.uint16).tofile({str(ids)!r})",
        ],
        away,
    )
    run(
        [
            str(py),
            "-m",
            "dapple_launch",
            "+recipe=gpt2-medium-a100x64",
            f"data.path={ids}",
            "dry_run=true",
            "hydra.run.dir=g",
        ],
        away,
    )
    assert json.loads((away / "g" / "plan.json").read_text())["cluster"] == "a100x64"
    fast = [
        "model.num_layers=2",
        "model.hidden=32",
        "model.heads=2",
        "model.seq_len=16",
        "trainer.max_steps=2",
        "trainer.progress_bar=false",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "trainer.checkpoint_every_n_steps=2",
        "data.num_train=64",
        "data.num_val=16",
    ]
    out = run([str(py), "-m", "dapple_launch", *fast, "hydra.run.dir=train"], away)
    assert "done: steps 0..2" in out.stdout
    assert (away / "train" / "checkpoints" / "step000002.ckpt" / "COMPLETE").is_file()
    out = run(
        [
            str(py),
            "-m",
            "dapple_launch",
            "+recipe=your-model-your-text",
            f"data.path={LICENSE}",
            "trainer.max_steps=2",
            "trainer.progress_bar=false",
            "trainer.val_check_interval=2",
            "trainer.limit_val_batches=1",
            "trainer.checkpoint_every_n_steps=2",
            "hydra.run.dir=mine",
        ],
        away,
    )
    assert (away / "mine" / "checkpoints" / "step000002.ckpt" / "COMPLETE").is_file()
