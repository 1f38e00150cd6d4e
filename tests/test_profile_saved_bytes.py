"""The analytic profile's saved bytes per layer are the bytes a real run keeps for backward, counted
exactly with saved-tensor hooks (the loss's included on the last layer): the planner's memory
estimate rests on them (benchmarks/models.py compares whole stages through the runtime)."""

from __future__ import annotations

import pytest
import torch

from dapple_launch.models import build_model
from dapple_launch.models.contract import build_layer
from dapple_launch.profile import analytic_profile

from .saved_bytes import SavedBytes

MODELS = {
    "llama": dict(num_layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, seq_len=32, vocab_size=96),
    "gpt": dict(num_layers=2, hidden=64, heads=4, seq_len=32, vocab_size=96),
}


# bf16's case (over a second each, as the README's rule for the fast tier puts it) runs in CI's tier
@pytest.mark.parametrize("precision", ["32", pytest.param("bf16-mixed", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_analytic_saved_bytes_are_the_exact_saved_bytes(name, precision):
    model = build_model(name, "tiny", **MODELS[name])
    profile = analytic_profile(model, 2, 1.0, "cpu", precision=precision)
    x, y = model.batch(2, torch.Generator().manual_seed(0))
    specs = model.layers()
    for i, (spec, layer_profile) in enumerate(zip(specs, profile.layers)):
        layer = build_layer(spec, i, 0)
        counter = SavedBytes(list(layer.parameters()))
        given = x.detach().requires_grad_() if x.is_floating_point() else x
        mixed = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "32")
        with counter.hooks(), mixed:
            out = layer(given)
            if i == len(specs) - 1:
                model.loss(out, y).sum()
        assert layer_profile.saved_bytes == pytest.approx(counter.peak, rel=0.01), (spec.name, precision)
        x = out.detach()
