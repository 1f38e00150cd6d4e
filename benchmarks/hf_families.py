"""Every Hugging Face causal-LM family we could configure small, cut into the pipeline's layers
(model=hf: embed, each decoder layer, norm + head) and run one after another in one process, against
HF's own model on the same batch: the loss, the largest logit difference, and the worst gradient
(relative to the largest of HF's, per tensor; a tied embedding's two uses summed, as the runtime
sums them). Then whether the analytic profile (shapes only, profile/analytic.py) traces it.

Families are tried by what `transformers` ships, not by a list the code knows: a family this
version lacks is shown as skipped. tests/test_hf_families.py holds eleven of them to the same check.

    python benchmarks/hf_families.py [--out benchmarks/results/hf_families.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dapple_launch.profile import analytic_profile  # noqa: E402
from tests.hf_models import BLOOM, GPT, GPT_NEO, OPT, VOCAB, layers_against_hf  # noqa: E402
from tests.hf_models import SMALL as TESTS_SMALL  # noqa: E402

SMALL = {**TESTS_SMALL, "pad_token_id": 0}  # (families whose default pad id lies past a 61-token vocabulary)
FAMILIES = {  # config class: its arguments for a three-layer model of width 32
    "LlamaConfig": SMALL,
    "MistralConfig": SMALL,
    "MixtralConfig": {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2},
    "PhiConfig": {**SMALL, "resid_pdrop": 0.0, "embd_pdrop": 0.0},
    "Phi3Config": SMALL,
    "GemmaConfig": {**SMALL, "head_dim": 8},
    "Gemma2Config": {**SMALL, "head_dim": 8, "sliding_window": 4},
    "Gemma3TextConfig": {**SMALL, "head_dim": 8, "sliding_window": 4},
    "Qwen2Config": {**SMALL, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
    "Qwen3Config": {**SMALL, "head_dim": 8},
    "Qwen2MoeConfig": {
        **SMALL,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 16,
    },
    "Qwen3MoeConfig": {**SMALL, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    "OlmoConfig": SMALL,
    "Olmo2Config": SMALL,
    "StableLmConfig": SMALL,
    "Starcoder2Config": {**SMALL, "residual_dropout": 0.0, "embedding_dropout": 0.0},
    "CohereConfig": SMALL,
    "GraniteConfig": {**SMALL, "embedding_multiplier": 2.0, "logits_scaling": 4.0, "residual_multiplier": 0.5},
    "SmolLM3Config": SMALL,
    "GlmConfig": {**SMALL, "head_dim": 8},
    "Exaone4Config": SMALL,
    "Llama4TextConfig": {**SMALL, "head_dim": 8, "num_local_experts": 2, "intermediate_size_mlp": 64},
    "DeepseekV3Config": {
        **SMALL,
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 8,
        "q_lora_rank": 16,
        "qk_rope_head_dim": 4,
        "qk_nope_head_dim": 4,
        "v_head_dim": 8,
        "n_group": 1,
        "topk_group": 1,
    },
    "GPT2Config": GPT,
    "GPTBigCodeConfig": GPT,
    "GPTJConfig": {**GPT, "rotary_dim": 4},
    "CodeGenConfig": {**GPT, "rotary_dim": 4},
    "GPTNeoConfig": GPT_NEO,
    "GPTNeoXConfig": {k: v for k, v in SMALL.items() if k != "num_key_value_heads"},
    "OPTConfig": OPT,
    "BloomConfig": BLOOM,
    "FalconConfig": {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4},
    "MambaConfig": {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 3, "state_size": 4},
}


def check(config, where: Path) -> dict:
    import transformers

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(where)
    got = layers_against_hf(where)
    ours, ref = got["grads"], got["hf_grads"]
    worst = max(((g - ref[n]).abs().max() / (ref[n].abs().max() + 1e-12)).item() for n, g in ours.items())
    try:
        analytic_profile(got["model"], 2, 100.0, "cpu")
        profile = "traced"
    except ValueError as exc:
        profile = f"refused: {str(exc)[:90]}…"
    return {
        "architecture": got["model"].anatomy.arch,
        "loss": got["loss"],
        "hf_loss": got["hf_loss"],
        "logit_diff": (got["logits"] - got["hf_logits"]).abs().max().item(),
        "gradients": f"{len(set(ours) & set(ref))}/{len(ref)}",
        "worst_gradient": worst,
        "analytic_profile": profile,
    }


def main() -> None:
    import transformers

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hf_families.json"))
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    rows = []
    print(f"transformers {transformers.__version__}, torch {torch.__version__}\n")
    print(
        "| config | architecture | loss (ours / HF) | max logit diff | gradients | worst gradient | analytic profile |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, kwargs in FAMILIES.items():
            cls = getattr(transformers, name, None)
            if cls is None:
                rows.append({"config": name, "skipped": f"not in transformers {transformers.__version__}"})
                print(f"| {name} | (not in this transformers) | | | | | |")
                continue
            try:
                row = {"config": name, **check(cls(**kwargs), Path(tmp) / name)}
                print(
                    f"| {name} | {row['architecture']} | {row['loss']:.6f} / {row['hf_loss']:.6f} | "
                    f"{row['logit_diff']:.1e} | {row['gradients']} | {row['worst_gradient']:.1e} | "
                    f"{row['analytic_profile']} |",
                    flush=True,
                )
            except Exception as exc:  # a family this tool cannot pipeline: the table says so and why
                row = {"config": name, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
                print(f"| {name} | FAILED | {row['error']} | | | | |", flush=True)
            rows.append(row)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    ok = [r for r in rows if "loss" in r and abs(r["loss"] - r["hf_loss"]) <= 1e-5 * abs(r["hf_loss"])]
    print(
        f"\n{len(ok)} of {len(rows)} families give HF's loss; worst gradient over them "
        f"{max((r['worst_gradient'] for r in ok), default=0):.1e}"
    )


if __name__ == "__main__":
    main()
