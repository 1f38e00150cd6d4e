"""GPT (causal language model) and BERT (masked language model) as layer lists."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .contract import LayerSpec, PipelineModel
from .token_slices import current

IGNORE = -100


@dataclass(frozen=True)
class TransformerShape:
    num_layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab_size: int
    ffn_mult: int = 4
    dropout: float = 0.0
    tie_embeddings: bool = True  # the token embedding and the output projection are one weight


GPT_PRESETS = {
    "tiny": TransformerShape(4, 64, 4, 64, 64),
    "small": TransformerShape(12, 768, 12, 1024, 50257),  # GPT-2 small
    "medium": TransformerShape(24, 1024, 16, 1024, 50257),
    "large": TransformerShape(36, 1280, 20, 1024, 50257),
    "xl": TransformerShape(48, 1600, 25, 1024, 50257),
}
BERT_PRESETS = {
    "tiny": TransformerShape(4, 64, 4, 64, 64),
    "base": TransformerShape(12, 768, 12, 512, 30522),
    "large": TransformerShape(24, 1024, 16, 512, 30522),  # BERT-large
    "48": TransformerShape(48, 1024, 16, 512, 30522),  # DAPPLE's BERT-48
}


class Embedding(nn.Module):
    def __init__(self, s: TransformerShape):
        super().__init__()
        self.token = nn.Embedding(s.vocab_size, s.hidden)
        self.position = nn.Embedding(s.seq_len, s.hidden)
        self.drop = nn.Dropout(s.dropout)
        # GPT-2's initialisation: with the output projection tied to the token embedding, torch's
        # N(0, 1) would make the first logits hundreds of nats wide
        nn.init.normal_(self.token.weight, std=0.02)
        nn.init.normal_(self.position.weight, std=0.01)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        piece = current()  # a token slice: its absolute positions
        start = piece.start if piece is not None else 0
        pos = torch.arange(start, start + ids.shape[1], device=ids.device)
        return self.drop(self.token(ids) + self.position(pos))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, s: TransformerShape, causal: bool):
        super().__init__()
        self.heads, self.causal, self.dropout = s.heads, causal, s.dropout
        self.ln1 = nn.LayerNorm(s.hidden)
        self.qkv = nn.Linear(s.hidden, 3 * s.hidden)
        self.proj = nn.Linear(s.hidden, s.hidden)
        self.ln2 = nn.LayerNorm(s.hidden)
        self.fc1 = nn.Linear(s.hidden, s.ffn_mult * s.hidden)
        self.fc2 = nn.Linear(s.ffn_mult * s.hidden, s.hidden)
        self.drop = nn.Dropout(s.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        piece = current() if self.causal else None
        if piece is not None:  # a token slice: the earlier slices' keys and values from the stage's cache
            a = piece.attend(self, q, k, v, dropout_p=self.dropout if self.training else 0.0)
        else:
            a = F.scaled_dot_product_attention(
                q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0
            )
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(n, t, h)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class Head(nn.Module):
    def __init__(self, s: TransformerShape):
        super().__init__()
        self.ln = nn.LayerNorm(s.hidden)
        self.out = nn.Linear(s.hidden, s.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def _per_sample_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    token = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=IGNORE, reduction="none")
    token = token.view(target.shape)
    counted = (target != IGNORE).sum(1).clamp(min=1)
    return token.sum(1) / counted


def slice_ce(output: torch.Tensor, target: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """A causal model's per-sample loss share of tokens [start, stop) (TeraPipe's slices): their summed
    cross-entropy over the sequence's counted tokens, so the slices' shares sum to the whole loss."""
    part = target[:, start:stop]
    token = F.cross_entropy(output.flatten(0, 1), part.flatten(), ignore_index=IGNORE, reduction="none")
    counted = (target != IGNORE).sum(1).clamp(min=1)
    return token.view(part.shape).sum(1) / counted


def next_token_batch(vocab_size: int, seq_len: int, n: int, generator=None, device: str | torch.device = "cpu"):
    """n random sequences as (ids, the next ids): a causal language model's example batch."""
    ids = torch.randint(0, vocab_size, (n, seq_len + 1), generator=generator).to(device)
    return ids[:, :-1], ids[:, 1:]


class _Transformer(PipelineModel):
    causal = True

    def __init__(self, shape: TransformerShape, name: str):
        if shape.hidden % shape.heads:
            raise ValueError(f"model {name}: hidden {shape.hidden} is not divisible by heads {shape.heads}")
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
            [LayerSpec("embed", lambda: Embedding(s))]
            + [LayerSpec(f"block{i}", lambda: Block(s, self.causal)) for i in range(s.num_layers)]
            + [LayerSpec("head", lambda: Head(s))]
        )

    def tied_parameters(self) -> list[list[str]]:
        # GPT-2 and BERT: the output projection is the token embedding (both vocab × hidden)
        if not self.shape.tie_embeddings:
            return []
        return [["layers.0.token.weight", f"layers.{self.shape.num_layers + 1}.out.weight"]]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return _per_sample_ce(output, target)

    def describe(self) -> dict:
        return {"name": self.name, "kind": type(self).__name__, **self.shape.__dict__}


class GPT(_Transformer):
    causal = True

    def slice_loss(self, output: torch.Tensor, target: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Token slicing: tokens [start, stop)'s share of loss(whole output, target), per sample."""
        return slice_ce(output, target, start, stop)

    def batch(self, n, generator=None, device="cpu"):
        return next_token_batch(self.shape.vocab_size, self.shape.seq_len, n, generator, device)


class BERT(_Transformer):
    causal = False

    def batch(self, n, generator=None, device="cpu"):
        s = self.shape
        ids = torch.randint(1, s.vocab_size, (n, s.seq_len), generator=generator)
        inputs, targets = mask_tokens(ids, mask_id=0, generator=generator)
        return inputs.to(device), targets.to(device)

    def example_from_tokens(self, window, generator=None):
        """Masked language modelling on seq_len ids of the window; id 0 is [MASK] (a tokenizer for
        BERT keeps it free: the byte tokenizer's 0 is NUL, which text does not hold)."""
        inputs, targets = mask_tokens(window[None, :-1], mask_id=0, generator=generator)
        return inputs[0], targets[0]


def mask_tokens(
    ids: torch.Tensor, mask_id: int = 0, rate: float = 0.15, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking: pick `rate` of the positions (at least one per sample), hide them, predict them."""
    pick = torch.rand(ids.shape, generator=generator) < rate
    pick[:, 0] |= ~pick.any(1)
    inputs = ids.masked_fill(pick, mask_id)
    targets = ids.masked_fill(~pick, -100)
    return inputs, targets
