"""Built-in models for the demo, the benchmarks and the tests: a small GPT-style transformer."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["GPTConfig", "GPT", "gpt_example", "ResNet", "resnet_example"]


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


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.skip = None
        if stride != 1 or c_in != c_out:
            self.skip = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.skip is None else self.skip(x)))


class ResNet(nn.Module):
    """ResNet-18-style CNN (two basic blocks per stage) returning the mean cross-entropy loss."""

    def __init__(self, widths: tuple[int, ...] = (64, 128, 256, 512), classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, c = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(c, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            c = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c, classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(images))
        return F.cross_entropy(self.head(x.mean((2, 3))), labels)


def resnet_example(batch: int = 64, image: int = 224, device: str | torch.device = "cpu", seed: int = 0):
    """A seeded ResNet and a batch ``(images, labels)`` for it."""
    torch.manual_seed(seed)
    model = ResNet().to(device)
    images = torch.randn(batch, 3, image, image, device=device)
    return model, (images, torch.randint(0, 1000, (batch,), device=device))
