"""The models and prompts `pipeline.bench` measures: a synthetic Llama pair of realistic size
(random weights, the target's deeper layers damped so that an early-exit draft made of its
first layer agrees with it: the COSTS are those of a real model of that size, the ACCEPTANCE
is whatever the damping gives), a disagreeing random draft, and mixed synthetic prompts."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

_LOG = logging.getLogger("pipeline.bench")


@dataclass(frozen=True)
class SynthSpec:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    draft_layers: int
    damp: float

    def key(self) -> str:
        return "-".join(str(x) for x in (self.vocab, self.hidden, self.intermediate, self.layers, self.heads,
                                          self.draft_layers, self.damp))


FULL_SYNTH = SynthSpec(vocab=8000, hidden=1024, intermediate=2816, layers=24, heads=16, draft_layers=1, damp=0.015)

QUICK_SYNTH = SynthSpec(vocab=2000, hidden=384, intermediate=1024, layers=8, heads=6, draft_layers=1, damp=0.02)
TINY_SYNTH = SynthSpec(vocab=300, hidden=64, intermediate=128, layers=3, heads=2, draft_layers=1, damp=0.02)


def _word_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    words.update({f"t{i}": i for i in range(4, vocab)})
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=4096)


def _llama_config(spec: SynthSpec, layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                       num_hidden_layers=layers, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
                       max_position_embeddings=2048, tie_word_embeddings=False, pad_token_id=0,
                       bos_token_id=1, eos_token_id=None)


def build_synthetic_pair(spec: SynthSpec, dest: Path) -> dict[str, Path]:
    """Save (once) target, early-exit draft and a disagreeing random draft under `dest`."""
    from transformers import LlamaForCausalLM

    dest = Path(dest) / f"synthetic-{spec.key()}"
    dirs = {"target": dest / "target", "draft": dest / "draft", "bad_draft": dest / "bad_draft"}
    if all((d / "config.json").exists() for d in dirs.values()):
        return dirs
    t0 = time.perf_counter()
    torch.manual_seed(0)
    target = LlamaForCausalLM(_llama_config(spec, spec.layers)).eval()
    with torch.no_grad():
        # Damping the residual-branch outputs of the deeper layers changes what the target
        # computes (so an early exit agrees with it), not what it costs.
        for layer in target.model.layers[spec.draft_layers:]:
            layer.self_attn.o_proj.weight.mul_(spec.damp)
            layer.mlp.down_proj.weight.mul_(spec.damp)
    draft = LlamaForCausalLM(_llama_config(spec, spec.draft_layers)).eval()
    missing = draft.load_state_dict(target.state_dict(), strict=False)
    assert not missing.missing_keys, missing.missing_keys
    torch.manual_seed(1)
    bad = LlamaForCausalLM(_llama_config(spec, spec.draft_layers)).eval()
    tok = _word_tokenizer(spec.vocab)
    save_models(dirs, {"target": target, "draft": draft, "bad_draft": bad}, tok)
    _LOG.info("built synthetic pair in %s (%.0f s)", dest, time.perf_counter() - t0)
    return dirs


def save_models(dirs: dict[str, Path], models: dict, tok) -> None:
    """Each model with the tokenizer into its directory, written aside and renamed into place (a
    cache directory is either whole or absent); no end token, so every row runs to its length."""
    for name, model in models.items():
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        tmp = dirs[name].with_name(dirs[name].name + ".tmp")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, dirs[name])


def synthetic_prompts(spec: SynthSpec, n: int, length: int, seed: int = 0) -> list[tuple[str, str]]:
    """A mixed set: odd items are random token strings (no repetition to look up), even items
    repeat a short random pattern (easy for prompt lookup)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        if i % 2:
            ids = torch.randint(4, spec.vocab, (length,), generator=g).tolist()
            kind = "random"
        else:
            pat = torch.randint(4, spec.vocab, (7,), generator=g).tolist()
            ids = (pat * (length // 7 + 1))[:length]
            kind = "repetitive"
        out.append((kind, " ".join(f"t{t}" for t in ids)))
    return out


def load_pair(target_dir: Path, draft_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(target_dir)
    return target, draft, tok


BENCH_DRAFT_DTYPES = ("float32", "auto", "bfloat16", "int8")


def draft_variants(draft: torch.nn.Module, draft_p: torch.nn.Module, dtypes: list[str]) -> dict[str, torch.nn.Module]:
    """The draft in each of `dtypes`, as `--draft_dtype` with `--cpu_kernels prepacked` makes it
    ("float32": the prepacked fp32 draft used everywhere else; "auto" (the job's default: large
    linears with bf16 weights where the CPU has native bf16), "bfloat16" (packed where the CPU has
    native bf16), "int8": a copy; int8 is left out where this torch build cannot quantize).
    Only the draft changes, so greedy outputs stay identical and sampling stays exact."""
    import copy

    from specdec_core.cpu_speed import draft_in_dtype, prepare_for_cpu

    out: dict[str, torch.nn.Module] = {}
    for dtype in dtypes:
        if dtype not in BENCH_DRAFT_DTYPES:
            raise ValueError(f"unknown draft dtype {dtype!r} ({', '.join(BENCH_DRAFT_DTYPES)})")
        if dtype == "float32":
            out[dtype] = draft_p
            continue
        fresh = copy.deepcopy(draft)
        model = draft_in_dtype(fresh, dtype)
        if dtype == "int8" and model is fresh:
            _LOG.warning("int8 draft skipped: dynamic quantization unavailable in this torch build")
            continue
        out[dtype] = prepare_for_cpu(model.eval())
    return out
