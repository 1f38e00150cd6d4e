"""Lint in the fast tier: ruff's rules (pyproject [tool.ruff]) on the package, tests and benchmarks,
the import-linter contracts that keep the layers one way (pyproject [tool.importlinter]), and the
type checker on the package (pyproject [tool.basedpyright])."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' (scripts/setup.sh does)")
    return found


def test_ruff_finds_nothing():
    out = subprocess.run(
        [tool("ruff"), "check", "--output-format", "concise", "dapple_launch", "tests", "benchmarks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_format_leaves_everything_as_it_is():
    out = subprocess.run(
        [tool("ruff"), "format", "--check", "dapple_launch", "tests", "benchmarks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_import_contracts_are_kept():
    out = subprocess.run([tool("lint-imports")], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_package_type_checks():
    # the project named outright: a pyrightconfig.json in a folder above the clone would win otherwise
    out = subprocess.run([tool("basedpyright"), "-p", "pyproject.toml"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
