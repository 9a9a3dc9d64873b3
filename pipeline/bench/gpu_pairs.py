"""The GPU benchmark's synthetic pairs: random weights of real models' shapes, built on the device.

The target's deeper layers are damped so that a draft made of its first layers (an early exit)
agrees with it: the COSTS are the real shape's, the ACCEPTANCE is what the damping gives.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    draft_layers: int
    damp: float  # residual-branch outputs of the layers past the draft's, scaled by this
    encoder_layers: int = 0  # 0: a decoder-only Llama; else a T5 with this many encoder layers
    window: int = 0  # decoder-only: a Mistral with this sliding window (tokens) instead of a Llama

    @property
    def encoder_decoder(self) -> bool:
        return self.encoder_layers > 0


# TinyLlama-1.1B's, Llama-3-8B's and T5-v1.1-large's shapes (for T5, `layers` counts decoder
# layers and the draft runs the target's encoder; transformers 5.24's `generate()` sizes a T5 cache by its
# encoder layers, so a target has as many of each); damping for greedy agreement ~0.75-0.85 at bf16.
# "mistral-1.1b": TinyLlama's shape as a Mistral whose 128-token window every row passes.
SHAPES = {
    "tinyllama-1.1b": Shape(32000, 2048, 5632, 22, 32, 4, 2, 0.012),
    "llama3-8b": Shape(128256, 4096, 14336, 32, 32, 8, 2, 0.008),
    "mistral-1.1b": Shape(32000, 2048, 5632, 22, 32, 4, 2, 0.012, window=128),
    "t5-large": Shape(32128, 1024, 2816, 24, 16, 16, 2, 0.025, encoder_layers=24),
    "tiny": Shape(320, 64, 128, 3, 4, 2, 1, 0.02),
    "tiny-t5": Shape(320, 64, 128, 3, 2, 2, 1, 0.02, encoder_layers=3),
    "tiny-mistral": Shape(320, 64, 128, 3, 4, 2, 1, 0.02, window=16),
}


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _config(shape: Shape, layers: int):
    from transformers import LlamaConfig, MistralConfig

    fields = dict(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                  num_hidden_layers=layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                  max_position_embeddings=4096, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                  eos_token_id=None)
    if shape.window:
        return MistralConfig(**fields, sliding_window=shape.window)
    return LlamaConfig(**fields)


def _t5(shape: Shape, decoder_layers: int):
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(
        vocab_size=shape.vocab, d_model=shape.hidden, d_ff=shape.intermediate, d_kv=shape.hidden // shape.heads,
        num_layers=shape.encoder_layers, num_decoder_layers=decoder_layers, num_heads=shape.heads,
        feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
        tie_word_embeddings=False,
        initializer_factor=10.0)).eval()  # at the default 1.0 a random T5 emits one token whatever it reads


def build_pair(shape: Shape, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """(target, draft) built on `device` in `dtype`: the draft is the target's first (decoder)
    layers with its embeddings, final norm and head (an early exit); a T5 draft runs the target's
    encoder module. No end token: every row runs to length."""
    from transformers import LlamaForCausalLM, MistralForCausalLM

    from specdec_core.loading import share_encoder

    torch.manual_seed(seed)
    with _default_dtype(dtype), device:
        if shape.encoder_decoder:
            target, draft = _t5(shape, shape.layers), _t5(shape, shape.draft_layers)
        else:
            cls = MistralForCausalLM if shape.window else LlamaForCausalLM
            target = cls(_config(shape, shape.layers)).eval()
            draft = cls(_config(shape, shape.draft_layers)).eval()
    with torch.no_grad():
        if shape.encoder_decoder:
            for block in target.decoder.block[shape.draft_layers:]:
                for module in (block.layer[0].SelfAttention.o, block.layer[1].EncDecAttention.o,
                               block.layer[2].DenseReluDense.wo):
                    module.weight.mul_(shape.damp)
        else:
            for layer in target.model.layers[shape.draft_layers:]:
                layer.self_attn.o_proj.weight.mul_(shape.damp)
                layer.mlp.down_proj.weight.mul_(shape.damp)
        missing = draft.load_state_dict(target.state_dict(), strict=False).missing_keys
    assert not missing, missing
    share_encoder(target, draft)
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return target, draft


def distinct_prompts(n: int, low: int, high: int, vocab: int, seed: int) -> list[list[int]]:
    """n random prompts, lengths drawn from [low, high]; no two alike."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (n,), generator=g).tolist()
    return [torch.randint(4, vocab, (k,), generator=g).tolist() for k in lengths]
