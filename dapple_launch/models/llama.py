"""A Llama-family decoder in the box (`model=llama`): RMSNorm, rotary position embeddings, SwiGLU,
grouped-query attention, optional tied embeddings, as layers the planner can cut anywhere.

Its parameters carry Hugging Face Llama's names (embed_tokens, self_attn.q_proj, mlp.gate_proj,
input_layernorm, norm, lm_head) and its arithmetic is that model's (RMSNorm in fp32, rotate-half
rotary), so a checkpoint exports to a directory `LlamaForCausalLM.from_pretrained` reads to the same
logits (export.py). Token slices (TeraPipe) and recomputation work on it as on `gpt`: positions are
absolute under a slice, attention goes through `TokenSlice.attend`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .contract import LayerSpec, PipelineModel, on_meta
from .token_slices import current
from .transformer import _per_sample_ce, next_token_batch, slice_ce


@dataclass(frozen=True)
class LlamaShape:
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    seq_len: int
    vocab_size: int
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


LLAMA_PRESETS = {
    "tiny": LlamaShape(4, 64, 4, 2, 176, 64, 256, rope_theta=10_000.0, tie_embeddings=True),
    # Llama 3.2 1B, Llama 3 8B and 70B, shaped for planning (sequence length 2048, 4096 and 4096)
    "1b": LlamaShape(16, 2048, 32, 8, 8192, 2048, 128_256, tie_embeddings=True),
    "8b": LlamaShape(32, 4096, 32, 8, 14_336, 4096, 128_256),
    "70b": LlamaShape(80, 8192, 64, 8, 28_672, 4096, 128_256),
}


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    inv_freq: torch.Tensor  # (a buffer)

    def __init__(self, s: LlamaShape):
        super().__init__()
        self.s = s
        d = s.head_dim
        self.q_proj = nn.Linear(s.hidden, s.heads * d, bias=False)
        self.k_proj = nn.Linear(s.hidden, s.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(s.hidden, s.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(s.heads * d, s.hidden, bias=False)
        # rotary frequencies: built here, never stored (a checkpoint or an HF directory does not hold them)
        self.register_buffer(
            "inv_freq", 1.0 / (s.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)), persistent=False
        )

    def rotary(self, start: int, length: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(start, start + length, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.to(device=device, dtype=torch.float32))
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, (n, t, _) = self.s, x.shape
        d = s.head_dim
        q = self.q_proj(x).view(n, t, s.heads, d).transpose(1, 2)
        k = self.k_proj(x).view(n, t, s.kv_heads, d).transpose(1, 2)
        v = self.v_proj(x).view(n, t, s.kv_heads, d).transpose(1, 2)
        piece = current()  # a token slice: its absolute positions, and the earlier slices' keys and values
        cos, sin = self.rotary(piece.start if piece is not None else 0, t, x.device, q.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if s.kv_heads != s.heads:  # grouped-query attention: each key/value head serves heads/kv_heads queries
            k = k.repeat_interleave(s.heads // s.kv_heads, dim=1)
            v = v.repeat_interleave(s.heads // s.kv_heads, dim=1)
        if piece is not None:
            a = piece.attend(self, q, k, v)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(a.transpose(1, 2).reshape(n, t, s.heads * d))


class MLP(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(s.ffn_hidden, s.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden, s.norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.norm_eps)
        self.mlp = MLP(s)
        for m in self.modules():  # Llama's initialisation: N(0, 0.02) for every projection
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Embed(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)


class Head(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.norm = RMSNorm(s.hidden, s.norm_eps)
        self.lm_head = nn.Linear(s.hidden, s.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


class Llama(PipelineModel):
    """layers = [embed, decoder 0 … n-1, norm + head]."""

    def __init__(self, shape: LlamaShape, name: str = "llama"):
        if shape.hidden % shape.heads or shape.heads % shape.kv_heads or shape.head_dim % 2:
            raise ValueError(
                f"model {name}: hidden {shape.hidden} must split into heads {shape.heads} of an even size, "
                f"and heads into kv_heads {shape.kv_heads} groups"
            )
        self.shape, self.name = shape, name

    @property
    def seq_len(self) -> int:
        return self.shape.seq_len

    @property
    def vocab_size(self) -> int:
        return self.shape.vocab_size

    def layers(self) -> list[LayerSpec]:
        s = self.shape
        return (
            [LayerSpec("embed", lambda: Embed(s))]
            + [LayerSpec(f"layer{i}", lambda: DecoderLayer(s)) for i in range(s.num_layers)]
            + [LayerSpec("head", lambda: Head(s))]
        )

    def tied_parameters(self) -> list[list[str]]:
        if not self.shape.tie_embeddings:
            return []
        return [["layers.0.embed_tokens.weight", f"layers.{self.shape.num_layers + 1}.lm_head.weight"]]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return _per_sample_ce(output, target)

    def slice_loss(self, output: torch.Tensor, target: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Token slicing (TeraPipe): tokens [start, stop)'s share of the per-sample loss."""
        return slice_ce(output, target, start, stop)

    def batch(self, n, generator=None, device="cpu"):
        return next_token_batch(self.shape.vocab_size, self.shape.seq_len, n, generator, device)

    def describe(self) -> dict:
        return {"name": self.name, "kind": "Llama", **self.shape.__dict__}

    # ---- Hugging Face names (export.py) ----------------------------------------------------------
    def hf_name(self, position: int, name: str) -> str:
        if position == 0:
            return f"model.{name}"
        if position == self.shape.num_layers + 1:
            return name if name.startswith("lm_head") else f"model.{name}"
        return f"model.layers.{position - 1}.{name}"

    def hf_config(self):
        import transformers

        s = self.shape
        return transformers.LlamaConfig(
            vocab_size=s.vocab_size,
            hidden_size=s.hidden,
            intermediate_size=s.ffn_hidden,
            num_hidden_layers=s.num_layers,
            num_attention_heads=s.heads,
            num_key_value_heads=s.kv_heads,
            max_position_embeddings=s.seq_len,
            rms_norm_eps=s.norm_eps,
            rope_theta=s.rope_theta,
            tie_word_embeddings=s.tie_embeddings,
            architectures=["LlamaForCausalLM"],
        )

    def hf_expected(self) -> set[str]:
        """The tensors a Hugging Face Llama directory of this shape holds (a tied head is stored once)."""
        with on_meta():
            names = {
                self.hf_name(i, n) for i, spec in enumerate(self.layers()) for n, _ in spec.build().named_parameters()
            }
        if self.shape.tie_embeddings:
            names.discard("lm_head.weight")
        return names
