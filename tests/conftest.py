from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from dapple_launch.config import CONF_DIR

ROOT = Path(__file__).resolve().parent.parent

# Two xdist workers share the machine's cores: torch's default of one thread per core in each of
# them (and in each command a test starts) oversubscribes the cores, and OpenMP's spinning threads
# then slow a test 3-5 times (the fast tier's profiling tests: 42-69 s together, 28 s at one thread
# each). One thread per worker, and per command it starts (rank processes set their own).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
TINY_GPT = ["model.num_layers=2", "model.hidden=32", "model.heads=2", "model.seq_len=16"]


@pytest.fixture
def compose_cfg():
    def make(overrides=()):
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            return compose("config", overrides=list(overrides))

    return make


def cli(args, cwd, timeout=600, env=None, module=("dapple_launch",)):
    """Run `python -m dapple_launch ARGS` as a user would; return the CompletedProcess."""
    e = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *module, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e
    )


NOT_FAST = ("slow", "multiprocess", "faults", "slurm", "nodes", "wheel", "more_seeds")
# A property test over random instances (parametrized by `seed`) runs its first FAST_SEEDS in the
# fast tier and every seed in CI's: the same property, checked before each commit on fewer draws
# (90 cases past the second seed were 23 s of the fast tier's 121 s of tests).
FAST_SEEDS = 2
FIRST = {"test_the_package_type_checks"}


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        # Every command a test starts imports much of the package: where its bytecode is stale and
        # the environment never writes it (PYTHONDONTWRITEBYTECODE=1, this machine's), each one
        # compiles it again, 1.2 s a process (the fast tier: 63-64 s stale, 42-54 s compiled on a
        # quieter host). Compiled once here, before the workers start; a no-op (0.1 s) where current.
        import compileall

        for folder in ("dapple_launch", "tests"):
            compileall.compile_dir(str(ROOT / folder), quiet=1)
    else:
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """`pytest -m fast`: every test without a slower tier's marker (pure and one-process checks, in
    about a minute), what a contributor runs before each commit."""
    for item in items:
        params = getattr(item, "callspec", None)
        if params is not None and params.params.get("seed", 0) >= FAST_SEEDS:
            item.add_marker(pytest.mark.more_seeds)
        if not any(item.get_closest_marker(m) for m in NOT_FAST):
            item.add_marker(pytest.mark.fast)
    # the wheel's install first: two minutes mostly waiting on pip, beside the other tests rather
    # than alone at the end. (All the several-process tests first was slower by nine minutes: two of
    # them at once put 8-16 lock-step ranks on two cores.)
    # The type check next: 20 s of one process, the fast tier's longest test; started last, it ran
    # alone while the other worker had finished (the fast tier 66-72 s rather than about a minute).
    items.sort(key=lambda item: 0 if item.get_closest_marker("wheel") else 1 if item.name in FIRST else 2)
