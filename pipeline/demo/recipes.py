"""The demo pair's recipes: model shapes, training schedules and quality gates (`pipeline.demo.models` trains them).

The recipes are the tries of docs/demo.md, in order. T5 targets: ``FULL`` (one digit per token),
``NARROW``, ``LABELLED``, ``GROUPS`` (digit groups of up to three as tokens), ``COMPOSED`` (their
embeddings composed from their digits' places), ``COMPOSED3`` (2-3 items), two second stages on a
``COMPOSED3`` pair (``--init_from DIR``): ``DISTINCT`` and ``ORDERED`` (items one per kind, in a
fixed order), and three third stages on an ``ORDERED`` pair, the task narrowed to fewer items per
prompt: ``FEW`` (1 to 3), ``PAIRS`` (1 or 2) and ``SINGLE`` (one). Then ``DECODER``, the committed
pair's: a decoder-only (Llama-style) target, which finds the item it writes by position as well as
by content. Every one is trained on a fresh batch of the task of `pipeline.demo.data` at every step
with LayerSkip's early-exit loss (Elhoushi et al. 2024): the outputs of its first decoder layers,
read through its final norm and tied head, learn the same labels. The draft is the target's
embedding, encoder (T5) and first ``draft_layers`` decoder layers cut out, untrained. `COMMITTED` is the
committed pair's recipe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from pipeline.demo import data

RECIPE_VERSION = 2  # bump when the code changes what a recipe produces (2: evaluation prompts never trained on)


@dataclass(frozen=True)
class ModelSpec:
    """A T5 (encoder and decoder), or with `encoder_layers` 0 a decoder-only Llama-style model: prompt
    and output in one sequence, rotary positions everywhere."""

    d_model: int
    d_ff: int
    heads: int
    encoder_layers: int
    decoder_layers: int

    @property
    def encoder_decoder(self) -> bool:
        return self.encoder_layers > 0


@dataclass(frozen=True)
class TrainSpec:
    steps: int
    batch_size: int
    lr: float
    warmup_frac: float = 0.05
    final_lr_frac: float = 0.05
    weight_decay: float = 0.01
    # Curriculum: the share of the steps on 1-item examples, then on 1..3 items; then 1..max.
    one_item_frac: float = 0.15
    few_items_frac: float = 0.3
    max_items: int = 6
    # LayerSkip: (decoder layers, loss weight) of each early exit trained beside the full model.
    exits: tuple[tuple[int, float], ...] = ((1, 0.5), (2, 0.5))
    eval_every: int = 500
    # The exits' losses count from this share of the steps on: first the whole target learns to
    # read its input, unhindered, then its first layers learn to agree with it.
    exit_start_frac: float = 0.0


@dataclass(frozen=True)
class QualityGate:
    """What a pair must reach on the demo prompts, run as the job runs them, to be kept."""

    min_exact: float = 0.8  # share of the target alone's outputs equal to the reference
    min_chrf: float = 90.0
    min_acceptance: float = 0.75  # greedy, model draft
    min_speedup: float = 1.5  # model draft over the target alone, side by side


_LATER_OPTIONS = {"labels": False, "digits": "single", "compose_digits": False, "distinct_kinds": False,
                  "ordered_kinds": False, "init_from": None}


@dataclass(frozen=True)
class Recipe:
    name: str
    vocab_size: int
    target: ModelSpec
    draft_layers: int  # the draft: the target's encoder (if any) and its first decoder layers
    train: TrainSpec
    gate: QualityGate
    kinds: tuple[str, ...] = data.KINDS
    max_number: int = 9999
    prompts: int = 40
    prompt_items: tuple[int, int] = (4, 6)  # items per demo prompt: long outputs, decoding dominates
    max_new_tokens: int = 160
    num_speculative_tokens: int = 4
    # Each item starts with its letter, "(a) ", in prompt and reference: a key the decoder's
    # cross-attention can find by content, so it knows which item it is reading.
    labels: bool = False
    digits: str = "single"  # the tokenizer's (`train_tokenizer`)
    # With digit groups: each group's embedding starts as a sum of one random vector per (place,
    # digit) ("739" = hundreds 7 + tens 3 + units 9), so that groups sharing a digit in a place
    # share a part from the first step (`compose_digit_embeddings`); it is trained freely after.
    compose_digits: bool = False
    # At most one item of each kind per prompt: the decoder finds the item it writes by what it is
    # (the number after "$", after "at", ...), not by counting items.
    distinct_kinds: bool = False
    # And the items always in the order of `kinds` (quantity, amount, date, time): the decoder
    # writes them in the order they come, finding each by its kind.
    ordered_kinds: bool = False
    # The name of the recipe whose pair (`--init_from DIR`, DIR.rejected too) this one starts from:
    # its target's weights and tokenizer; this recipe's steps continue its training.
    init_from: str | None = None
    seed: int = 1234

    def hash(self) -> str:
        recipe = dataclasses.asdict(self)
        for key, default in _LATER_OPTIONS.items():  # options added later count only when set
            if recipe.get(key) == default:
                del recipe[key]
        if recipe["train"].get("exit_start_frac") == 0.0:
            del recipe["train"]["exit_start_frac"]
        payload = {"version": RECIPE_VERSION, "recipe": recipe}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


FULL = Recipe(
    name="full",
    vocab_size=640,
    target=ModelSpec(d_model=256, d_ff=512, heads=4, encoder_layers=4, decoder_layers=6),
    draft_layers=1,
    train=TrainSpec(steps=3500, batch_size=32, lr=5e-4, max_items=5, eval_every=250),
    gate=QualityGate(),
    prompt_items=(3, 5),
)

# A narrowed task: amounts of money left out, numbers below 1000, up to 4
# items per prompt.
NARROW = dataclasses.replace(
    FULL, name="narrow", kinds=("quantity", "date", "time"), max_number=999, prompt_items=(3, 4),
    train=dataclasses.replace(FULL.train, max_items=4))

# CI-sized: trains in seconds; its gate is only "the code runs", so tests can also make it fail.
TINY = Recipe(
    name="tiny",
    vocab_size=320,
    target=ModelSpec(d_model=32, d_ff=64, heads=2, encoder_layers=1, decoder_layers=2),
    draft_layers=1,
    train=TrainSpec(steps=6, batch_size=8, lr=3e-3, eval_every=3, exits=((1, 0.5),)),
    gate=QualityGate(min_exact=0.0, min_chrf=0.0, min_acceptance=0.0, min_speedup=0.0),
    prompts=4,
    prompt_items=(1, 2),
    max_new_tokens=12,
)

# Items labelled "(a) ", "(b) ", ...; the exits' losses from 40% of the steps on.
LABELLED = dataclasses.replace(
    FULL, name="labelled", labels=True, prompt_items=(3, 4),
    train=dataclasses.replace(FULL.train, steps=3000, max_items=4, exit_start_frac=0.4))

# LABELLED with each group of up to three digits one token: a number is read as a few tokens, each
# of which the model maps to its words, instead of digits whose place it must work out.
GROUPS = dataclasses.replace(
    LABELLED, name="groups", digits="groups", vocab_size=2200,
    train=dataclasses.replace(LABELLED.train, steps=2500))

# GROUPS with each digit group's embedding composed from its digits' places at the start.
COMPOSED = dataclasses.replace(GROUPS, name="composed", compose_digits=True)

# COMPOSED narrowed: 2 or 3 items per demo prompt, up to 3 in training.
COMPOSED3 = dataclasses.replace(COMPOSED, name="composed3", prompt_items=(2, 3),
                                train=dataclasses.replace(COMPOSED.train, max_items=3))

# Second stage on COMPOSED3's pair: 3 or 4 items per prompt, each of another kind, 1000 steps at 3e-4.
DISTINCT = dataclasses.replace(
    COMPOSED3, name="distinct", init_from="composed3", distinct_kinds=True, prompt_items=(3, 4),
    train=dataclasses.replace(COMPOSED3.train, steps=1000, lr=3e-4, max_items=4, one_item_frac=0.0,
                              few_items_frac=0.2, exit_start_frac=0.0))

# DISTINCT with the items always in the kinds' order (quantity, amount, date, time).
ORDERED = dataclasses.replace(DISTINCT, name="ordered", ordered_kinds=True)

# Third stage on ORDERED's pair: the task narrowed to 1 to 3 items per prompt (each of another kind,
# in the kinds' order). Measured before it: ORDERED's target wrote 97% of 1-item prompts right, 58% of
# 2-item ones, 17% of 3-item ones (a leading digit such as the "9" of "9480" read from another item).
FEW = dataclasses.replace(
    ORDERED, name="few", init_from="ordered", prompt_items=(1, 3),
    train=dataclasses.replace(ORDERED.train, steps=2400, max_items=3, few_items_frac=0.0))

# FEW with 1 or 2 items per prompt.
PAIRS = dataclasses.replace(FEW, name="pairs", prompt_items=(1, 2),
                            train=dataclasses.replace(FEW.train, max_items=2))

# The task narrowed to its end: one item per prompt, unlabelled ("translate English to German: at
# 15:11"). ORDERED's target already wrote 97% of 1-item prompts right (with their label); this stage
# drops the label.
SINGLE = dataclasses.replace(
    ORDERED, name="single", init_from="ordered", labels=False, prompt_items=(1, 1),
    num_speculative_tokens=8,  # all drafts accepted; 1.46x at 4, 1.61x at 6, 1.71x at 8 (encoder not yet shared)
    train=dataclasses.replace(ORDERED.train, steps=800, max_items=1, few_items_frac=0.0, eval_every=200))

# A decoder-only target (Llama-style, 8 layers, rotary positions) in one stage from scratch: prompt
# and output in one sequence, so the output finds the item it writes by position as well as by
# content (T5's cross-attention has content only, and a lone digit looks the same in every item).
# A scratch prototype of it wrote 75% of 3-item prompts right after 500 steps, where the T5 pairs
# wrote 17% after 3,500.
DECODER = dataclasses.replace(
    COMPOSED, name="decoder", distinct_kinds=True, ordered_kinds=True, prompt_items=(2, 4),
    num_speculative_tokens=8,  # acceptance 0.98-0.99: 2.13x at 4, 2.44x at 6, 2.77x at 8 (one thread)
    target=ModelSpec(d_model=256, d_ff=512, heads=4, encoder_layers=0, decoder_layers=8),
    train=dataclasses.replace(COMPOSED.train, steps=3000, max_items=4, one_item_frac=0.1, exits=((1, 0.5),)))

# TINY with a decoder-only target.
TINY_DECODER = dataclasses.replace(TINY, name="tiny-decoder",
                                   target=ModelSpec(d_model=32, d_ff=64, heads=2, encoder_layers=0, decoder_layers=2))

RECIPES = {r.name: r for r in (FULL, NARROW, LABELLED, GROUPS, COMPOSED, COMPOSED3, DISTINCT, ORDERED, FEW, PAIRS,
                               SINGLE, DECODER, TINY, TINY_DECODER)}
COMMITTED = DECODER  # the recipe of the committed pair
