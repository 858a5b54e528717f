"""The GPU workloads the benchmarks share, built on CUDA in bf16."""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from planner.frames import own_frame
from planner.models import GPTConfig, gpt_example, resnet_example

__all__ = ["WORKLOADS", "checkpoint_blocks", "own_frame"]


def _gpt(cfg: GPTConfig):
    model, batch = gpt_example(cfg, device="cuda")
    return model.to(torch.bfloat16), batch


def gpt_stack():
    """8 layers, d_model 1024, 16 heads, seq 2048, batch 8, vocab 8192: the peak-memory issue's stack."""
    return _gpt(GPTConfig(n_layer=8, d_model=1024, n_head=16, seq_len=2048, vocab=8192, dropout=0.0, batch=8))


def gpt_large():
    """Wider and longer: 12 layers, d_model 1536, 24 heads, seq 4096, batch 4, vocab 32768."""
    return _gpt(GPTConfig(n_layer=12, d_model=1536, n_head=24, seq_len=4096, vocab=32768, dropout=0.0, batch=4))


def resnet():
    """ResNet-18-style CNN, batch 64, 224x224 images."""
    model, (images, labels) = resnet_example(batch=64, image=224, device="cuda")
    return model.to(torch.bfloat16), (images.to(torch.bfloat16), labels)


WORKLOADS = {"gpt": gpt_stack, "gpt-large": gpt_large, "resnet": resnet}


class _Checkpointed(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False)


def checkpoint_blocks(model: nn.Module) -> nn.Module:
    """Wrap every block of ``model.blocks`` (GPT and ResNet alike) in ``torch.utils.checkpoint``."""
    for i, block in enumerate(model.blocks):
        model.blocks[i] = _Checkpointed(block)
    return model
