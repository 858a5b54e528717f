"""On a GPU: planned steps under inductor equal eager, dropout recomputed on the CUDA generator."""
import pytest
import torch

import planner
from planner.models import GPTConfig, gpt_example
from tests.training import assert_same_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("budget", [0.0, 0.5])
def test_gpt_on_cuda_with_inductor_trains_like_eager(budget):
    def make():
        model, batch = gpt_example(GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab=128), device="cuda")
        return model, batch

    with torch._inductor.config.patch(fallback_random=True):
        be = planner.backend(planner.PlannerConfig(codegen="inductor"), memory_budget=budget, solver="cpsat")
        assert_same_step(make, lambda twin, inputs: torch.compile(twin, backend=be), atol=1e-5)
    problem = be.graphs[0].problem
    assert problem.rng_state_bytes == 16
    if budget == 0.0:
        assert be.graphs[0].decision.recompute_seconds > 0


def test_gpu_spin_keeps_the_stream_busy():
    from planner import _torch_compat

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    _torch_compat.gpu_spin(1_000_000)
    end.record()
    torch.cuda.synchronize()
    assert start.elapsed_time(end) > 0.1  # milliseconds: a million cycles at any clock under 10 GHz


def test_fused_attention_draws_nothing_without_dropout():
    # planner.ops.is_random recomputes a seeded attention op asked for dropout_p 0 as itself:
    # its kernels must leave the generator as they found it (and move it where dropout_p > 0)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        for p in (0.0, 0.1):
            with sdpa_kernel(backend):
                before = torch.cuda.get_rng_state()
                try:
                    torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=p, is_causal=True).sum().backward()
                except RuntimeError as err:  # this GPU or build lacks the backend
                    pytest.skip(f"{backend}: {err}")
                torch.cuda.synchronize()
                assert torch.equal(before, torch.cuda.get_rng_state()) == (p == 0.0), (backend, p)
