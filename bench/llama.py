"""A Llama-style decoder for the distributed benchmark: RMSNorm, rotary embeddings, grouped-query
SDPA attention and a SwiGLU MLP, with its layers in ``blocks`` like the built-in GPT."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["LlamaConfig", "Llama", "llama_example"]


@dataclass(frozen=True)
class LlamaConfig:
    n_layer: int = 8
    d_model: int = 2048
    n_head: int = 16
    n_kv_head: int = 8
    d_ff: int = 5632
    seq_len: int = 2048
    vocab: int = 32000
    batch: int = 2


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = cfg.n_head, cfg.n_kv_head
        head = cfg.d_model // cfg.n_head
        self.attn_norm, self.mlp_norm = nn.RMSNorm(cfg.d_model), nn.RMSNorm(cfg.d_model)
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.n_kv_head * head, bias=False)
        self.o = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, self.n_head, -1).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2 * self.n_kv_head, -1).transpose(1, 2).chunk(2, dim=1)
        y = F.scaled_dot_product_attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    """Decoder-only transformer returning the mean cross-entropy loss (a scalar)."""

    def __init__(self, cfg: LlamaConfig = LlamaConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        head = cfg.d_model // cfg.n_head
        freqs = torch.outer(torch.arange(cfg.seq_len).float(), 1e4 ** (-torch.arange(0, head, 2).float() / head))
        angles = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        cos, sin = self.cos[:t].to(self.tok.weight.dtype), self.sin[:t].to(self.tok.weight.dtype)
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def llama_example(cfg: LlamaConfig = LlamaConfig(), device: str | torch.device = "cpu", dtype=torch.float32,
                  seed: int = 0, batch_seed: int = 0):
    """A seeded Llama and a batch ``(idx, targets)`` for it (``batch_seed``: one per rank)."""
    torch.manual_seed(seed)
    model = Llama(cfg).to(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(batch_seed)
    idx = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len), generator=gen).to(device)
    return model, (idx, torch.roll(idx, -1, dims=1))
