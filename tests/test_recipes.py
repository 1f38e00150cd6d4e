"""Every shipped recipe (`python -m dapple_launch +recipe=NAME`) plans in a dry run; the CPU ones
train a few steps. A recipe that needs your data gets a file of the kind it names."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from dapple_launch.cli import compose
from dapple_launch.config import CONF_DIR

from .conftest import cli

RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").glob("*.yaml"))
LICENSE = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"


def test_the_recipes_the_design_names_exist():
    assert {
        "cpu-demo",
        "gpt2-medium-a100x64",
        "bert-large-v100x16",
        "vgg19-15-1-v100-16x1",
        "your-model-your-text",
        "hf-finetune",
    } <= set(RECIPES)
    assert (Path(__file__).resolve().parent.parent / "recipes" / "cpu-demo.yaml").is_file()  # the top-level view


def data_for(recipe: str, tmp_path: Path) -> list[str]:
    """The data.path override a recipe needs: a text file, or token ids below the model's vocabulary."""
    cfg = compose([f"+recipe={recipe}"])
    if cfg.model.name == "hf":  # a tiny Llama directory with its own tokenizer, and text for it
        from .hf_models import transformers
        from .test_hf import TEXT, make_tokenizer

        where = tmp_path / "hf-model"
        tok = make_tokenizer(where, TEXT, 300)
        config = transformers.LlamaConfig(
            vocab_size=tok.get_vocab_size(),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
        )
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(where)
        text = tmp_path / "text.txt"
        text.write_text(TEXT * 4)
        return [f"model.path={where}", f"data.path={text}"]
    if cfg.data.kind == "synthetic" or not OmegaConf.is_missing(cfg.data, "path"):
        return []
    if cfg.data.kind == "text_file":
        return [f"data.path={LICENSE}"]
    from dapple_launch.plan_config import model_from_config

    model = model_from_config(cfg.model)
    windows = int(cfg.global_batch_size / (1 - cfg.data.val_fraction)) + 4
    ids = np.random.default_rng(0).integers(1, model.vocab_size, windows * model.seq_len + 1, dtype=np.uint16)
    path = tmp_path / f"{recipe}.bin"
    ids.tofile(path)
    return [f"data.path={path}"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_plans_in_a_dry_run(tmp_path, recipe):
    run = tmp_path / "run"
    out = cli([f"+recipe={recipe}", *data_for(recipe, tmp_path), "dry_run=true", f"hydra.run.dir={run}"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    plan = json.loads((run / "plan.json").read_text())
    assert plan["micro_batch_size"] * plan["num_micro_batches"] == plan["global_batch_size"]
    assert "nothing started" in out.stdout
    # the plan a dry run prints is one the launch accepts: the checks Slurm submission and
    # strategy=file run (bert-large-v100x16 plans ZB-V, whose device groups hold two stages each)
    from dapple_launch.plan_config import topology_from_config
    from dapple_launch.planner.plan import Plan
    from dapple_launch.runtime.placement import check_plan_runs_on

    written = Plan.load(run / "plan.json")
    check_plan_runs_on(written, topology_from_config(compose([f"+recipe={recipe}"]).cluster), written.num_layers)


@pytest.mark.slow
def test_the_vgg_recipe_is_dapples_uneven_split(tmp_path):
    out = cli(["+recipe=vgg19-15-1-v100-16x1", "dry_run=true", f"hydra.run.dir={tmp_path}/v"], tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads((tmp_path / "v" / "plan.json").read_text())
    assert [s["replicas"] for s in plan["stages"]] == [15, 1] and plan["stages"][1]["layer_names"][0] == "fc1"


@pytest.mark.multiprocess
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_cpu_recipes_train(tmp_path, recipe):
    # (which recipes run here is asked when the test runs: composing all of them at collection cost
    # every pytest worker 0.5-1 s of its collection, the fast tier's included, which never runs this test)
    cluster = compose([f"+recipe={recipe}"]).cluster
    if cluster.name != "local":
        pytest.skip(f"recipe {recipe} runs on {cluster.name}: its dry run is test_every_recipe_plans_in_a_dry_run's")
    run = tmp_path / "run"
    out = cli(
        [
            f"+recipe={recipe}",
            *data_for(recipe, tmp_path),
            "trainer.max_steps=3",
            "trainer.progress_bar=false",
            "trainer.val_check_interval=3",
            "trainer.limit_val_batches=1",
            "trainer.checkpoint_every_n_steps=3",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (run / "checkpoints").is_dir()
