"""One process: every tiny Hugging Face family of tests/hf_models.py, cut into the pipeline's layers
(embed, each decoder layer, norm + head) and run one after another, gives HF's own loss and every
gradient of HF's own model on the same batch. The families differ in where they keep their parts
(nested layer lists, an embedding norm or projection before the first layer, a base-model prefix
they do not have, how a layer takes its index and returns its output): each is found by running the
family's code, which this test holds to HF's model. Several processes: tests/test_hf_numerics.py."""

from __future__ import annotations

import pytest

from .hf_models import configs, layers_against_hf, save

pytestmark = pytest.mark.slow  # (transformers' import and a dozen tiny models: a few seconds)
SEQ = 8


@pytest.mark.parametrize("family", sorted(configs()))
def test_every_family_cut_into_layers_gives_hfs_own_loss_and_gradients(tmp_path, family):
    got = layers_against_hf(save(family, tmp_path), SEQ)
    ours, ref_grads = got["grads"], got["hf_grads"]
    assert got["loss"] == pytest.approx(got["hf_loss"], rel=1e-5)
    assert set(ours) == set(ref_grads), set(ours) ^ set(ref_grads)
    for hf, g in ours.items():
        r = ref_grads[hf]
        assert (g - r).abs().max() <= 1e-5 * (r.abs().max() + 1e-12), (hf, (g - r).abs().max(), r.abs().max())


@pytest.mark.parametrize("family", sorted(configs()))
def test_every_dense_family_is_profiled_on_shapes_only_and_a_mixture_of_experts_is_refused_with_the_fix(
    tmp_path, family
):
    """The analytic profile traces each layer on fake tensors: the families' code around their layers
    that reads values (OPT's mask check and layer drop) takes its export path there; a layer that
    routes tokens by value (Mixtral's experts) cannot be traced by shape, and the refusal names it and
    the measured profile."""
    from dapple_launch.models.hf import HFCausalLM
    from dapple_launch.profile import analytic_profile

    model = HFCausalLM(path=str(save(family, tmp_path)), seq_len=SEQ)
    if family == "mixtral":
        with pytest.raises(ValueError, match=r"layer 1 \(layer0.*by its values.*strategy.profile_source=measured"):
            analytic_profile(model, 2, 100.0, "cpu")
        return
    profile = analytic_profile(model, 2, 100.0, "cpu")
    assert [layer.name for layer in profile.layers] == ["embed", "layer0", "layer1", "layer2", "head"]
    assert all(layer.forward_s > 0 and layer.saved_bytes > 0 for layer in profile.layers[1:])
