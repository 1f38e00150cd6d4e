"""The dependency rule of ARCHITECTURE.md, checked rather than trusted: schedule, planner and profile
are pure (no torch at import) and import nothing from the runtime or the launcher, so planning a
profile file never loads torch and the planner can be reused by an outside tool."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "dapple_launch"
PURE = ("schedule", "planner", "profile")
# The two profile sources run the model by design, and the live-bytes counter they share is a torch
# dispatch mode; the package loads them only on first use.
NEEDS_TORCH = {"profile.analytic", "profile.measure", "profile.live_bytes"}
UPSTREAM = ("runtime", "launch", "train", "cli", "__main__")


def _pure_modules() -> list[str]:
    mods = []
    for pkg in PURE:
        for f in sorted((PKG / pkg).glob("*.py")):
            name = pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"
            if name not in NEEDS_TORCH:
                mods.append(name)
    return mods


def test_pure_packages_import_without_torch():
    mods = _pure_modules()
    code = (
        "import sys, importlib\n"
        f"for m in {mods!r}: importlib.import_module('dapple_launch.' + m)\n"
        "heavy = sorted(k for k in ('torch', 'lightning', 'numpy.testing') if k in sys.modules)\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "torch" not in out.stdout.strip().split(","), (
        f"importing {len(mods)} pure modules loaded: {out.stdout.strip()}"
    )


def test_profile_sources_that_need_torch_still_load_on_first_use():
    from dapple_launch import profile

    assert callable(profile.analytic_profile) and callable(profile.measure_profile)
    with pytest.raises(AttributeError):
        profile.no_such_source  # noqa: B018


@pytest.mark.parametrize("module", _pure_modules())
def test_pure_modules_never_import_upstream(module):
    path = PKG / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = PKG / module / "__init__.py"
    tree = ast.parse(path.read_text())
    # the package a relative import starts from: the module's own for an __init__, else its parent's
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, target]) if target else ".".join(base)
            elif target.startswith("dapple_launch."):
                target = target[len("dapple_launch.") :]
            else:
                continue
            if target.split(".")[0] in UPSTREAM:
                bad.append(target)
        elif isinstance(node, ast.Import):
            bad += [
                a.name for a in node.names if a.name.startswith("dapple_launch.") and a.name.split(".")[1] in UPSTREAM
            ]
    assert not bad, f"{module} imports upstream {bad}: dependencies must point runtime → planner, never back"
