"""Small models for the tests, each exercising something a plan must get right."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from planner.models import GPTConfig, gpt_example


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # not a scalar: the step needs a tangent for it


class SmallCNN(nn.Module):
    """Convolutions with BatchNorm (running statistics are mutated in the forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))) + x, 2)
        return F.cross_entropy(self.head(x.mean(dim=(2, 3))), y)


class ViewsInplace(nn.Module):
    """Views, transposes, in-place activations and in-place arithmetic on intermediates."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(12, 24), nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h.relu_()
        left, right = h.view(-1, 2, 12).unbind(1)
        g = self.b(left.t().contiguous().t()) * right
        g.mul_(2.0).add_(1.0)
        g = g.transpose(0, 1)[:, 1:].sigmoid()
        return (g * g).sum()


def mlp():
    torch.manual_seed(0)
    return MLP(), (torch.randn(8, 16),)


def cnn():
    torch.manual_seed(0)
    return SmallCNN(), (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))


def gpt():
    return gpt_example(GPTConfig(n_layer=2, d_model=32, n_head=2, seq_len=16, vocab=64, batch=2, dropout=0.1))


def views_inplace():
    torch.manual_seed(0)
    return ViewsInplace(), (torch.randn(6, 12),)


MODELS = {"mlp": mlp, "cnn": cnn, "gpt": gpt, "views_inplace": views_inplace}
