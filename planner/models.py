"""Built-in models for the demo, the benchmarks and the tests: a small GPT-style transformer."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["GPTConfig", "GPT", "gpt_example"]


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 4
    d_model: int = 128
    n_head: int = 4
    seq_len: int = 64
    vocab: int = 512
    dropout: float = 0.1
    batch: int = 4


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, d)), p, self.training)
        return x + F.dropout(self.out(F.gelu(self.fc(self.ln2(x)))), p, self.training)


class GPT(nn.Module):
    """Decoder-only transformer returning the mean cross-entropy loss (a scalar)."""

    def __init__(self, cfg: GPTConfig = GPTConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.d_model) * 0.02)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = F.dropout(self.tok(idx) + self.pos[: idx.shape[1]], self.cfg.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def gpt_example(cfg: GPTConfig = GPTConfig(), device: str | torch.device = "cpu", seed: int = 0):
    """A seeded GPT and a batch ``(idx, targets)`` for it."""
    torch.manual_seed(seed)
    model = GPT(cfg).to(device)
    idx = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len), device=device)
    return model, (idx, torch.roll(idx, -1, dims=1))
