"""Several gloo processes: a Hugging Face causal LM pipelined by the runtime gives HF's own loss
(`model(input_ids, labels=...)`) and every gradient of HF's own model on the same batch: GPT-2 and
Llama (tied and untied), on 1, 2 and 4 stages and with uneven replicas; Gemma-2 (sliding and full
layers mixed, soft-capped logits), Qwen-2, OPT, Gemma-3, GPT-Neo on 2 stages and Bloom with uneven replicas."""

from __future__ import annotations

import pytest
import torch

from .hf_models import save
from .multiproc import run_ranks
from .test_pipeline_numerics import make_plan, pipelined

pytestmark = pytest.mark.multiprocess
SEQ = 8


def _hf_compare(rank, world, path, replicas, schedule, num_micro_batches, batch_n, plan_json):
    import transformers

    from dapple_launch.models.hf import HFCausalLM
    from dapple_launch.planner import Plan

    plan = Plan.from_json(plan_json)
    model = HFCausalLM(path=path, seq_len=SEQ)
    x, y = model.batch(batch_n, torch.Generator().manual_seed(1))
    # HF's own model and loss: `shift_labels` gives the targets as they are (the batch is already
    # shifted); a family whose forward takes no shift_labels (Bloom) is scored on its own logits
    ref = transformers.AutoModelForCausalLM.from_pretrained(path)
    ref.train()
    try:
        ref_loss = ref(input_ids=x, labels=y, shift_labels=y.contiguous()).loss
    except (TypeError, ValueError):
        ref_loss = model.loss(ref(input_ids=x).logits, y).mean()
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    local, _, loss = pipelined(model, plan, rank, (x, y))
    worst, compared = 0.0, []
    for name, p in local.named_parameters(remove_duplicate=False):
        _, position, rest = name.split(".", 2)
        hf = model.hf_name(int(position), rest)
        if hf not in ref_grads and model.anatomy.tied:
            hf = f"{model.anatomy.input_name}.weight"  # the tied head is HF's embedding
        r = ref_grads[hf]
        worst = max(worst, (p.grad - r).abs().max().item() / (r.abs().max().item() + 1e-12))
        compared.append(hf)
    return {
        "loss": loss.item(),
        "ref_loss": ref_loss.item(),
        "worst": worst,
        "compared": compared,
        "all": sorted(ref_grads),
    }


CASES = [  # (family, replicas per stage, schedule, micro-batches, batch)
    ("gpt2", (1,), "1f1b", 2, 4),
    ("gpt2", (1, 1), "1f1b", 2, 4),
    ("gpt2", (1, 1, 1, 1), "1f1b", 4, 8),
    ("gpt2", (2, 1), "1f1b", 2, 6),
    ("llama", (1,), "1f1b", 2, 4),
    ("llama", (1, 1), "zb_h1", 3, 6),
    ("llama", (1, 1, 1, 1), "1f1b", 4, 8),
    ("llama", (1, 2), "gpipe", 2, 6),
    ("llama-tied", (1, 1, 1, 1), "1f1b", 4, 8),
    ("llama-tied", (2, 1), "1f1b", 2, 6),
    ("gemma2", (1, 1), "1f1b", 2, 4),
    ("qwen2", (1, 1), "1f1b", 2, 4),
    ("opt", (1, 1), "1f1b", 2, 4),
    ("bloom", (2, 1), "1f1b", 2, 6),
    ("gemma3", (1, 1), "1f1b", 2, 4),
    ("gpt_neo", (1, 1), "zb_h1", 2, 4),
]


def _many(rank, world, cases):
    return [_hf_compare(rank, world, *case) for case in cases]


def test_pipelined_hf_models_give_hfs_own_loss_and_gradients(tmp_path):
    from dapple_launch.models.hf import HFCausalLM

    dirs = {name: str(save(name, tmp_path)) for name in {c[0] for c in CASES}}
    by_world: dict[int, list] = {}
    for family, replicas, schedule, m, n in CASES:
        model = HFCausalLM(path=dirs[family], seq_len=SEQ)
        plan = make_plan(model, replicas, schedule, m, n)
        by_world.setdefault(sum(replicas), []).append((dirs[family], replicas, schedule, m, n, plan.to_json()))
    for world, cases in by_world.items():
        per_rank = run_ranks(world, _many, (cases,), tmp_path)
        for j, case in enumerate(cases):
            results = [r[j] for r in per_rank]
            what = f"{case[0].rsplit('/', 1)[-1]} {case[1]} {case[2]}"
            assert results[0]["loss"] == pytest.approx(results[0]["ref_loss"], rel=1e-5), what
            assert max(r["worst"] for r in results) < 1e-4, (what, [r["worst"] for r in results])
            # every HF parameter is some rank's, and was compared
            assert set().union(*[r["compared"] for r in results]) == set(results[0]["all"]), what
