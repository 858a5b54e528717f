"""Models from transformers and timm (``pip install .[zoo]``), randomly initialised, as a
training step that returns the loss: ``build(name, size) -> (model, batch)``.

``size="bench"`` is what ``bench/zoo.py`` measures on one GPU; ``size="tiny"`` is the same
architecture small enough for the CPU tests. Each model also knows how its library turns on its
own gradient checkpointing (:func:`library_checkpointing`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["MODELS", "build", "library_checkpointing", "spec"]


class _CausalLM(nn.Module):
    """A transformers model with a language-model head as ``(input_ids, labels) -> loss``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels, use_cache=False).loss


class _Classifier(nn.Module):
    """A timm image model as ``(images, labels) -> cross-entropy loss``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model(images).float(), labels)


@dataclass(frozen=True)
class ZooModel:
    """How to build one model at each size: ``make(size) -> (model, batch)``, and its library."""

    make: Callable[[str], tuple[nn.Module, tuple]]
    library: str  # "transformers" or "timm"
    description: str


def _tokens(batch: int, seq: int, vocab: int) -> tuple:
    ids = torch.randint(0, vocab, (batch, seq))
    return ids, ids.clone()


def _gpt2(size: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, d, heads, seq, batch, vocab = (6, 768, 12, 1024, 8, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_positions=seq, vocab_size=vocab,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return _CausalLM(GPT2LMHeadModel(cfg)), _tokens(batch, seq, vocab)


# A decoder's (layers, d, heads, kv heads, ffn, seq, batch, vocab): every decoder's tiny size, and
# Llama's bench size, which several families share.
_TINY_DECODER = (2, 64, 4, 2, 128, 32, 2, 128)
_LLAMA_BENCH = (6, 1024, 16, 8, 2816, 2048, 4, 8192)


def _decoder(size: str, family: str, bench: tuple, head_dim: int | None = None, **config) -> tuple:
    """A Llama-style transformers decoder (``LlamaForCausalLM``, ``Qwen2ForCausalLM``...) of
    ``bench = (layers, d, heads, kv heads, ffn, seq, batch, vocab)`` or the tiny size; ``head_dim``
    for families that do not derive it from ``d / heads`` (Gemma), at the bench size; ``config``:
    the family's own settings, at both sizes."""
    import transformers

    layers, d, heads, kv, ffn, seq, batch, vocab = bench if size == "bench" else _TINY_DECODER
    extra = {} if head_dim is None else {"head_dim": head_dim if size == "bench" else d // heads}
    cfg = getattr(transformers, f"{family}Config")(
        num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
        intermediate_size=ffn, max_position_embeddings=seq, vocab_size=vocab, **extra, **config)
    return _CausalLM(getattr(transformers, f"{family}ForCausalLM")(cfg)), _tokens(batch, seq, vocab)


def _llama(size: str):
    return _decoder(size, "Llama", _LLAMA_BENCH)


def _qwen2(size: str):
    return _decoder(size, "Qwen2", (6, 896, 14, 2, 4864, 1024, 8, 8192))


def _mistral(size: str):
    return _decoder(size, "Mistral", (6, 1024, 16, 4, 3584, 2048, 4, 8192))


def _gemma(size: str):
    """Multi-query attention, GeGLU and a scaled embedding, tied to the head."""
    return _decoder(size, "Gemma", (6, 1024, 8, 1, 4096, 2048, 4, 8192), head_dim=128)


def _opt(size: str):
    """Learned positions, ReLU, and the library's default dropout (0.1) on every residual branch."""
    from transformers import OPTConfig, OPTForCausalLM

    layers, d, heads, ffn, seq, batch, vocab = (6, 1024, 16, 4096, 2048, 4, 8192) if size == "bench" else (2, 64, 4, 128, 32, 2, 128)
    cfg = OPTConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, ffn_dim=ffn,
                    word_embed_proj_dim=d, max_position_embeddings=seq, vocab_size=vocab)
    return _CausalLM(OPTForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _phi(size: str):
    """Attention and MLP side by side from one LayerNorm, rotary on half of each head, GELU."""
    from transformers import PhiConfig, PhiForCausalLM

    layers, d, heads, ffn, seq, batch, vocab = (6, 1024, 16, 4096, 2048, 4, 8192) if size == "bench" else (2, 64, 4, 128, 32, 2, 128)
    cfg = PhiConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, intermediate_size=ffn,
                    max_position_embeddings=seq, vocab_size=vocab)
    return _CausalLM(PhiForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _mixtral(size: str):
    """Mixture of experts: 8 experts, 2 routed per token."""
    from transformers import MixtralConfig, MixtralForCausalLM

    layers, d, heads, kv, ffn, seq, batch, vocab = ((4, 768, 12, 4, 1536, 1024, 4, 8192) if size == "bench"
                                                    else _TINY_DECODER)
    cfg = MixtralConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                        intermediate_size=ffn, max_position_embeddings=seq, vocab_size=vocab,
                        num_local_experts=8, num_experts_per_tok=2)
    return _CausalLM(MixtralForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _bart(size: str):
    """An encoder-decoder with learned positions and the library's default dropout (0.1)."""
    from transformers import BartConfig, BartForConditionalGeneration

    layers, d, heads, ffn, seq, batch, vocab = (6, 768, 12, 3072, 512, 16, 8192) if size == "bench" else (1, 64, 4, 128, 32, 2, 128)
    cfg = BartConfig(encoder_layers=layers, decoder_layers=layers, d_model=d, encoder_attention_heads=heads,
                     decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
                     max_position_embeddings=seq, vocab_size=vocab)
    return _CausalLM(BartForConditionalGeneration(cfg)), _tokens(batch, seq, vocab)


def _gpt2_breaks(size: str):
    """GPT-2 with a graph break before every second block (1, 3, ...): torch.compile makes several graphs of
    one step (as models with data-dependent Python or unsupported calls do)."""
    model, batch = _gpt2(size)
    for block in list(model.model.transformer.h)[1::2]:
        block.register_forward_pre_hook(lambda module, args: torch._dynamo.graph_break())
    return model, batch


def _bert(size: str):
    from transformers import BertConfig, BertForMaskedLM

    layers, d, heads, seq, batch, vocab = (6, 768, 12, 512, 16, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = BertConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, intermediate_size=4 * d,
                     max_position_embeddings=seq, vocab_size=vocab, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return _CausalLM(BertForMaskedLM(cfg)), _tokens(batch, seq, vocab)


def _deberta(size: str):
    """Disentangled attention (content and relative-position scores, each batch x heads x seq x
    seq), and the library's default dropout (0.1)."""
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM

    layers, d, heads, seq, batch, vocab = (6, 768, 12, 512, 16, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = DebertaV2Config(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, intermediate_size=4 * d,
                          max_position_embeddings=seq, vocab_size=vocab)
    return _CausalLM(DebertaV2ForMaskedLM(cfg)), _tokens(batch, seq, vocab)


def _t5(size: str):
    """An encoder-decoder with dropout: the recomputed dropout masks must repeat the forward's."""
    from transformers import T5Config, T5ForConditionalGeneration

    layers, d, d_kv, ffn, heads, seq, batch, vocab = ((6, 512, 64, 2048, 8, 512, 16, 8192) if size == "bench"
                                                      else (2, 64, 16, 128, 4, 32, 2, 128))
    cfg = T5Config(num_layers=layers, d_model=d, d_kv=d_kv, d_ff=ffn, num_heads=heads, vocab_size=vocab,
                   dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0)
    return _CausalLM(T5ForConditionalGeneration(cfg)), _tokens(batch, seq, vocab)


def _gemma2(size: str):
    """Soft-capped attention scores and logits, sliding-window attention every second layer,
    norms before and after each block, in the library's eager attention (soft-capping needs it)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    layers, d, heads, kv, ffn, seq, batch, vocab = ((6, 1024, 8, 4, 4096, 2048, 4, 8192) if size == "bench"
                                                    else _TINY_DECODER)
    cfg = Gemma2Config(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                       head_dim=d // heads, intermediate_size=ffn, vocab_size=vocab, max_position_embeddings=seq,
                       sliding_window=seq // 2, attn_implementation="eager")
    return _CausalLM(Gemma2ForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _qwen3(size: str):
    """Grouped-query attention with RMS norms on the queries and keys."""
    return _decoder(size, "Qwen3", (6, 1024, 16, 8, 3072, 2048, 4, 8192), head_dim=64)


def _bloom(size: str):
    """ALiBi position biases added to the scores in one ``baddbmm``, eager attention, a float32
    softmax, and a LayerNorm after the embedding."""
    from transformers import BloomConfig, BloomForCausalLM

    layers, d, heads, seq, batch, vocab = (6, 1024, 16, 1024, 8, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = BloomConfig(n_layer=layers, hidden_size=d, n_head=heads, vocab_size=vocab)
    return _CausalLM(BloomForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _gptj(size: str):
    """Attention and MLP side by side, rotary on a quarter of each head (interleaved pairs)."""
    from transformers import GPTJConfig, GPTJForCausalLM

    layers, d, heads, seq, batch, vocab = (6, 1024, 16, 1024, 8, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = GPTJConfig(n_layer=layers, n_embd=d, n_head=heads, rotary_dim=d // heads // 2, n_positions=seq,
                     vocab_size=vocab, bos_token_id=0, eos_token_id=0)
    return _CausalLM(GPTJForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _olmo2(size: str):
    """Norms after attention and after the MLP (not before), RMS norms on queries and keys."""
    return _decoder(size, "Olmo2", (6, 1024, 16, 16, 4096, 2048, 4, 8192))


def _albert(size: str):
    """Every layer runs one shared set of weights; embeddings factorised (128 wide)."""
    from transformers import AlbertConfig, AlbertForMaskedLM

    layers, d, heads, seq, batch, vocab = (6, 768, 12, 512, 16, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = AlbertConfig(num_hidden_layers=layers, hidden_size=d, embedding_size=128, num_attention_heads=heads,
                       intermediate_size=4 * d, max_position_embeddings=seq, vocab_size=vocab)
    return _CausalLM(AlbertForMaskedLM(cfg)), _tokens(batch, seq, vocab)


def _pegasus(size: str):
    """An encoder-decoder with frozen sinusoidal positions (parameters without gradients) and
    dropout 0.1; compiled, it breaks into several graphs."""
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    layers, d, heads, ffn, seq, batch, vocab = (6, 768, 12, 3072, 512, 16, 8192) if size == "bench" else (1, 64, 4, 128, 32, 2, 128)
    cfg = PegasusConfig(encoder_layers=layers, decoder_layers=layers, d_model=d, encoder_attention_heads=heads,
                        decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
                        max_position_embeddings=seq, vocab_size=vocab, dropout=0.1, decoder_start_token_id=0)
    return _CausalLM(PegasusForConditionalGeneration(cfg)), _tokens(batch, seq, vocab)


class _Speech(_CausalLM):
    """A transformers speech model as ``(input_features, labels) -> loss``."""

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_features=features, labels=labels, use_cache=False).loss


def _whisper(size: str):
    """A speech encoder-decoder: two convolutions over mel frames, then transformer layers."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    layers, d, heads, ffn, frames, seq, batch, vocab = ((4, 512, 8, 2048, 3000, 448, 8, 8192) if size == "bench"
                                                        else (1, 64, 4, 128, 64, 16, 2, 128))
    cfg = WhisperConfig(encoder_layers=layers, decoder_layers=layers, d_model=d, encoder_attention_heads=heads,
                        decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, num_mel_bins=80,
                        max_source_positions=frames // 2, max_target_positions=seq, vocab_size=vocab,
                        decoder_start_token_id=1, pad_token_id=0)
    features, labels = torch.randn(batch, 80, frames), torch.randint(2, vocab, (batch, seq))
    return _Speech(WhisperForConditionalGeneration(cfg)), (features, labels)


def _gptneo(size: str):
    """Global and local (windowed) attention in alternate layers, eager, in float32."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    layers, d, heads, seq, batch, vocab, window = ((6, 1024, 16, 2048, 4, 8192, 256) if size == "bench"
                                                   else (2, 64, 4, 32, 2, 128, 8))
    cfg = GPTNeoConfig(num_layers=layers, hidden_size=d, num_heads=heads, max_position_embeddings=seq, vocab_size=vocab,
                       attention_types=[[["global", "local"], layers // 2]], window_size=window, bos_token_id=0,
                       eos_token_id=0)
    return _CausalLM(GPTNeoForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _granite(size: str):
    """Llama-style, with the scalings of Granite 3: the embedding x12, every residual branch x0.22,
    the attention scores x1/64, the logits /8."""
    return _decoder(size, "Granite", _LLAMA_BENCH, embedding_multiplier=12.0,
                    residual_multiplier=0.22, attention_multiplier=1 / 64, logits_scaling=8.0)


def _mpt(size: str):
    """ALiBi biases, no biases in the linear layers, eager attention."""
    from transformers import MptConfig, MptForCausalLM

    layers, d, heads, seq, batch, vocab = (6, 1024, 16, 2048, 4, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = MptConfig(n_layers=layers, d_model=d, n_heads=heads, max_seq_len=seq, vocab_size=vocab)
    return _CausalLM(MptForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _codegen(size: str):
    """Attention and MLP side by side, one fused qkv projection split in four model-parallel
    groups, rotary on part of each head."""
    from transformers import CodeGenConfig, CodeGenForCausalLM

    layers, d, heads, seq, batch, vocab = (6, 1024, 16, 2048, 4, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = CodeGenConfig(n_layer=layers, n_embd=d, n_head=heads, rotary_dim=d // heads // 2, n_positions=seq,
                        n_ctx=seq, vocab_size=vocab, bos_token_id=0, eos_token_id=0)
    return _CausalLM(CodeGenForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _modernbert(size: str):
    """Global attention every third layer and local (128) attention between, rotary, GeGLU,
    no biases."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    layers, d, heads, ffn, seq, batch, vocab = ((6, 768, 12, 1152, 1024, 8, 8192) if size == "bench"
                                                else (3, 64, 4, 96, 32, 2, 128))
    cfg = ModernBertConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, intermediate_size=ffn,
                           max_position_embeddings=seq, vocab_size=vocab, local_attention=128 if size == "bench" else 8,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    return _CausalLM(ModernBertForMaskedLM(cfg)), _tokens(batch, seq, vocab)


def _falcon(size: str):
    """Attention and MLP side by side from one LayerNorm, one key-value head (multi-query), rotary."""
    from transformers import FalconConfig, FalconForCausalLM

    layers, d, heads, seq, batch, vocab = (6, 1024, 16, 2048, 4, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = FalconConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, multi_query=True,
                       parallel_attn=True, new_decoder_architecture=False, alibi=False, bias=False,
                       max_position_embeddings=seq, vocab_size=vocab, bos_token_id=0, eos_token_id=0)
    return _CausalLM(FalconForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _gptbigcode(size: str):
    """GPT-2 with one key-value head (multi-query) in one fused projection, softmax in float32."""
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    layers, d, heads, seq, batch, vocab = (6, 1024, 16, 2048, 4, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = GPTBigCodeConfig(n_layer=layers, n_embd=d, n_head=heads, n_positions=seq, vocab_size=vocab,
                           multi_query=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                           bos_token_id=0, eos_token_id=0)
    return _CausalLM(GPTBigCodeForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _phi3(size: str):
    """One fused qkv projection and one fused gate-and-up projection, split after the matmul."""
    return _decoder(size, "Phi3", _LLAMA_BENCH, pad_token_id=0, bos_token_id=0,
                    eos_token_id=0)


def _deepseekv3(size: str):
    """Multi-head latent attention: keys and values from a low-rank latent (rank 256 at the bench
    size), queries from another (384), rotary on a separate slice of each head; dense MLPs."""
    import transformers

    layers, d, heads, ffn, seq, batch, vocab = (6, 1024, 16, 2816, 2048, 4, 8192) if size == "bench" else (2, 64, 4, 128, 32, 2, 128)
    ranks = (256, 384, 32, 64, 64) if size == "bench" else (16, 24, 8, 8, 8)
    kv_rank, q_rank, rope_dim, nope_dim, v_dim = ranks
    cfg = transformers.DeepseekV3Config(
        num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, num_key_value_heads=heads,
        intermediate_size=ffn, kv_lora_rank=kv_rank, q_lora_rank=q_rank, qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=nope_dim, v_head_dim=v_dim, first_k_dense_replace=layers, max_position_embeddings=seq,
        vocab_size=vocab, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return _CausalLM(transformers.DeepseekV3ForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _gptneox(size: str):
    """Attention and MLP side by side from two LayerNorms, one fused qkv projection laid out head
    by head, rotary on a quarter of each head."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    layers, d, heads, seq, batch, vocab = (6, 1024, 16, 2048, 4, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = GPTNeoXConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, intermediate_size=4 * d,
                        rotary_pct=0.25, max_position_embeddings=seq, vocab_size=vocab, bos_token_id=0, eos_token_id=0)
    return _CausalLM(GPTNeoXForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _cohere(size: str):
    """Attention and MLP side by side from one bias-free LayerNorm computed in float32, rotary on
    interleaved pairs, logits scaled (1/16) before the loss, embedding tied to the head."""
    return _decoder(size, "Cohere", _LLAMA_BENCH, logit_scale=0.0625,
                    pad_token_id=0, bos_token_id=0, eos_token_id=0)


def _nemotron(size: str):
    """Squared-ReLU MLP without a gate, LayerNorms whose weight is 1 + the parameter, rotary on half
    of each head."""
    return _decoder(size, "Nemotron", (6, 1024, 16, 8, 4096, 2048, 4, 8192), partial_rotary_factor=0.5,
                    pad_token_id=0, bos_token_id=0, eos_token_id=0)


class _Contrastive(_CausalLM):
    """A transformers two-tower model as ``(input_ids, pixel_values) -> contrastive loss``."""

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, pixel_values=pixel_values, return_loss=True).loss


def _clip(size: str):
    """An image tower (ViT-B/16, 6 layers) and a text tower (6 layers, causal) meeting in one
    batch-by-batch contrastive loss, quick GELU."""
    from transformers import CLIPConfig, CLIPModel

    if size == "bench":
        layers, vd, td, image, patch, seq, batch, vocab = 6, 768, 512, 224, 16, 77, 128, 8192
    else:
        layers, vd, td, image, patch, seq, batch, vocab = 1, 64, 32, 32, 8, 16, 3, 128
    cfg = CLIPConfig(
        text_config={"num_hidden_layers": layers, "hidden_size": td, "intermediate_size": 4 * td,
                     "num_attention_heads": td // 64 or 2, "max_position_embeddings": seq, "vocab_size": vocab,
                     "bos_token_id": 0, "eos_token_id": vocab - 1, "pad_token_id": 1},
        vision_config={"num_hidden_layers": layers, "hidden_size": vd, "intermediate_size": 4 * vd,
                       "num_attention_heads": vd // 64 or 2, "image_size": image, "patch_size": patch},
        projection_dim=td)
    ids = torch.randint(2, vocab - 1, (batch, seq))
    return _Contrastive(CLIPModel(cfg)), (ids, torch.randn(batch, 3, image, image))


class _Waveform(_CausalLM):
    """A transformers speech model over raw audio with a CTC head as ``(input_values, labels) -> loss``."""

    def forward(self, input_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_values=input_values, labels=labels).loss


def _mamba(size: str):
    """State-space layers whose selective scan, without the library's CUDA kernels, is a loop
    over the sequence (unrolled into the graph)."""
    from transformers import MambaConfig, MambaForCausalLM

    layers, d, state, seq, batch, vocab = (4, 768, 16, 128, 8, 8192) if size == "bench" else (2, 32, 8, 16, 2, 128)
    cfg = MambaConfig(num_hidden_layers=layers, hidden_size=d, state_size=state, intermediate_size=2 * d, vocab_size=vocab,
                      pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return _CausalLM(MambaForCausalLM(cfg)), _tokens(batch, seq, vocab)


def _xlnet(size: str):
    """Two-stream relative attention, the library's default dropout (0.1)."""
    from transformers import XLNetConfig, XLNetLMHeadModel

    layers, d, heads, seq, batch, vocab = (6, 768, 12, 512, 8, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = XLNetConfig(n_layer=layers, d_model=d, n_head=heads, d_inner=4 * d, vocab_size=vocab)
    return _CausalLM(XLNetLMHeadModel(cfg)), _tokens(batch, seq, vocab)


def _wav2vec2(size: str):
    """A convolutional feature encoder over raw audio (GroupNorm), a weight-normalised
    convolutional position embedding, a transformer encoder and a CTC loss. SpecAugment's masks
    (drawn with numpy) and layer drop are off: with them, torch.compile's own capture draws
    otherwise than eager, so no step can be compared with eager's."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    if size == "bench":
        layers, d, heads, samples, batch, targets = 6, 768, 12, 64000, 8, 40
        conv = {}
    else:
        layers, d, heads, samples, batch, targets = 2, 32, 2, 800, 2, 10
        conv = {"conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3), "num_conv_pos_embeddings": 16,
                "num_conv_pos_embedding_groups": 2}
    cfg = Wav2Vec2Config(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, intermediate_size=4 * d,
                         vocab_size=32, mask_time_prob=0.0, layerdrop=0.0, ctc_loss_reduction="mean", **conv)
    return _Waveform(Wav2Vec2ForCTC(cfg)), (torch.randn(batch, samples), torch.randint(1, 32, (batch, targets)))


class _Segmenter(_CausalLM):
    """A transformers segmentation model as ``(pixel_values, labels) -> loss`` (per-pixel labels)."""

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, labels=labels).loss


def _segformer(size: str):
    """Attention over keys reduced by strided convolutions, depthwise-convolution MLPs, four
    stages, and an all-MLP decoder whose logits are upsampled (bilinear) to the labels' pixels."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    if size == "bench":
        cfg, batch, image = SegformerConfig(num_labels=150), 16, 512
    else:
        cfg = SegformerConfig(num_labels=5, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                              num_attention_heads=[1, 1, 2, 2], decoder_hidden_size=16)
        batch, image = 2, 64
    labels = torch.randint(0, cfg.num_labels, (batch, image, image))
    return _Segmenter(SegformerForSemanticSegmentation(cfg)), (torch.randn(batch, 3, image, image), labels)


def _convbert(size: str):
    """Mixed attention: half the heads self-attention, half span-based dynamic convolutions (kernels
    computed per token, applied through ``unfold``); dropout 0.1."""
    from transformers import ConvBertConfig, ConvBertForMaskedLM

    layers, d, heads, seq, batch, vocab = (6, 768, 12, 512, 16, 8192) if size == "bench" else (2, 64, 4, 32, 2, 128)
    cfg = ConvBertConfig(num_hidden_layers=layers, hidden_size=d, embedding_size=d, num_attention_heads=heads,
                         intermediate_size=4 * d, max_position_embeddings=seq, vocab_size=vocab)
    return _CausalLM(ConvBertForMaskedLM(cfg)), _tokens(batch, seq, vocab)


def _funnel(size: str):
    """Blocks that pool the sequence (halving it), relative attention, and a decoder that
    upsamples back to every token; dropout 0.1."""
    from transformers import FunnelConfig, FunnelForMaskedLM

    blocks, d, heads, seq, batch, vocab = ([2, 2, 2], 768, 12, 512, 16, 8192) if size == "bench" else ([1, 1], 64, 4, 32, 2, 128)
    cfg = FunnelConfig(block_sizes=blocks, d_model=d, n_head=heads, d_head=d // heads, d_inner=4 * d, vocab_size=vocab)
    return _CausalLM(FunnelForMaskedLM(cfg)), _tokens(batch, seq, vocab)


class _MaskedImage(_CausalLM):
    """A transformers masked-image model as ``(pixel_values, noise) -> loss``: the noise that
    picks the masked patches is an input, so every run masks the same ones."""

    def forward(self, pixel_values: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, noise=noise).loss


def _vitmae(size: str):
    """A masked autoencoder: 75% of the patches dropped by sorting noise (``argsort``, ``gather``),
    an encoder over the rest and a decoder over all, loss on the masked pixels."""
    from transformers import ViTMAEConfig, ViTMAEForPreTraining

    if size == "bench":
        cfg, batch, image = ViTMAEConfig(num_hidden_layers=6), 64, 224
    else:
        cfg = ViTMAEConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           image_size=32, patch_size=8, decoder_hidden_size=32, decoder_num_hidden_layers=1,
                           decoder_num_attention_heads=2, decoder_intermediate_size=64)
        batch, image = 2, 32
    patches = (image // cfg.patch_size) ** 2
    return _MaskedImage(ViTMAEForPreTraining(cfg)), (torch.randn(batch, 3, image, image), torch.rand(batch, patches))


def _timm(arch: str, bench_batch: int, tiny: dict, tiny_arch: str | None = None):
    """``arch`` at the bench size; at the tiny size ``tiny_arch`` (the same family, smaller) or
    ``arch`` itself, built with the ``tiny`` keywords."""
    def make(size: str):
        import timm

        kwargs = {} if size == "bench" else tiny
        name = arch if size == "bench" else tiny_arch or arch
        model = timm.create_model(name, num_classes=1000 if size == "bench" else 10, **kwargs)
        batch, image = (bench_batch, 224) if size == "bench" else (2, tiny.get("img_size", 32))
        classes = 1000 if size == "bench" else 10
        return _Classifier(model), (torch.randn(batch, 3, image, image), torch.randint(0, classes, (batch,)))
    return make


MODELS: dict[str, ZooModel] = {
    "gpt2": ZooModel(_gpt2, "transformers", "GPT2LMHeadModel, 6 layers, d 768, seq 1024, batch 8, vocab 8192"),
    "gpt2-breaks": ZooModel(_gpt2_breaks, "transformers", "gpt2 with a graph break before every second block (1, 3, 5)"),
    "llama": ZooModel(_llama, "transformers",
                      "LlamaForCausalLM, 6 layers, d 1024, 16 heads / 8 kv, ffn 2816, seq 2048, batch 4, vocab 8192"),
    "bert": ZooModel(_bert, "transformers", "BertForMaskedLM, 6 layers, d 768, seq 512, batch 16, vocab 8192"),
    "deberta": ZooModel(_deberta, "transformers",
                        "DebertaV2ForMaskedLM, 6 layers, d 768, 12 heads, seq 512, batch 16, vocab 8192, dropout 0.1"),
    "vit": ZooModel(_timm("vit_base_patch16_224", 64, {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2,
                                                       "num_heads": 4}),
                    "timm", "vit_base_patch16_224, batch 64"),
    "resnet50": ZooModel(_timm("resnet50", 128, {"layers": [1, 1, 1, 1]}), "timm", "resnet50, batch 128"),
    # added after the planner's defaults were set, to see them on models nothing was tuned on
    "qwen2": ZooModel(_qwen2, "transformers",
                      "Qwen2ForCausalLM, 6 layers, d 896, 14 heads / 2 kv, ffn 4864, seq 1024, batch 8, vocab 8192"),
    "t5": ZooModel(_t5, "transformers",
                   "T5ForConditionalGeneration, 6+6 layers, d 512, ffn 2048, seq 512, batch 16, vocab 8192, dropout 0.1"),
    "convnext": ZooModel(_timm("convnext_tiny", 64, {"depths": (1, 1, 1, 1), "dims": (16, 32, 48, 64)}),
                         "timm", "convnext_tiny, batch 64"),
    "efficientnet": ZooModel(_timm("efficientnet_b0", 128, {"drop_path_rate": 0.1}), "timm",
                             "efficientnet_b0, batch 128 (drop path 0.1 only in the tests' 32-pixel build)"),
    # added later still, after every rule of the planner so far, as models a new user brings
    "mistral": ZooModel(_mistral, "transformers",
                        "MistralForCausalLM, 6 layers, d 1024, 16 heads / 4 kv, ffn 3584, seq 2048, batch 4, vocab 8192"),
    "gemma": ZooModel(_gemma, "transformers",
                      "GemmaForCausalLM, 6 layers, d 1024, 8 heads / 1 kv of 128, ffn 4096, seq 2048, batch 4, vocab 8192"),
    "swin": ZooModel(_timm("swin_tiny_patch4_window7_224", 64, {"img_size": 32, "patch_size": 2, "window_size": 4,
                                                                "embed_dim": 16, "depths": (1, 1), "num_heads": (2, 4)}),
                     "timm", "swin_tiny_patch4_window7_224, batch 64"),
    "mobilenetv3": ZooModel(_timm("mobilenetv3_large_100", 128, {}), "timm", "mobilenetv3_large_100, batch 128"),
    # a third round, added after every rule so far and measured before any change for them
    "opt": ZooModel(_opt, "transformers",
                    "OPTForCausalLM, 6 layers, d 1024, 16 heads, ffn 4096, seq 2048, batch 4, vocab 8192, dropout 0.1"),
    "phi": ZooModel(_phi, "transformers",
                    "PhiForCausalLM, 6 layers, d 1024, 16 heads, ffn 4096, seq 2048, batch 4, vocab 8192"),
    "mixtral": ZooModel(_mixtral, "transformers", "MixtralForCausalLM, 4 layers, d 768, 12 heads / 4 kv, 8 experts "
                        "of ffn 1536, 2 per token, seq 1024, batch 4, vocab 8192"),
    "bart": ZooModel(_bart, "transformers",
                     "BartForConditionalGeneration, 6+6 layers, d 768, ffn 3072, seq 512, batch 16, vocab 8192, dropout 0.1"),
    "densenet": ZooModel(_timm("densenet121", 64, {"growth_rate": 8, "block_config": (1, 2, 2, 1)}),
                         "timm", "densenet121, batch 64"),
    "regnet": ZooModel(_timm("regnety_016", 128, {}, tiny_arch="regnety_002"), "timm", "regnety_016, batch 128"),
    # a fourth round, measured before any change for them (the constant-mask rule came of Bloom)
    "gemma2": ZooModel(_gemma2, "transformers", "Gemma2ForCausalLM, 6 layers, d 1024, 8 heads / 4 kv, ffn 4096, "
                       "seq 2048 (window 1024), batch 4, vocab 8192, eager attention"),
    "qwen3": ZooModel(_qwen3, "transformers",
                      "Qwen3ForCausalLM, 6 layers, d 1024, 16 heads / 8 kv, ffn 3072, seq 2048, batch 4, vocab 8192"),
    "bloom": ZooModel(_bloom, "transformers", "BloomForCausalLM, 6 layers, d 1024, 16 heads, seq 1024, batch 8, vocab 8192"),
    "gptj": ZooModel(_gptj, "transformers", "GPTJForCausalLM, 6 layers, d 1024, 16 heads, seq 1024, batch 8, vocab 8192"),
    # a fifth round, measured before any change for them
    "olmo2": ZooModel(_olmo2, "transformers",
                      "Olmo2ForCausalLM, 6 layers, d 1024, 16 heads, ffn 4096, seq 2048, batch 4, vocab 8192"),
    "albert": ZooModel(_albert, "transformers", "AlbertForMaskedLM, 6 layers sharing their weights, d 768, seq 512, "
                       "batch 16, vocab 8192"),
    "pegasus": ZooModel(_pegasus, "transformers", "PegasusForConditionalGeneration, 6+6 layers, d 768, ffn 3072, "
                        "seq 512, batch 16, vocab 8192, dropout 0.1"),
    # timm's MetaFormer builds take no depths or widths beside its own: the tiny build is s12 at 32 pixels
    "poolformer": ZooModel(_timm("poolformer_s12", 64, {}), "timm", "poolformer_s12, batch 64"),
    # a sixth round, measured before any change for them
    "whisper": ZooModel(_whisper, "transformers", "WhisperForConditionalGeneration, 4+4 layers, d 512, 3000 mel frames, "
                        "448 tokens, batch 8, vocab 8192"),
    "gptneo": ZooModel(_gptneo, "transformers", "GPTNeoForCausalLM, 6 layers, d 1024, global and local (256) attention, "
                       "seq 2048, batch 4, vocab 8192"),
    "nfnet": ZooModel(_timm("eca_nfnet_l0", 32, {}), "timm", "eca_nfnet_l0 (scaled weight standardisation), batch 32"),
    "levit": ZooModel(_timm("levit_128", 128, {"img_size": 32}), "timm", "levit_128, batch 128"),
    "hrnet": ZooModel(_timm("hrnet_w18_small", 32, {}), "timm", "hrnet_w18_small, batch 32"),
    "eva02": ZooModel(_timm("eva02_tiny_patch14_224", 64, {"img_size": 32, "patch_size": 8, "depth": 2}), "timm",
                      "eva02_tiny_patch14_224 (rotary positions, SwiGLU), batch 64"),
    "fastvit": ZooModel(_timm("fastvit_t8", 64, {}), "timm", "fastvit_t8, batch 64"),
    "cait": ZooModel(_timm("cait_xxs24_224", 64, {"img_size": 32, "patch_size": 8, "depth": 2}), "timm",
                     "cait_xxs24_224 (class attention, layer scale), batch 64"),
    # a seventh round, measured before any change for them
    "granite": ZooModel(_granite, "transformers", "GraniteForCausalLM, 6 layers, d 1024, 16 heads / 8 kv, ffn 2816, "
                        "seq 2048, batch 4, vocab 8192, Granite 3's multipliers"),
    "mpt": ZooModel(_mpt, "transformers",
                    "MptForCausalLM (ALiBi), 6 layers, d 1024, 16 heads, seq 2048, batch 4, vocab 8192"),
    "codegen": ZooModel(_codegen, "transformers",
                        "CodeGenForCausalLM, 6 layers, d 1024, 16 heads, seq 2048, batch 4, vocab 8192"),
    "modernbert": ZooModel(_modernbert, "transformers", "ModernBertForMaskedLM, 6 layers, d 768, ffn 1152, seq 1024 "
                           "(local 128), batch 8, vocab 8192"),
    "beit": ZooModel(_timm("beit_base_patch16_224", 64, {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2,
                                                         "num_heads": 4}),
                     "timm", "beit_base_patch16_224 (relative position biases, layer scale), batch 64"),
    "coatnet": ZooModel(_timm("coatnet_0_rw_224", 64, {"img_size": 64}, tiny_arch="coatnet_nano_rw_224"), "timm",
                        "coatnet_0_rw_224 (MBConv stages, then relative-position attention), batch 64"),
    "hiera": ZooModel(_timm("hiera_tiny_224", 64, {"img_size": 64, "embed_dim": 32, "num_heads": 1,
                                                   "stages": (1, 1, 1, 1)}),
                      "timm", "hiera_tiny_224 (mask units, pooled queries), batch 64"),
    "mobilenetv4": ZooModel(_timm("mobilenetv4_conv_medium", 128, {}), "timm", "mobilenetv4_conv_medium, batch 128"),
    # an eighth round, measured before any change for them
    "falcon": ZooModel(_falcon, "transformers", "FalconForCausalLM (parallel attention, multi-query), 6 layers, d 1024, "
                       "16 heads, seq 2048, batch 4, vocab 8192"),
    "gptbigcode": ZooModel(_gptbigcode, "transformers", "GPTBigCodeForCausalLM (multi-query), 6 layers, d 1024, "
                           "16 heads, seq 2048, batch 4, vocab 8192"),
    "phi3": ZooModel(_phi3, "transformers",
                     "Phi3ForCausalLM, 6 layers, d 1024, 16 heads / 8 kv, ffn 2816, seq 2048, batch 4, vocab 8192"),
    "deepseekv3": ZooModel(_deepseekv3, "transformers", "DeepseekV3ForCausalLM with dense MLPs (latent attention), "
                           "6 layers, d 1024, 16 heads, ffn 2816, seq 2048, batch 4, vocab 8192"),
    "convnextv2": ZooModel(_timm("convnextv2_tiny", 64, {"depths": (1, 1, 1, 1), "dims": (16, 32, 48, 64)}),
                           "timm", "convnextv2_tiny (global response norm), batch 64"),
    "xcit": ZooModel(_timm("xcit_tiny_12_p16_224", 64, {"img_size": 32, "patch_size": 8, "depth": 2}), "timm",
                     "xcit_tiny_12_p16_224 (attention across channels, class attention), batch 64"),
    "pvtv2": ZooModel(_timm("pvt_v2_b1", 64, {"depths": (1, 1, 1, 1)}), "timm",
                      "pvt_v2_b1 (attention over spatially reduced keys, convolutional MLPs), batch 64"),
    "edgenext": ZooModel(_timm("edgenext_small", 128, {}, tiny_arch="edgenext_xx_small"), "timm",
                         "edgenext_small (convolutions, then attention across channels), batch 128"),
    # a ninth round, measured before any change for them
    "gptneox": ZooModel(_gptneox, "transformers", "GPTNeoXForCausalLM, 6 layers, d 1024, 16 heads, rotary 25%, "
                        "seq 2048, batch 4, vocab 8192"),
    "cohere": ZooModel(_cohere, "transformers", "CohereForCausalLM (parallel attention and MLP, logit scale), "
                       "6 layers, d 1024, 16 heads / 8 kv, ffn 2816, seq 2048, batch 4, vocab 8192"),
    "nemotron": ZooModel(_nemotron, "transformers", "NemotronForCausalLM (squared ReLU, LayerNorm 1p), 6 layers, "
                         "d 1024, 16 heads / 8 kv, ffn 4096, seq 2048, batch 4, vocab 8192"),
    "clip": ZooModel(_clip, "transformers", "CLIPModel, contrastive loss, ViT-B/16 image tower and text tower of "
                     "6 layers each, 224 pixels, 77 tokens, batch 128, vocab 8192"),
    "mixer": ZooModel(_timm("mixer_b16_224", 64, {"img_size": 64}, tiny_arch="mixer_s32_224"),
                      "timm", "mixer_b16_224 (MLP-Mixer: token-mixing MLPs over transposed patches), batch 64"),
    "davit": ZooModel(_timm("davit_tiny", 64, {"depths": (1, 1, 1, 1), "embed_dims": (16, 32, 48, 64),
                                                "num_heads": (1, 2, 3, 4), "window_size": 2}),
                      "timm", "davit_tiny (window attention and attention across channel groups), batch 64"),
    "efficientnetv2": ZooModel(_timm("efficientnetv2_rw_t", 128, {}), "timm",
                               "efficientnetv2_rw_t (fused MBConv stages, then MBConv with squeeze-excite), batch 128"),
    "inceptionnext": ZooModel(_timm("inception_next_tiny", 64, {"depths": (1, 1, 1, 1), "dims": (16, 32, 48, 64)}),
                              "timm", "inception_next_tiny (depthwise convolutions on channel splits: square, "
                              "1x11 and 11x1), batch 64"),
    # a tenth round, so far tried on a CPU only (tiny builds, in the suite)
    "mamba": ZooModel(_mamba, "transformers", "MambaForCausalLM (selective scan as a loop over the sequence), 4 layers, "
                      "d 768, state 16, seq 128, batch 8, vocab 8192"),
    "xlnet": ZooModel(_xlnet, "transformers", "XLNetLMHeadModel (two-stream relative attention, dropout 0.1), 6 layers, "
                      "d 768, 12 heads, seq 512, batch 8, vocab 8192"),
    "wav2vec2": ZooModel(_wav2vec2, "transformers", "Wav2Vec2ForCTC (convolutional feature encoder, CTC loss), 6 layers, "
                         "d 768, 4 s of 16 kHz audio, batch 8"),
    # added in the nineteenth zoo round (docs/zoo-nineteenth-round-h100.md), measured before any change for them
    "segformer": ZooModel(_segformer, "transformers", "SegformerForSemanticSegmentation (MiT-b0, reduced-key attention, "
                          "upsampled logits), 512 pixels, 150 classes, batch 16"),
    "convbert": ZooModel(_convbert, "transformers", "ConvBertForMaskedLM (span-based dynamic convolution), 6 layers, "
                         "d 768, 12 heads, seq 512, batch 16, vocab 8192, dropout 0.1"),
    "funnel": ZooModel(_funnel, "transformers", "FunnelForMaskedLM (sequence pooled per block, upsampled), 3 blocks of 2 "
                       "layers, d 768, 12 heads, seq 512, batch 16, vocab 8192, dropout 0.1"),
    "vitmae": ZooModel(_vitmae, "transformers", "ViTMAEForPreTraining (75% of patches masked), 6 encoder layers, "
                       "d 768, decoder 8 layers of 512, batch 64"),
    "maxvit": ZooModel(_timm("maxvit_tiny_rw_224", 64, {"img_size": 64}, tiny_arch="maxvit_nano_rw_256"), "timm",
                       "maxvit_tiny_rw_224 (MBConv, block and grid attention), batch 64"),
    "vgg": ZooModel(_timm("vgg16_bn", 32, {}, tiny_arch="vgg11_bn"), "timm", "vgg16_bn (BatchNorm, in-place ReLU), batch 32"),
    "mobilevit": ZooModel(_timm("mobilevit_s", 128, {"img_size": 64}, tiny_arch="mobilevit_xxs"), "timm",
                          "mobilevit_s (convolutions, then attention over unfolded patches), batch 128"),
}


# The sizes of a decoder named by its transformers model type (``hf:TYPE``): Llama's at the bench size.
_ANY_DECODER = {"bench": _LLAMA_BENCH, "tiny": _TINY_DECODER}


def _any_decoder(model_type: str):
    """A causal language model of any transformers model type, from that type's default config
    with the layers, widths, heads, sequence and vocabulary of :data:`_ANY_DECODER` set where the
    config has the field (its own defaults elsewhere: dropout, norms, activation, rotary)."""
    def make(size: str):
        import transformers

        layers, d, heads, kv, ffn, seq, batch, vocab = _ANY_DECODER[size]
        try:
            cfg = transformers.AutoConfig.for_model(model_type)
        except ValueError:
            raise ValueError(f"hf:{model_type}: transformers {transformers.__version__} has no model type "
                             f"{model_type!r} (its names: transformers.CONFIG_MAPPING)") from None
        sizes = {"num_hidden_layers": layers, "hidden_size": d, "num_attention_heads": heads,
                 "num_key_value_heads": kv, "intermediate_size": ffn, "head_dim": d // heads,
                 "max_position_embeddings": seq, "vocab_size": vocab, "use_cache": False}
        for key, value in sizes.items():
            if getattr(cfg, key, None) is not None:  # a field the family has and uses
                setattr(cfg, key, value)
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):  # special tokens of the real vocabulary
            if isinstance(getattr(cfg, key, None), int) and getattr(cfg, key) >= vocab:
                setattr(cfg, key, 0)
        if getattr(cfg, "layer_types", None) is not None:  # per-layer kinds (sliding, full...) of the first layers
            cfg.layer_types = list(cfg.layer_types)[:layers]
        try:
            model = transformers.AutoModelForCausalLM.from_config(cfg)
        except ValueError as err:
            raise ValueError(f"hf:{model_type} has no causal language model in transformers ({err})") from None
        return _CausalLM(model), _tokens(batch, seq, vocab)
    return make


def _any_timm(arch: str):
    """Any timm architecture by name: at the bench size batch 64 at its own input size, at the
    tiny size batch 2 at 64 pixels (built for 64 pixels where it takes an image size)."""
    def make(size: str):
        import timm

        if size == "bench":
            model = timm.create_model(arch, num_classes=1000)
            batch, image, classes = 64, model.pretrained_cfg.get("input_size", (3, 224, 224))[-1], 1000
        else:
            batch, image, classes = 2, 64, 10
            try:  # models with position tables are built for one size
                model = timm.create_model(arch, num_classes=classes, img_size=image)
            except TypeError:
                model = timm.create_model(arch, num_classes=classes)
        return _Classifier(model), (torch.randn(batch, 3, image, image), torch.randint(0, classes, (batch,)))
    return make


def spec(name: str) -> ZooModel:
    """The zoo model ``name``: a key of :data:`MODELS`, or ``timm:ARCH`` (any timm architecture) or
    ``hf:TYPE`` (a causal language model of any transformers model type at Llama's bench size), so
    that a model nothing here was tuned on is measured by the same bench."""
    if name in MODELS:
        return MODELS[name]
    library, _, rest = name.partition(":")
    if library == "timm" and rest:
        return ZooModel(_any_timm(rest), "timm", f"timm {rest}, batch 64, its own input size, default settings")
    if library == "hf" and rest:
        layers, d, heads, kv, ffn, seq, batch, vocab = _ANY_DECODER["bench"]
        return ZooModel(_any_decoder(rest), "transformers",
                        f"transformers {rest} (AutoModelForCausalLM from its default config), {layers} layers, d {d}, "
                        f"{heads} heads / {kv} kv where it has them, ffn {ffn}, seq {seq}, batch {batch}, vocab {vocab}")
    raise ValueError(f"unknown zoo model {name!r}: use one of {', '.join(sorted(MODELS))}, "
                     f"or timm:ARCH (a timm architecture) or hf:TYPE (a transformers model type with a causal LM)")


def build(name: str, size: str = "bench", device: str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[nn.Module, tuple]:
    """A zoo model (see :func:`spec`) in training mode and a batch for it, on ``device`` in ``dtype``."""
    torch.manual_seed(0)
    model, batch = spec(name).make(size)
    model = model.to(device=device, dtype=dtype).train()
    batch = tuple(x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device) for x in batch)
    return model, batch


def library_checkpointing(name: str, model: nn.Module) -> nn.Module:
    """``model`` with its library's own gradient checkpointing turned on (in place).

    Raises NotImplementedError where the library has none for this model (timm's Inception-v3
    asserts, a transformers model without ``supports_gradient_checkpointing`` raises ValueError)."""
    inner = model.model
    library = spec(name).library
    try:
        if library == "transformers":
            inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            inner.set_grad_checkpointing(True)
    except (AssertionError, ValueError, NotImplementedError) as err:
        raise NotImplementedError(f"{library} has no gradient checkpointing for {name} ({type(err).__name__}: {err})") from err
    return model
