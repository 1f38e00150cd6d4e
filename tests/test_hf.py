"""model=hf through the product's own command: training on a local HF directory (sharded safetensors),
export back to a Hugging Face directory that `from_pretrained` reads to the pipeline's logits, and
bad input refused in one line before any process starts."""

from __future__ import annotations

import json

import pytest
import torch

from .conftest import cli
from .hf_models import save

pytestmark = pytest.mark.multiprocess
BASE = [
    "model=hf",
    "model.seq_len=8",
    "cluster=local",
    "cluster.devices_per_node=3",
    "strategy=fixed",
    "strategy.stages=2",
    "strategy.replicas=[2,1]",
    "strategy.num_micro_batches=2",
    "global_batch_size=6",
    "trainer.max_steps=4",
    "trainer.progress_bar=false",
    "trainer.checkpoint_every_n_steps=4",
]
RUN = [*BASE, "data.num_train=64", "data.num_val=8"]


def pipeline_logits(run_dir, ids):
    """The trained pipeline's logits: every layer built as the runtime builds it, loaded from the
    newest checkpoint, run in one process."""
    from omegaconf import OmegaConf

    from dapple_launch.models.contract import build_layer, run_layers
    from dapple_launch.plan_config import model_from_config
    from dapple_launch.runtime.checkpoint import find_checkpoints, read_shards

    model = model_from_config(OmegaConf.load(run_dir / "config.yaml").model)
    layers = [build_layer(s, i, 0) for i, s in enumerate(model.layers())]
    state, _ = read_shards(find_checkpoints(run_dir / "checkpoints")[-1])
    owners = {}
    for group in model.tied_parameters():
        owners.update({m: group[0] for m in group})
    for i, layer in enumerate(layers):
        for name, p in layer.named_parameters():
            key = f"layers.{i}.{name}"
            p.data.copy_(state[owners.get(key, key)])
    for layer in layers:
        layer.eval()
    with torch.no_grad():
        return run_layers(layers, ids)


@pytest.mark.parametrize("family", ["gpt2", "llama-tied", "opt"])
def test_an_hf_model_trains_on_an_uneven_layout_and_exports_to_what_from_pretrained_reads(tmp_path, family):
    import transformers

    src = save(family, tmp_path / "src", shard="20KB")  # sharded: an index and several files
    assert (src / "model.safetensors.index.json").is_file()
    run = tmp_path / "run"
    out = cli([*RUN, f"model.path={src}", f"hydra.run.dir={run}"], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    exported = tmp_path / "exported"
    out = cli([str(run), str(exported)], tmp_path, module=("dapple_launch.export",))
    assert out.returncode == 0, out.stdout + out.stderr
    assert {p.name for p in exported.iterdir()} >= {"config.json", "model.safetensors"}
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    ids = torch.randint(0, hf.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    ours = pipeline_logits(run, ids)
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5), (ours - theirs).abs().max()
    # trained: the exported weights moved from the source's
    before = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    with torch.no_grad():
        assert not torch.allclose(before(input_ids=ids).logits, theirs)


def test_a_random_init_from_a_config_only_directory_trains_and_logs_to_tensorboard(tmp_path):
    src = save("llama", tmp_path / "src")
    (src / "model.safetensors").unlink()
    run = tmp_path / "run"
    out = cli(
        [
            *RUN,
            f"model.config={src}",
            "model.init=random",
            "logger=tensorboard",
            "trainer.log_every_n_steps=1",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # logger=tensorboard: event files with the losses, the config and the plan among the hyperparameters
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "logs" / "tensorboard"))
    acc.Reload()
    assert "train_loss" in acc.Tags()["scalars"], acc.Tags()
    hparams = (run / "logs" / "tensorboard" / "hparams.yaml").read_text()
    assert "layout:" in hparams and "schedule:" in hparams and "hf" in hparams


def _refusal(out) -> str:
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    assert "Traceback" not in out.stderr
    return lines[-1]


def test_bad_hf_input_is_one_line_before_any_process(tmp_path):
    from safetensors.torch import load_file, save_file

    empty = tmp_path / "empty"
    empty.mkdir()
    dry = ["dry_run=true"]
    line = _refusal(cli([*RUN, *dry, f"model.path={empty}", f"hydra.run.dir={tmp_path / 'r1'}"], tmp_path))
    assert "no config.json" in line
    src = save("llama", tmp_path / "src")
    weights = load_file(src / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, src / "model.safetensors")
    line = _refusal(cli([*RUN, *dry, f"model.path={src}", f"hydra.run.dir={tmp_path / 'r2'}"], tmp_path))
    assert "no tensor model.layers.1.mlp.up_proj.weight" in line
    weights["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(weights, src / "model.safetensors")
    line = _refusal(cli([*RUN, *dry, f"model.path={src}", f"hydra.run.dir={tmp_path / 'r3'}"], tmp_path))
    assert "model.layers.1.mlp.up_proj.weight has shape [3, 3]" in line
    # an encoder-decoder is not embed → layers → norm + head
    import transformers

    t5 = tmp_path / "t5"
    transformers.T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2).save_pretrained(t5)
    line = _refusal(
        cli([*RUN, *dry, f"model.config={t5}", "model.init=random", f"hydra.run.dir={tmp_path / 'r4'}"], tmp_path)
    )
    assert "T5" in line, line
    assert json.loads((src / "config.json").read_text())["model_type"] == "llama"


def make_tokenizer(where, text: str, vocab: int):
    """A byte-level BPE trained on `text` (the tokenizers package), saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        [text],
        trainers.BpeTrainer(
            vocab_size=vocab, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    where.mkdir(parents=True, exist_ok=True)
    tok.save(str(where / "tokenizer.json"))
    return tok


TEXT = "the quick brown fox jumps over the lazy dog. " * 40 + "a stitch in time saves nine. " * 40


def test_text_through_the_models_tokenizer_trains_and_prepares(tmp_path):
    import numpy as np

    src = save("llama", tmp_path / "src")  # vocabulary of 61... too small for a byte-level BPE
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    big = tmp_path / "tok-big"
    tok = make_tokenizer(big, TEXT, 300)
    line = _refusal(
        cli(
            [
                *BASE,
                "dry_run=true",
                f"model.path={src}",
                "data=text_file",
                f"data.path={corpus}",
                f"data.tokenizer={big}",
                f"hydra.run.dir={tmp_path / 'r0'}",
            ],
            tmp_path,
        )
    )
    assert f"has {tok.get_vocab_size()} tokens but model hf has vocab_size 61" in line, line
    # a model whose embedding holds the tokenizer's ids trains on the encoded text
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    fit = tmp_path / "fit"
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(fit)
    run = tmp_path / "run"
    out = cli(
        [
            *BASE,
            f"model.path={fit}",
            "data=text_file",
            f"data.path={corpus}",
            f"data.tokenizer={big}",
            "data.val_fraction=0.2",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # prepare writes the same ids as a token file
    tokens = tmp_path / "corpus.bin"
    out = cli([str(corpus), str(tokens), "--tokenizer", str(big)], tmp_path, module=("dapple_launch.data.prepare",))
    assert out.returncode == 0, out.stderr
    ids = np.fromfile(tokens, dtype=np.uint16)
    assert ids.tolist() == tok.encode(TEXT, add_special_tokens=False).ids


def test_model_llama_exports_to_what_hfs_llama_reads_with_the_same_logits(tmp_path):
    """model=llama's arithmetic is Hugging Face Llama's: a checkpoint trained on an uneven layout
    exports to a directory LlamaForCausalLM reads to the pipeline's logits (grouped-query attention,
    tied embeddings, rotary positions)."""
    import transformers

    run = tmp_path / "run"
    shape = [
        "model.num_layers=3",
        "model.hidden=32",
        "model.heads=4",
        "model.kv_heads=2",
        "model.ffn_hidden=48",
        "model.seq_len=8",
        "model.vocab_size=61",
    ]
    out = cli(["model=llama", *shape, *RUN[2:], f"hydra.run.dir={run}"], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    exported = tmp_path / "exported"
    out = cli([str(run), str(exported)], tmp_path, module=("dapple_launch.export",))
    assert out.returncode == 0, out.stdout + out.stderr
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.tie_word_embeddings
    ids = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    ours = pipeline_logits(run, ids)
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5), (ours - theirs).abs().max()
