"""Tiny random models and a tokenizer, built offline so the tests never touch a model hub.

Weights are initialised with a large std so that next-token distributions are peaked:
greedy ties (which would make exactness tests flaky) are then vanishingly rare, and the
sampling tests get distributions far from uniform (so they have power).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

from pipeline.byte_bpe import train_byte_level_bpe

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts a few tokens with a small model and verifies them with a large one.",
    "A pipeline reads prompts from Parquet files and writes generations back to Parquet.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "Translate English to German: the house is small. Das Haus ist klein.",
    "Summarize: the committee met on Tuesday and agreed to fund the new library.",
    "Hello world! How are you today? I am fine, thank you.",
] * 4

def not_utf8(values: list) -> pa.Array:
    """A text column holding what the strings give and bytes as they are: what a writer that does
    not check UTF-8 leaves in a Parquet file."""
    return pa.array([v.encode() if isinstance(v, str) else v for v in values], pa.binary()).view(pa.string())


def build_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    return train_byte_level_bpe(CORPUS, vocab_size, model_max_length=512)


def _ids(tok: PreTrainedTokenizerFast) -> dict:
    return {
        "vocab_size": len(tok),
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }


def make_model(kind: str, tok: PreTrainedTokenizerFast, seed: int, layers: int = 2, hidden: int = 64,
               init_std: float = 0.3) -> PreTrainedModel:
    """A random model of `kind` whose vocabulary is `tok`'s."""
    torch.manual_seed(seed)
    ids = _ids(tok)
    if kind == "llama":
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          initializer_range=init_std, tie_word_embeddings=False, **ids)
        model = LlamaForCausalLM(cfg)
    elif kind == "gpt2":
        cfg = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=256,
                         initializer_range=init_std, **ids)
        model = GPT2LMHeadModel(cfg)
    elif kind == "t5":
        cfg = T5Config(d_model=hidden, d_ff=2 * hidden, d_kv=16, num_layers=layers, num_decoder_layers=layers,
                       num_heads=4, initializer_factor=init_std * 10, decoder_start_token_id=tok.pad_token_id,
                       **ids)
        model = T5ForConditionalGeneration(cfg)
    elif kind == "bart":
        cfg = BartConfig(d_model=hidden, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=4,
                         decoder_attention_heads=4, encoder_ffn_dim=2 * hidden, decoder_ffn_dim=2 * hidden,
                         max_position_embeddings=256, init_std=init_std, decoder_start_token_id=tok.eos_token_id,
                         forced_eos_token_id=tok.eos_token_id, **ids)
        model = BartForConditionalGeneration(cfg)
    else:
        raise ValueError(kind)
    return model.eval()


def perturbed_copy(model: PreTrainedModel, noise: float, seed: int) -> PreTrainedModel:
    """A draft that agrees with `model` part of the time: its weights plus Gaussian noise."""
    draft = type(model)(model.config).eval()
    draft.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            # (a one-element parameter, as xIELU's scalars in Apertus, has no std: NaN would make a NaN draft)
            spread = p.std().clamp_min(1e-3) if p.numel() > 1 else p.abs().clamp_min(1e-3)
            p.add_(torch.randn(p.shape, generator=gen) * noise * spread)
    return draft


def save_pair(root: Path, kind: str, noise: float = 0.3) -> tuple[Path, Path]:
    """Save a target, a partly-agreeing draft and the shared tokenizer as HF directories."""
    tok = build_tokenizer()
    target = make_model(kind, tok, seed=1)
    draft = perturbed_copy(target, noise, seed=2)
    paths = root / f"{kind}-target", root / f"{kind}-draft"
    for model, path in zip((target, draft), paths, strict=True):
        model.save_pretrained(path)
        tok.save_pretrained(path)
    return paths


# A chat format in the style of instruct models: role markers and an end-of-turn token that are
# special tokens, and a template that refuses a conversation opening with the assistant.
CHAT_SPECIALS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if loop.first and m['role'] == 'assistant' %}"
    "{{ raise_exception('a conversation cannot open with the assistant') }}{% endif %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_chat_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny tokenizer plus chat special tokens and a chat template."""
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": CHAT_SPECIALS})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_chat_pair(root: Path, kind: str = "llama", noise: float = 0.05) -> tuple[Path, Path]:
    """An "instruct" pair: a tokenizer with a chat template, and a generation config that lists
    two end tokens (</s> and <|end|>), as Llama 3 and Qwen 2.5 chat models do."""
    tok = build_chat_tokenizer()
    target = make_model(kind, tok, seed=1)
    draft = perturbed_copy(target, noise, seed=2)
    paths = Path(root) / f"{kind}-chat-target", Path(root) / f"{kind}-chat-draft"
    for model, path in zip((target, draft), paths, strict=True):
        model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<|end|>")]
        model.save_pretrained(path)
        tok.save_pretrained(path)
    return paths
