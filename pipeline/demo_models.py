"""The demo's T5 target/draft pair: committed weights, checked by hash, and the recipe that made them.

Decision: the weights are committed (``pipeline/demo_pair/``, fp16, 5.7 MB with tokenizers and
prompts) rather than trained on first use. A pair trained on the user's machine within a time
budget came out worse on slower CPUs (an AVX2 machine got 167 of 390 steps and a degenerate
target); a pair trained to a step budget would make a slow machine wait half an hour before the
first result. Committed weights give every machine the same pair and a first run of about a
minute. The recipe that made them stays here and reruns on any machine:

    python -m pipeline.demo_models --retrain [--out DIR]

It trains by steps, never by seconds, logging progress and an ETA, so a slower machine waits
longer for the same pair; it fails with one line if the pair misses its quality gate.

Recipe (``FULL``): a byte-level BPE of 2048 tokens on the training functions' code and
docstrings; a T5 target (4 encoder + 4 decoder layers, d_model 128) trained on function code ->
docstring summary; a T5 draft (1 + 1 layers) that starts from the target's embedding, first
encoder and decoder blocks and final norms, then learns the target's own greedy summaries of the
training functions (sequence-level distillation: what the draft must predict is what the target
says, not what the reference says). fp32 training (bit-for-bit the same kernels' math on any
x86 CPU up to rounding); weights saved in fp16 and the gate measured on the saved weights.

``NAMES`` (``--retrain --names``) is the same recipe with the code's names given as words (a
prompt head and split identifiers); it missed the gate too (README). So did ``WEAK`` (``--weak``):
NAMES plus undocumented functions labelled with their own names. ``COPY`` (``--copy``) is NAMES
after a copy school on examples the target cannot memorise: its target passes the ROUGE-L bar,
its draft does not follow it (README). ``--target_from DIR`` trains only a new draft for the
target of a pair the recipe made.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Busy-waiting OpenMP threads collapse throughput when other processes share the cores; passive
# waiting costs little at training sizes. Effective only before torch is imported.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from pipeline import demo_data  # noqa: E402

logger = logging.getLogger(__name__)

ASSETS = Path(__file__).with_name("demo_pair")
MANIFEST = "MANIFEST.json"
PROMPTS = "prompts.parquet"
SENTINELS = tuple(f"<extra_id_{i}>" for i in range(8))  # T5's span-corruption markers, ids 3..10
SPECIALS = ("<pad>", "</s>", "<unk>", *SENTINELS)  # T5's ids: pad 0 (also the decoder start), eos 1
UNK = 2
TASK_PREFIX = "summarize: "  # T5's own prefix for the task; part of every demo prompt
RECIPE_VERSION = 2  # bump when the code changes what a recipe produces


class DemoSetupError(RuntimeError):
    """A problem the user must fix (damaged assets, unwritable directory), as one line."""


class DemoQualityError(DemoSetupError):
    """A retrained pair missed the quality gate."""


@dataclass(frozen=True)
class T5Spec:
    d_model: int
    d_ff: int
    heads: int
    encoder_layers: int
    decoder_layers: int


@dataclass(frozen=True)
class TrainSpec:
    steps: int
    batch_size: int
    lr: float
    warmup_frac: float = 0.05
    final_lr_frac: float = 0.05
    weight_decay: float = 0.01
    # Share of batches from a second data set: span corruption for the target (T5's own pretraining
    # objective), the reference summaries for the draft (whose main data is the target's summaries).
    extra_frac: float = 0.0
    # Share of the decoder's input tokens replaced by <unk> in training (word dropout, Bowman et
    # al. 2016): a decoder that cannot lean on its own past must read the encoder. Without it the
    # small target learned one generic summary ("Return a list of the given path.") for every input.
    decoder_dropout: float = 0.0


@dataclass(frozen=True)
class QualityGate:
    """What a pair must reach on the demo prompts (greedy, model draft) to be kept."""

    min_acceptance: float = 0.6
    min_rouge_l: float = 0.2
    max_degenerate_share: float = 0.05
    min_distinct_share: float = 0.5  # a target that ignores its input repeats one summary everywhere


_LATER_OPTIONS = ("split_identifiers", "name_head", "pretraining", "name_labels", "copy_school")


@dataclass(frozen=True)
class Recipe:
    name: str
    vocab_size: int
    max_code_tokens: int  # training inputs are cut to this many tokens (prompts must fit whole)
    max_summary_tokens: int
    target: T5Spec
    draft: T5Spec
    target_train: TrainSpec
    draft_train: TrainSpec
    prompts: int  # demo prompts kept from held-out files
    gate: QualityGate
    max_new_tokens: int = 64
    heldout_mod: int = 10
    file_stride: int = 1  # train on every n-th training file (CI-sized recipes take fewer)
    # Keep functions whose summary's content words mostly occur in their own code: a summary a
    # small model can ground in its input (the rest name things only a model that read far more
    # than the standard library could know).
    min_grounding: float = 0.0
    # Shipped in both generation configs, as summarization checkpoints do (BART-CNN: 3). The engine
    # applies the target's processors to p and q alike, so speculative output stays exact.
    no_repeat_ngram_size: int = 0
    # Write every compound identifier of the code as its words (`get_user_name` -> `get user name`),
    # as code-summarization preprocessing does, so the code's names are the summary's tokens.
    split_identifiers: bool = False
    # Lead each prompt with the function's and its parameters' names in words (`prompt_head`).
    name_head: bool = False
    # The target's second data set: "span" is T5's span corruption (the decoder writes only the
    # masked spans, which are not in its input); "infill" is BART's text infilling (the decoder
    # writes the whole window back, copying what it can read), which teaches copying from the input.
    pretraining: str = "span"
    # Weak labels: undocumented training functions, as many as this share of the documented ones,
    # each labelled with its own name as a sentence (`get_user_name` -> "Get user name."). They
    # reward copying the input's names, which the few thousand real summaries alone did not teach.
    name_labels: float = 0.0
    # Copy school: the target first learns to copy on fresh examples, then the summaries. Its
    # main data are real training functions renamed to random names of real words, each labelled
    # with its new name as a sentence (`renamed_functions`); its second data set (`extra_frac`) are
    # marked spans of code to write back (`marked_spans`). A new example at nearly every step, so
    # only copying lowers the loss (`benchmarks/t5_copy_probe.py`: on reused examples this model
    # memorises instead). The summaries stage then keeps both as its second data set.
    copy_school: TrainSpec | None = None
    seed: int = 1234

    def hash(self) -> str:
        # Options added after a pair was committed count only when set, so the committed pair's
        # recipe keeps the hash its manifest records.
        recipe = {k: v for k, v in dataclasses.asdict(self).items()
                  if not (k in _LATER_OPTIONS and v == getattr(Recipe, k))}
        payload = {"version": RECIPE_VERSION, "recipe": recipe,
                   "python": f"{sys.version_info.major}.{sys.version_info.minor}"}  # the stdlib is the data
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


FULL = Recipe(
    name="full",
    vocab_size=2048,
    max_code_tokens=64,
    max_summary_tokens=40,
    # Equal encoder and decoder depths: transformers 5 sizes generate()'s cache by the encoder's.
    target=T5Spec(d_model=128, d_ff=512, heads=4, encoder_layers=4, decoder_layers=4),
    draft=T5Spec(d_model=128, d_ff=512, heads=4, encoder_layers=1, decoder_layers=1),
    target_train=TrainSpec(steps=2000, batch_size=32, lr=2e-3, extra_frac=0.2, decoder_dropout=0.3),
    draft_train=TrainSpec(steps=400, batch_size=32, lr=3e-3, extra_frac=0.1),
    prompts=40,
    gate=QualityGate(),
    min_grounding=0.4,
    no_repeat_ngram_size=3,
)

# The best of three tries of the names-in-words hypothesis (README's table; none reached the
# gate): the code's names as words, and a 2 + 1-layer draft (two encoder layers read the prompt
# once, one decoder layer keeps each drafted token cheap). The other two: FULL with only
# name_head; this with pretraining="infill" on 30% of the target's batches.
NAMES = dataclasses.replace(
    FULL, name="names", name_head=True, split_identifiers=True,
    draft=T5Spec(d_model=128, d_ff=512, heads=4, encoder_layers=2, decoder_layers=1))

WEAK = dataclasses.replace(NAMES, name="weak", name_labels=0.5,
                           draft_train=dataclasses.replace(NAMES.draft_train, steps=800))

# Copy school first (README): the names-in-words recipe, the target taught to copy on fresh
# examples for 8000 steps at the learning rate the copy probe learnt at, then the summaries at a
# lower rate than FULL's so that the copying survives them.
COPY = dataclasses.replace(
    NAMES, name="copy",
    copy_school=TrainSpec(steps=8000, batch_size=32, lr=3e-4, final_lr_frac=0.5, extra_frac=0.3),
    target_train=dataclasses.replace(NAMES.target_train, steps=3000, lr=5e-4),
    # The target's whole encoder (run once per prompt) and a 2-layer decoder (run per drafted token).
    draft=T5Spec(d_model=128, d_ff=512, heads=4, encoder_layers=4, decoder_layers=2),
    draft_train=dataclasses.replace(NAMES.draft_train, steps=3000, lr=1e-3, extra_frac=0.2))

# CI-sized: trains in seconds; its gate is only "the code runs", so tests can also make it fail.
TINY = Recipe(
    name="tiny",
    vocab_size=400,
    max_code_tokens=160,
    max_summary_tokens=24,
    target=T5Spec(d_model=32, d_ff=64, heads=2, encoder_layers=2, decoder_layers=2),
    draft=T5Spec(d_model=32, d_ff=64, heads=2, encoder_layers=1, decoder_layers=1),
    target_train=TrainSpec(steps=6, batch_size=8, lr=3e-3),
    draft_train=TrainSpec(steps=4, batch_size=8, lr=3e-3),
    prompts=6,
    gate=QualityGate(min_acceptance=0.0, min_rouge_l=0.0, max_degenerate_share=1.0, min_distinct_share=0.0),
    max_new_tokens=12,
    file_stride=20,
)


# --------------------------------------------------------------------------------------------
# The committed pair: checked by hash before use
# --------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(assets: Path = ASSETS) -> dict:
    try:
        return json.loads((assets / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise DemoSetupError(f"{assets / MANIFEST}: cannot read the demo pair's manifest ({e}); restore it "
                             "from git or rebuild with `python -m pipeline.demo_models --retrain`") from None


def verify_assets(assets: Path = ASSETS) -> dict:
    """The manifest, once every file it lists has its recorded SHA-256; else a one-line error."""
    manifest = read_manifest(assets)
    for rel, digest in sorted(manifest["files"].items()):
        path = assets / rel
        if not path.is_file():
            problem = "is missing"
        elif _sha256(path) != digest:
            problem = "does not match its recorded SHA-256 (damaged or changed)"
        else:
            continue
        raise DemoSetupError(f"demo pair file {path} {problem}; restore it (git checkout -- {assets}) "
                             f"or rebuild the pair with `python -m pipeline.demo_models --retrain`")
    return manifest


def demo_pair_dirs(assets: Path = ASSETS) -> tuple[Path, Path]:
    """(target dir, draft dir): ordinary Hugging Face directories, verified."""
    verify_assets(assets)
    return assets / "target", assets / "draft"


def demo_prompt_rows(assets: Path = ASSETS) -> list[dict]:
    """The committed demo prompts: id, prompt (function code), reference (its docstring summary), ..."""
    import pyarrow.parquet as pq

    return pq.read_table(assets / PROMPTS).to_pylist()


# --------------------------------------------------------------------------------------------
# Recipe: tokenizer, models, training
# --------------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE wrapped as a transformers fast tokenizer that appends </s>, as T5's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=1_000_000)


def make_model(spec: T5Spec, vocab_size: int, seed: int):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(vocab_size=vocab_size, d_model=spec.d_model, d_kv=spec.d_model // spec.heads,
                      d_ff=spec.d_ff, num_layers=spec.encoder_layers, num_decoder_layers=spec.decoder_layers,
                      num_heads=spec.heads, dropout_rate=0.0, pad_token_id=0, eos_token_id=1,
                      decoder_start_token_id=0, tie_word_embeddings=True)
    model = T5ForConditionalGeneration(config)
    model.generation_config.decoder_start_token_id = 0
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model


def init_draft_from_target(draft, target) -> None:
    """Copy the shared embedding, the first blocks (with T5's relative-position bias) and final norms."""
    t = target.state_dict()
    own = draft.state_dict()
    draft.load_state_dict({k: t[k] for k in own if k in t and t[k].shape == own[k].shape}, strict=False)


def _fmt_s(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _batches(pairs: list[tuple[list[int], list[int]]], batch_size: int, rng: random.Random):
    """Endless batches of similar-length inputs (less padding), in a seeded order."""
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    while True:
        rng.shuffle(chunks)
        for chunk in chunks:
            src = [pairs[i][0] for i in chunk]
            tgt = [pairs[i][1] for i in chunk]
            x = torch.zeros(len(chunk), max(map(len, src)), dtype=torch.long)
            y = torch.full((len(chunk), max(map(len, tgt))), -100, dtype=torch.long)
            for r, (s, t) in enumerate(zip(src, tgt, strict=True)):
                x[r, :len(s)] = torch.tensor(s)
                y[r, :len(t)] = torch.tensor(t)
            yield x, (x != 0).long(), y


def train(model, pairs, spec: TrainSpec, seed: int, name: str, extra_pairs=None, log_every_s: float = 15.0,
          probe=None) -> dict:
    """Train by steps (never by seconds): the same pair on any machine, a slower one just waits longer."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=spec.lr)
    main = _batches(pairs, spec.batch_size, rng)
    extra = _batches(extra_pairs, spec.batch_size, rng) if extra_pairs and spec.extra_frac > 0 else None
    model.train()
    start = last = time.monotonic()
    ema = None
    logger.info("%s: %.2fM parameters, %d steps of %d examples", name,
                sum(p.numel() for p in model.parameters()) / 1e6, spec.steps, spec.batch_size)
    for step in range(1, spec.steps + 1):
        progress = (step - 1) / spec.steps
        if progress < spec.warmup_frac:
            lr = spec.lr * max(progress / spec.warmup_frac, 0.02)
        else:
            t = (progress - spec.warmup_frac) / (1 - spec.warmup_frac)
            lr = spec.lr * (spec.final_lr_frac + (1 - spec.final_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))
        for g in opt.param_groups:
            g["lr"] = lr
        use_extra = extra is not None and rng.random() < spec.extra_frac
        x, mask, y = next(extra if use_extra else main)
        decoder_ids = model._shift_right(y)
        if spec.decoder_dropout:
            drop = torch.rand(decoder_ids.shape, generator=gen) < spec.decoder_dropout
            drop[:, 0] = False  # keep the start token
            decoder_ids = decoder_ids.masked_fill(drop, UNK)
        loss = model(input_ids=x, attention_mask=mask, decoder_input_ids=decoder_ids, labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        now = time.monotonic()
        if now - last >= log_every_s or step == spec.steps:
            last = now
            elapsed = now - start
            eta = elapsed / step * (spec.steps - step)
            logger.info("%s: step %d/%d (%d%%) loss %.3f elapsed %s ETA %s", name, step, spec.steps,
                        100 * step // spec.steps, ema, _fmt_s(elapsed), _fmt_s(eta))
        if probe is not None and step % max(spec.steps // 4, 1) == 0:
            model.eval()
            probe(model)  # what it writes now, so a user sees it learn (or not) long before the end
            model.train()
    model.eval()
    return {"steps": spec.steps, "train_seconds": round(time.monotonic() - start, 1), "final_loss": round(ema, 4)}


@torch.inference_mode()
def greedy_summaries(model, sources: list[list[int]], max_new_tokens: int, batch_size: int = 64) -> list[list[int]]:
    """The model's own greedy output for each source (labels for the draft), batched by length."""
    out: list[list[int]] = [[] for _ in sources]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    start = last = time.monotonic()
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        x = torch.zeros(len(idx), max(len(sources[i]) for i in idx), dtype=torch.long)
        for r, i in enumerate(idx):
            x[r, :len(sources[i])] = torch.tensor(sources[i])
        gen = model.generate(input_ids=x, attention_mask=(x != 0).long(), do_sample=False,
                             max_new_tokens=max_new_tokens)
        for r, i in enumerate(idx):
            ids = gen[r, 1:].tolist()  # drop the decoder start token
            out[i] = ids[: ids.index(1) + 1] if 1 in ids else ids
        if time.monotonic() - last >= 15:
            last = time.monotonic()
            done = b + len(idx)
            logger.info("target summaries for the draft: %d/%d ETA %s", done, len(order),
                        _fmt_s((last - start) / done * (len(order) - done)))
    return out


def code_ids(tokenizer, texts: list[str]) -> list[int]:
    """The training code as one token stream (no end tokens), cut into windows by the pretraining data."""
    return [t for text in texts for t in tokenizer(text)["input_ids"][:-1]]


def span_corruption(tokenizer, ids: list[int], window: int, n: int, seed: int,
                    infill: bool = False) -> list[tuple[list[int], list[int]]]:
    """T5's pretraining examples from code: about 15% of a window's tokens, in spans of about 3,
    replaced by sentinels in the input and spelled out after them in the target. The decoder can
    only lower this loss by reading the encoder, which is what the small summarization set alone
    did not teach it (the target fell back to one generic summary for every input)."""
    rng = random.Random(seed)
    sentinel = tokenizer.convert_tokens_to_ids(SENTINELS[0])
    out = []
    for _ in range(n):
        start = rng.randrange(0, max(len(ids) - window, 1))
        toks = ids[start:start + window]
        spans = sorted(rng.sample(range(0, len(toks) - 3, 4), k=max(1, round(len(toks) * 0.15 / 3))))
        src, tgt, last = [], [], 0
        for i, at in enumerate(spans[: len(SENTINELS)]):
            length = rng.choice((2, 3, 4))
            src += toks[last:at] + [sentinel + i]
            tgt += [sentinel + i] + toks[at:at + length]
            last = at + length
        out.append((src + toks[last:] + [1], (toks if infill else tgt) + [1]))
    return out


def prompt_head(example: dict) -> str:
    """The prompt's first line: the task prefix, then the function's and its parameters' names in
    words. A byte-level BPE cuts `get_user_name` into tokens such as `_user` and `_name`, while the
    summary says ` user` and ` name`: different tokens, so a small model trained from scratch has to
    learn that the one is a copy of the other. Code-summarization preprocessing splits identifiers
    into subwords for the same reason (`Recipe.split_identifiers` does that to the code too); the
    head puts the names first, each word a space-led token as in the summary:
    `def get_user_name(self, user_id):` -> "summarize: get user name | user id"."""
    params = [demo_data.identifier_words(a) for a in example.get("params", ()) if a not in ("self", "cls")]
    head = TASK_PREFIX + demo_data.identifier_words(example["name"])
    return head + (" | " + ", ".join(p for p in params if p) if any(params) else "")


def prompt_text(example: dict, recipe: Recipe) -> str:
    """What the model reads, in training and in the demo alike: the head line (if the recipe has
    one), then the code."""
    return prompt_head(example) + "\n" + example["code"] if recipe.name_head else TASK_PREFIX + example["code"]


def _encode(tokenizer, examples: list[dict], recipe: Recipe) -> list[tuple[list[int], list[int]]]:
    pairs = []
    for ex in examples:
        src = tokenizer(prompt_text(ex, recipe))["input_ids"]
        tgt = tokenizer(ex["summary"])["input_ids"]
        # Inputs are cut as they were before the head: `max_code_tokens` of prefix and code, plus
        # whatever the head line adds, so the head never costs the code a token.
        limit = recipe.max_code_tokens
        if recipe.name_head:
            limit += len(src) - len(tokenizer(TASK_PREFIX + ex["code"])["input_ids"])
        if len(tgt) <= recipe.max_summary_tokens:
            pairs.append((src[: limit - 1] + [1] if len(src) > limit else src, tgt))
    return pairs


def pick_prompts(tokenizer, examples: list[dict], recipe: Recipe) -> list[dict]:
    """Held-out functions that fit whole, spread over files (one per file per pass), in a fixed order."""
    by_file: dict[str, list[dict]] = {}
    for ex in examples:
        n_code = len(tokenizer(TASK_PREFIX + ex["code"])["input_ids"])
        n_sum = len(tokenizer(ex["summary"])["input_ids"])
        if (demo_data.is_library(ex["file"]) and 16 <= n_code <= recipe.max_code_tokens
                and 6 <= n_sum <= recipe.max_summary_tokens):
            by_file.setdefault(ex["file"], []).append(ex)
    rows: list[dict] = []
    depth = 0
    while len(rows) < recipe.prompts and any(depth < len(v) for v in by_file.values()):
        for file in sorted(by_file):
            if depth < len(by_file[file]) and len(rows) < recipe.prompts:
                ex = by_file[file][depth]
                rows.append({"id": f"stdlib-{len(rows):04d}", "prompt": prompt_text(ex, recipe),
                             "reference": ex["summary"],
                             "source_file": ex["file"], "source_line": ex["line"], "function": ex["name"]})
        depth += 1
    if len(rows) < recipe.prompts:
        raise DemoSetupError(f"only {len(rows)} held-out functions fit the demo ({recipe.prompts} asked)")
    return rows


def evaluate_pair(target_dir: Path, draft_dir: Path, rows: list[dict], max_new_tokens: int) -> dict:
    """Greedy speculative decoding of the demo prompts with the saved pair, as the job runs it."""
    from pipeline.quality import score_generations
    from specdec_core.text import GeneratorSpec, TextGenerator

    spec = GeneratorSpec(target_model=str(target_dir), draft_model=str(draft_dir), max_new_tokens=max_new_tokens)
    generator = TextGenerator.load(spec)
    outs = [generator.generate(r["prompt"]) for r in rows]
    drafted = sum(o["draft_tokens"] for o in outs)
    quality = score_generations([o["generation"] for o in outs], [r["reference"] for r in rows])
    quality["rougeL_name_baseline"] = name_baseline(rows)
    return {"acceptance": sum(o["accepted_tokens"] for o in outs) / drafted if drafted else 0.0,
            "tokens_per_target_step": sum(o["new_tokens"] for o in outs) / sum(o["verify_steps"] for o in outs),
            **quality}


def name_words(name: str) -> str:
    """`_is_dataclassInstance` -> "is dataclass Instance"."""
    return " ".join(re.sub(r"([a-z])([A-Z])", r"\1 \2", name).replace("_", " ").split())


def name_baseline(rows: list[dict]) -> float:
    """What a summarizer must beat: ROUGE-L of "Return the <function name in words>." for every row."""
    from pipeline.quality import rouge

    return rouge([f"Return the {name_words(r['function'])}." for r in rows], [r["reference"] for r in rows])["rougeL"]


def check_gate(gate: QualityGate, measured: dict) -> None:
    problems = []
    if measured["acceptance"] < gate.min_acceptance:
        problems.append(f"acceptance {measured['acceptance']:.3f} < {gate.min_acceptance}")
    if measured["rougeL"] < gate.min_rouge_l:
        problems.append(f"ROUGE-L {measured['rougeL']:.3f} < {gate.min_rouge_l}")
    if measured["degenerate_share"] > gate.max_degenerate_share:
        problems.append(f"degenerate outputs {measured['degenerate_share']:.0%} > {gate.max_degenerate_share:.0%}")
    if measured.get("distinct_share", 1.0) < gate.min_distinct_share:
        problems.append(f"distinct outputs {measured['distinct_share']:.0%} < {gate.min_distinct_share:.0%}")
    if problems:
        raise DemoQualityError("the demo pair misses its quality gate: " + "; ".join(problems))


def _save(model, tokenizer, dest: Path) -> None:
    model.to(torch.float16).save_pretrained(dest)  # fp16 halves the repository's weight; loads as fp32 exactly
    tokenizer.save_pretrained(dest)
    model.to(torch.float32)


def write_pair(out: Path, target, draft, tokenizer, rows: list[dict], recipe: Recipe, info: dict,
               enforce_gate: bool = True) -> dict:
    """Save, measure against the gate, and put in place with its manifest (only if it passes,
    unless `enforce_gate` is off: then the manifest records which bars it missed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        for model, name in ((target, "target"), (draft, "draft")):
            model.generation_config.no_repeat_ngram_size = recipe.no_repeat_ngram_size
            _save(model, tokenizer, tmp / name)
        pq.write_table(pa.Table.from_pylist(rows), tmp / PROMPTS)
        measured = evaluate_pair(tmp / "target", tmp / "draft", rows, recipe.max_new_tokens)
        logger.info("quality on the demo prompts: %s", json.dumps(measured))
        missed = None
        try:
            check_gate(recipe.gate, measured)
        except DemoQualityError as e:  # keep the rejected pair for a look, never in place of the good one
            missed = str(e)
            if not enforce_gate:
                logger.warning("%s: kept anyway (enforce_gate=False)", missed)
        if missed and enforce_gate:
            rejected = out.with_name(f"{out.name}.rejected")
            shutil.rmtree(rejected, ignore_errors=True)
            os.replace(tmp, rejected)
            raise DemoQualityError(f"{missed} (the rejected pair is in {rejected})")
        files = {p.relative_to(tmp).as_posix(): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {"recipe": recipe.name, "recipe_hash": recipe.hash(), "files": files, **info,
                    "quality": measured, "gate": dataclasses.asdict(recipe.gate),
                    "gate_passed": missed is None, "gate_missed": missed,
                    "built_with": {"python": sys.version.split()[0], "torch": torch.__version__,
                                   "cpu": torch.backends.cpu.get_cpu_capability()}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, out)
        out.chmod(0o755)  # mkdtemp made it private
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def name_sentence(name: str) -> str | None:
    """A function's name as a sentence, the weak label of an undocumented function; None for names
    that say little (dunders, tests, single words)."""
    words = demo_data.identifier_words(name).split()
    if name.startswith("__") or len(words) < 2 or words[0] in ("test", "tear", "set") or any(map(str.isdigit, name)):
        return None
    return " ".join([words[0].capitalize(), *words[1:]]) + "."


def name_labelled(files: list[str], root: Path, code_of, n: int, seed: int) -> list[dict]:
    found = [{**e, "code": code_of(e["code"]), "summary": label}
             for rel in files for e in demo_data.functions(root, rel, undocumented=True)
             if (label := name_sentence(e["name"]))]
    return random.Random(seed).sample(found, min(n, len(found)))


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def name_vocabulary(texts: list[str], size: int = 4000) -> list[str]:
    """The words the code's identifiers are made of, most common first (names for copy school)."""
    counts = collections.Counter(w for text in texts for ident in _IDENT.findall(text)
                                 for w in demo_data.identifier_words(ident).split() if len(w) >= 2 and w.isalpha())
    return [w for w, c in counts.most_common(size) if c >= 3]


def renamed_functions(functions: list[dict], words: list[str], n: int, seed: int, code_of) -> list[dict]:
    """Real functions under random names of 2-4 real words, each labelled with its new name as a
    sentence: a name the model has never seen, so it can only be copied from the prompt."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        e = functions[rng.randrange(len(functions))]
        new = "_".join(rng.choice(words) for _ in range(rng.randint(2, 4)))
        code = re.sub(r"\b" + re.escape(e["name"]) + r"\b", new, e["code"])
        out.append({**e, "name": new, "code": code_of(code), "summary": name_sentence(new) or new.capitalize() + "."})
    return out


def marked_spans(tokenizer, ids: list[int], n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """Windows of code (`code_ids`) with 2-6 tokens between two markers; the label is those tokens."""
    rng = random.Random(seed)
    open_, close = tokenizer.convert_tokens_to_ids([SENTINELS[6], SENTINELS[7]])
    out = []
    for _ in range(n):
        size = rng.randint(24, 60)
        start = rng.randrange(0, max(len(ids) - size, 1))
        w = ids[start:start + size]
        a = rng.randrange(0, max(len(w) - 6, 1))
        b = a + rng.randint(2, 6)
        out.append((w[:a] + [open_] + w[a:b] + [close] + w[b:] + [1], w[a:b] + [1]))
    return out


@dataclass
class TrainingData:
    """What a recipe trains on, read from the stdlib once and shared by the target and draft stages."""

    recipe: Recipe
    tokenizer: Any  # a transformers fast tokenizer (imported lazily)
    pairs: list[tuple[list[int], list[int]]]  # (prompt, summary) of the documented training functions
    rows: list[dict]  # the demo prompts, from held-out files
    texts: list[str]  # a few MB of training code, for the pretraining and copy-school windows
    functions: list[dict]  # every training function (copy school renames them)
    code_of: Callable[[str], str]  # how code is written into prompts (`split_identifiers` or as is)

    @functools.cached_property
    def ids(self) -> list[int]:
        return code_ids(self.tokenizer, self.texts)

    @functools.cached_property
    def words(self) -> list[str]:
        return name_vocabulary(self.texts)

    def renamed(self, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
        return _encode(self.tokenizer, renamed_functions(self.functions, self.words, n, seed, self.code_of),
                       self.recipe)

    def probe(self, model) -> None:
        """Log what the model writes for the first demo prompts, so a user sees it learn (or not)."""
        ids = [self.tokenizer(r["prompt"])["input_ids"] for r in self.rows[:4]]
        for src, summary in zip(ids, greedy_summaries(model, ids, self.recipe.max_summary_tokens), strict=True):
            logger.info("  %r -> %r", self.tokenizer.decode(src[:12]) + "...",
                        self.tokenizer.decode(summary, skip_special_tokens=True))


def training_data(recipe: Recipe, tokenizer=None) -> TrainingData:
    """The stdlib's training and held-out functions, the tokenizer (trained here unless given) and
    the demo prompts."""
    root = demo_data.stdlib_root()
    train_files, held_files = demo_data.split_files(demo_data.stdlib_files(root), recipe.heldout_mod)
    train_files = train_files[:: recipe.file_stride]
    train_ex, held_ex = ([e for e in demo_data.examples(files, root) if demo_data.grounding(e) >= recipe.min_grounding]
                         for files in (train_files, held_files))
    code_of = demo_data.split_identifiers if recipe.split_identifiers else str
    train_ex, held_ex = ([{**e, "code": code_of(e["code"])} for e in exs] for exs in (train_ex, held_ex))
    if len(train_ex) < 50 or not held_ex:
        raise DemoSetupError(f"too few documented functions under the stdlib directory {root} "
                             f"({len(train_ex)} to train on) to build the demo pair")
    logger.info("%d training functions from %d files, %d held-out functions", len(train_ex), len(train_files),
                len(held_ex))
    if tokenizer is None:
        tokenizer = train_tokenizer([e["code"] for e in train_ex] + [e["summary"] for e in train_ex],
                                    recipe.vocab_size)
    pairs = _encode(tokenizer, train_ex, recipe)
    rows = pick_prompts(tokenizer, held_ex, recipe)
    if recipe.name_labels:
        weak = name_labelled(train_files, root, code_of, round(recipe.name_labels * len(pairs)), recipe.seed + 7)
        logger.info("%d undocumented functions labelled with their names", len(weak))
        pairs += _encode(tokenizer, weak, recipe)
    texts, size = [], 0
    for f in train_files:  # a few MB of code is plenty of windows
        if size < 6_000_000 and (text := demo_data.read_source(root, f)):
            texts.append(code_of(text))
            size += len(text)
    functions = []
    if recipe.copy_school is not None:
        functions = [e for rel in train_files
                     for e in (*demo_data.functions(root, rel), *demo_data.functions(root, rel, undocumented=True))
                     if not e["name"].startswith("__")]
    return TrainingData(recipe, tokenizer, pairs, rows, texts, functions, code_of)


def train_target(data: TrainingData):
    """Span corruption (or infilling) beside the summaries, after the copy school if the recipe has one."""
    recipe, tokenizer = data.recipe, data.tokenizer
    target = make_model(recipe.target, len(tokenizer), recipe.seed)
    extra = span_corruption(tokenizer, data.ids, recipe.max_code_tokens, 50_000, recipe.seed + 5,
                            infill=recipe.pretraining == "infill")
    if recipe.copy_school is not None:
        school = recipe.copy_school
        renamed = data.renamed(school.steps * school.batch_size, recipe.seed + 8)
        marked = marked_spans(tokenizer, data.ids, school.steps * school.batch_size, recipe.seed + 9)
        logger.info("copy school: %d renamed functions, %d marked spans", len(renamed), len(marked))
        train(target, renamed, school, recipe.seed + 10, "copy school", extra_pairs=marked, probe=data.probe)
        extra = renamed[:40_000] + marked[:40_000]  # keeps copying alive while the summaries are learnt
    info = train(target, data.pairs, recipe.target_train, recipe.seed + 1, "target", extra_pairs=extra,
                 probe=data.probe)
    target.to(torch.float16).to(torch.float32)  # the draft learns its fp16-rounded self, as shipped
    return target, info


def train_draft(data: TrainingData, target):
    """The draft learns what the target says. A target that copies names needs a draft that copies
    them too: it also learns the target's summaries of renamed functions, and marked spans."""
    recipe = data.recipe
    sources, extra = [s for s, _ in data.pairs], data.pairs
    if recipe.copy_school is not None:
        seen = recipe.draft_train.steps * recipe.draft_train.batch_size  # more would go unused
        sources += [s for s, _ in data.renamed(min(20_000, seen), recipe.seed + 11)]
        extra = marked_spans(data.tokenizer, data.ids, min(40_000, seen), recipe.seed + 12)
    labels = greedy_summaries(target, sources, recipe.max_summary_tokens)
    draft = make_model(recipe.draft, len(data.tokenizer), recipe.seed + 2)
    init_draft_from_target(draft, target)
    draft_pairs = [(s, t) for s, t in zip(sources, labels, strict=True) if t]
    return draft, train(draft, draft_pairs, recipe.draft_train, recipe.seed + 3, "draft", extra_pairs=extra)


def retrain(out: Path = ASSETS, recipe: Recipe = FULL, target_from: Path | None = None) -> dict:
    """Build the pair and prompts from the stdlib into `out` (replaced only if the gate passes).
    `target_from`: a pair directory this recipe made (a rejected one too); its target and tokenizer
    are kept and only the draft is trained, for trying drafts without an hour of target training."""
    t0 = time.monotonic()
    if target_from is None:
        data = training_data(recipe)
        target, target_info = train_target(data)
    else:
        from transformers import AutoTokenizer, T5ForConditionalGeneration

        data = training_data(recipe, AutoTokenizer.from_pretrained(Path(target_from) / "target"))
        target = T5ForConditionalGeneration.from_pretrained(Path(target_from) / "target", dtype=torch.float32).eval()
        target_info = {"reused_from": Path(target_from).name}
        logger.info("target: reused from %s (only the draft is trained)", target_from)
    draft, draft_info = train_draft(data, target)
    info = {"target": {**target_info, "params": sum(p.numel() for p in target.parameters())},
            "draft": {**draft_info, "params": sum(p.numel() for p in draft.parameters())}}
    manifest = write_pair(Path(out), target, draft, data.tokenizer, data.rows, recipe, info)
    logger.info("demo pair written to %s in %s", out, _fmt_s(time.monotonic() - t0))
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Check the committed demo pair, or rebuild it with its recipe.")
    ap.add_argument("--retrain", action="store_true", help="rebuild the pair and prompts from the stdlib")
    ap.add_argument("--out", default=str(ASSETS), help=f"where the pair goes (default {ASSETS})")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--tiny", action="store_true", help="the CI-sized recipe (seconds; no real quality)")
    which.add_argument("--names", action="store_true", help="the names-in-words recipe (README: below its gate)")
    which.add_argument("--weak", action="store_true", help="NAMES plus undocumented functions labelled by their names")
    which.add_argument("--copy", action="store_true", help="NAMES after a copy school on fresh renamed functions")
    ap.add_argument("--target_from", default=None, metavar="DIR",
                    help="keep the target of a pair this recipe made (DIR.rejected too); train only the draft")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.retrain:
            recipe = (TINY if args.tiny else NAMES if args.names else WEAK if args.weak else COPY if args.copy
                      else FULL)
            if args.target_from and not (Path(args.target_from) / "target" / "config.json").is_file():
                raise DemoSetupError(f"--target_from {args.target_from}: no target/config.json there")
            manifest = retrain(Path(args.out), recipe, Path(args.target_from) if args.target_from else None)
        else:
            manifest = verify_assets(Path(args.out))
    except DemoSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: manifest[k] for k in ("recipe", "quality")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
