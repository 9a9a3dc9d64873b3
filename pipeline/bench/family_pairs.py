"""Synthetic pairs of other families for `pipeline.bench.throughput --pair`: an encoder-decoder
(T5) and a sliding-window (Mistral) pair of realistic cost on a CPU, built as `pairs.py` builds
the Llama pair: random weights, the target's deeper decoder layers damped so that a draft made of
its first decoder layer agrees with it part of the time. The COSTS are those of real models of
that shape; the ACCEPTANCE is whatever the damping gives.

- t5: a 6-layer encoder under a 12-layer decoder (d_model 768, d_ff 2048: ~140M parameters);
  the draft is the same encoder and embeddings with the first decoder layer only (saved as its
  own model; the bench gives it the target's encoder module, so the batched engine encodes each
  prompt once for both).
- mistral: a 12-layer Mistral (hidden 768, ~90M) with a sliding window shorter than the jobs
  (`WINDOW` tokens), so per-row window masks are built on every pass; draft: its first layer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.bench.pairs import _word_tokenizer, save_models

_LOG = logging.getLogger("pipeline.bench")

WINDOW = 96  # the Mistral pair's sliding window (tokens): shorter than 128-token prompts


@dataclass(frozen=True)
class FamilySpec:
    family: str  # "t5" or "mistral"
    vocab: int = 8000
    hidden: int = 768
    ffn: int = 2048
    layers: int = 12  # decoder layers
    encoder_layers: int = 6
    heads: int = 12
    damp: float = 0.015

    def key(self) -> str:
        return "-".join(str(x) for x in (self.family, self.vocab, self.hidden, self.ffn, self.layers,
                                          self.encoder_layers, self.heads, self.damp))


# Damping: the first-layer draft agreed with the target on 0.72-0.74 of greedy drafts at 0.02-0.03
# (T5, 4 prompts of 64 tokens, gamma 3) and 0.75 at 0.015 (Mistral).
FAMILY_PAIRS = {"t5": FamilySpec("t5", damp=0.025), "mistral": FamilySpec("mistral")}
TINY_FAMILY_PAIRS = {"t5": FamilySpec("t5", vocab=300, hidden=64, ffn=128, layers=3, encoder_layers=2, heads=2,
                                      damp=0.02),
                     "mistral": FamilySpec("mistral", vocab=300, hidden=64, ffn=128, layers=3, heads=2, damp=0.02)}


def _t5(spec: FamilySpec, layers: int):
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=spec.vocab, d_model=spec.hidden, d_ff=spec.ffn, d_kv=spec.hidden // spec.heads,
                   num_layers=spec.encoder_layers, num_decoder_layers=layers, num_heads=spec.heads,
                   pad_token_id=0, eos_token_id=2, decoder_start_token_id=0, tie_word_embeddings=False,
                   initializer_factor=10.0)  # at the default 1.0 a random T5 emits one token whatever it reads
    return T5ForConditionalGeneration(cfg).eval()


def _mistral(spec: FamilySpec, layers: int, window: int):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.ffn,
                        num_hidden_layers=layers, num_attention_heads=spec.heads, num_key_value_heads=spec.heads // 3
                        if spec.heads % 3 == 0 else spec.heads, sliding_window=window, max_position_embeddings=2048,
                        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=None)
    return MistralForCausalLM(cfg).eval()


def build_family_pair(spec: FamilySpec, dest: Path, window: int = WINDOW) -> dict[str, Path]:
    """Save (once) the target and its first-layer draft under `dest`."""
    dest = Path(dest) / f"synthetic-{spec.key()}-w{window}"
    dirs = {"target": dest / "target", "draft": dest / "draft"}
    if all((d / "config.json").exists() for d in dirs.values()):
        return dirs
    t0 = time.perf_counter()
    torch.manual_seed(0)
    if spec.family == "t5":
        target, draft = _t5(spec, spec.layers), _t5(spec, 1)
        with torch.no_grad():
            for block in target.decoder.block[1:]:
                block.layer[0].SelfAttention.o.weight.mul_(spec.damp)
                block.layer[1].EncDecAttention.o.weight.mul_(spec.damp)
                block.layer[2].DenseReluDense.wo.weight.mul_(spec.damp)
    elif spec.family == "mistral":
        target, draft = _mistral(spec, spec.layers, window), _mistral(spec, 1, window)
        with torch.no_grad():
            for layer in target.model.layers[1:]:
                layer.self_attn.o_proj.weight.mul_(spec.damp)
                layer.mlp.down_proj.weight.mul_(spec.damp)
    else:
        raise ValueError(spec.family)
    missing = draft.load_state_dict(target.state_dict(), strict=False)
    assert not missing.missing_keys, missing.missing_keys
    tok = _word_tokenizer(spec.vocab)
    save_models(dirs, {"target": target, "draft": draft}, tok)
    _LOG.info("built synthetic %s pair in %s (%.0f s)", spec.family, dest, time.perf_counter() - t0)
    return dirs


def describe(spec: FamilySpec, window: int = WINDOW) -> str:
    if spec.family == "t5":
        return (f"synthetic T5 pair ({spec.encoder_layers}-layer encoder, {spec.layers}-layer decoder, d_model "
                f"{spec.hidden}, d_ff {spec.ffn}, vocab {spec.vocab}; draft: the target's encoder (shared module) "
                "and its first decoder layer)")
    return (f"synthetic Mistral pair ({spec.layers} layers, hidden {spec.hidden}, vocab {spec.vocab}, sliding window "
            f"{window} tokens; draft: its first layer)")
