"""The analytic profile kept on disk (profile/analytic_cache.py): read back for the same model and
code, traced again when a source file of the model changes, and never the reason a launch fails;
and the shape-only builds on the meta device (models.contract.on_meta) that keep a launch from
loading torch._dynamo."""

from __future__ import annotations

import importlib
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import dapple_launch
from dapple_launch.cache import cache_dir
from dapple_launch.log import get_logger
from dapple_launch.models import BERT_PRESETS, GPT_PRESETS, LLAMA_PRESETS, VGG_PRESETS, build_model
from dapple_launch.models.contract import LayerSpec, PipelineModel, on_meta
from dapple_launch.profile import analytic
from dapple_launch.profile.analytic_cache import cached_analytic_profile, loaded_sources

from .custom_models.skipnet import build as build_skipnet

EXAMPLE = Path(dapple_launch.__file__).parent / "examples" / "tiny_lm.py"


def _user_model(tmp_path: Path, monkeypatch, name: str):
    """The README's example model, as a user's own module in their own directory."""
    shutil.copy(EXAMPLE, tmp_path / f"{name}.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


@pytest.mark.slow  # (traces: torch._dynamo's import, 3 s)
def test_the_profile_is_read_back_until_the_models_code_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path / "cache"))
    module = _user_model(tmp_path, monkeypatch, "cached_lm")
    model = module.build(hidden=32, layers=2, heads=2)
    traced = analytic.analytic_profile(model, 2, 0.05, "local")
    first = cached_analytic_profile(model, 2, 0.05, "local")
    assert first == traced
    (entry,) = cache_dir().glob("analytic-*.json")
    assert str(tmp_path / "cached_lm.py") in entry.read_text()  # the user's module is one of its sources

    def no_trace(*args, **kwargs):
        raise AssertionError("traced again")

    monkeypatch.setattr(analytic, "analytic_profile", no_trace)
    assert cached_analytic_profile(model, 2, 0.05, "local") == first  # read back, not traced
    # another batch, device speed or precision is another entry
    with pytest.raises(AssertionError, match="traced again"):
        cached_analytic_profile(model, 4, 0.05, "local")
    with pytest.raises(AssertionError, match="traced again"):
        cached_analytic_profile(model, 2, 0.05, "local", precision="bf16-mixed")
    # the user widens the feed-forward in the code, not in the arguments: traced again, to new figures
    source = tmp_path / "cached_lm.py"
    source.write_text(source.read_text().replace("4 * hidden", "8 * hidden"))
    with pytest.raises(AssertionError, match="traced again"):
        cached_analytic_profile(model, 2, 0.05, "local")
    monkeypatch.undo()  # (the real trace, and the module as edited)
    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path))
    wider = importlib.reload(module).build(hidden=32, layers=2, heads=2)
    after = cached_analytic_profile(wider, 2, 0.05, "local")
    assert after == analytic.analytic_profile(wider, 2, 0.05, "local")
    assert after.layers[1].parameter_bytes > first.layers[1].parameter_bytes
    assert after.layers[1].forward_s > first.layers[1].forward_s


@pytest.mark.slow
def test_a_damaged_or_unwritable_cache_only_means_tracing_again(tmp_path, monkeypatch):
    model = build_skipnet(hidden=16, layers=2)
    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path / "cache"))
    first = cached_analytic_profile(model, 2, 0.05, "local")
    (entry,) = cache_dir().glob("analytic-*.json")
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())
    get_logger().addHandler(handler)
    try:
        for damage in (entry.read_bytes()[:40], b"\xff\xfe" + entry.read_bytes(), b'{"sources": {}}'):
            entry.write_bytes(damage)
            assert cached_analytic_profile(model, 2, 0.05, "local") == first
            assert any(str(entry) in x for x in lines), lines
            lines.clear()
    finally:
        get_logger().removeHandler(handler)
    # a cache that cannot be written: a file where its directory would be
    (tmp_path / "blocked").write_text("")
    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path / "blocked"))
    assert cached_analytic_profile(model, 2, 0.05, "local") == first


def test_the_sources_are_the_models_and_this_packages_not_installed_libraries():
    sources = loaded_sources()
    assert str(Path(analytic.__file__)) in sources and str(Path(__file__)) in sources
    assert not [p for p in sources if "site-packages" in p and "dapple_launch" not in p]
    assert torch.__file__ not in sources


def test_shapes_on_meta_are_the_same_without_the_random_fills():
    """on_meta builds what torch.device("meta") builds: every parameter and buffer, its shape and dtype."""
    models = [
        build_model("gpt", next(iter(GPT_PRESETS))),
        build_model("bert", next(iter(BERT_PRESETS))),
        build_model("vgg19", next(iter(VGG_PRESETS))),
        build_model("llama", next(iter(LLAMA_PRESETS))),
        build_skipnet(hidden=16, layers=2),
    ]
    for model in models:
        for spec in model.layers():
            with on_meta():
                a = spec.build()
            with torch.device("meta"):
                b = spec.build()
            for one, other in ((a.named_parameters(), b.named_parameters()), (a.named_buffers(), b.named_buffers())):
                assert [(n, t.shape, t.dtype, t.is_meta) for n, t in one] == [
                    (n, t.shape, t.dtype, t.is_meta) for n, t in other
                ], (model.name, spec.name)


@pytest.mark.slow
def test_a_gpt_launchers_shape_builds_load_no_dynamo():
    """Counting a GPT's parameters and tied weights on the meta device (what the launcher does with a
    cached profile) leaves torch._dynamo unloaded: 3 s of every launch."""
    code = (
        "import sys\n"
        "from dapple_launch.models import build_model\n"
        "from dapple_launch.models.contract import tied_owners\n"
        "from dapple_launch.plan_config import parameter_count, tied_sizes\n"
        "m = build_model('gpt', 'small')\n"
        "assert parameter_count(m) > 0 and tied_sizes(m, tied_owners(m))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


class _Made(PipelineModel):
    """A model made in code, known by its name alone (no factory, the default describe())."""

    name = "made"

    def __init__(self, width: int):
        self.width = width

    def layers(self):
        w = self.width
        return [LayerSpec("in", lambda: nn.Linear(8, w)), LayerSpec("out", lambda: nn.Linear(w, 8))]

    def loss(self, output, target):
        return ((output - target) ** 2).mean(1)

    def batch(self, n, generator=None, device="cpu"):
        return torch.randn(n, 8, generator=generator).to(device), torch.randn(n, 8, generator=generator).to(device)


@pytest.mark.slow
def test_models_made_in_code_that_describe_themselves_alike_are_kept_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path / "cache"))
    narrow, wide = (
        cached_analytic_profile(_Made(16), 2, 0.05, "local"),
        cached_analytic_profile(_Made(64), 2, 0.05, "local"),
    )
    assert narrow == analytic.analytic_profile(_Made(16), 2, 0.05, "local")
    assert wide == analytic.analytic_profile(_Made(64), 2, 0.05, "local")
    assert wide.layers[0].parameter_bytes == 4 * narrow.layers[0].parameter_bytes  # 8x16 + 16 -> 8x64 + 64
    assert len(list(cache_dir().glob("analytic-made-*.json"))) == 2
