"""The demo's pair: the training that made the committed weights (`assets`) from a recipe (`recipes`).

The weights are committed (``pipeline/demo/pair/``, fp16, loaded as fp32) rather than trained
on first use, so every machine runs the same pair and the first run takes a minute or two. Its
recipe reruns here on any machine, in one stage from scratch (docs/demo.md):

    python -m pipeline.demo.models --retrain --workdir W --threads 2   # the committed pair (`decoder`)
    python -m pipeline.demo.models                                     # check it, print its measurements

It trains by steps, never by seconds, logging progress, an ETA and, every few hundred steps, the
exact-match share on held-out prompts. A pair that misses its gate is not put in place: it is
kept aside as ``DIR.rejected`` and the command exits 2 with one line naming the missed bar.
"""

from __future__ import annotations

import dataclasses
import functools
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
from pathlib import Path

# Busy-waiting OpenMP threads collapse throughput when other processes share the cores; passive
# waiting costs little at these sizes. Effective only before torch is imported.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from pipeline.demo import data  # noqa: E402
from pipeline.demo.assets import (  # noqa: E402
    ASSETS,
    MANIFEST,
    PROMPTS,
    DemoSetupError,
    read_manifest,
    sha256_of,
    verify_assets,
)
from pipeline.demo.recipes import COMMITTED, FULL, RECIPES, ModelSpec, QualityGate, Recipe, TrainSpec  # noqa: E402
from pipeline.flags import ArgumentParser, positive_int  # noqa: E402
from pipeline.threads import keeps_torch_threads

logger = logging.getLogger(__name__)

SPECIALS = ("<pad>", "</s>", "<unk>")  # T5's ids: pad 0 (also the decoder start), eos 1, unk 2
# German number words cut into their parts before BPE, so that one token stands for one digit's
# word and BPE never learns "dreitausendvier" as a unit. Longest alternatives first.
# A leading space stays with its word; "und" only inside a word ("Pfund", " und " stay whole).
NUMBER_PARTS = (" ?(?:tausend|hundert|zwanzig|dreißig|vierzig|fünfzig|sechzig|siebzig|achtzig|neunzig|"
                 "zwölf|zehn|elf|eins|ein|zwei|drei|vier|fünf|sechs|sech|sieben|sieb|acht|neun|null)|und(?=[a-zß])")


DIGIT_GROUPS = r"\d{1,3}(?=(?:\d{3})*(?!\d))"


class DemoQualityError(DemoSetupError):
    """A pair missed the quality gate."""


# --------------------------------------------------------------------------------------------
# Recipe: prompts, tokenizer, models, training
# --------------------------------------------------------------------------------------------


def demo_prompts(recipe: Recipe, seed_offset: int = 7) -> list[dict]:
    """The demo prompts: from a seed no training batch uses (training seeds are per step)."""
    rng = random.Random(f"{recipe.seed}-prompts-{seed_offset}")
    rows = []
    for i in range(recipe.prompts):
        n = rng.randint(*recipe.prompt_items)
        prompt, reference = data.example(rng, n, recipe.kinds, recipe.max_number, recipe.labels,
                                         recipe.distinct_kinds, recipe.ordered_kinds)
        rows.append({"id": f"de-{i:03d}", "prompt": prompt, "reference": reference, "items": n})
    return rows


def train_tokenizer(texts: list[str], vocab_size: int, digits: str = "single"):
    """Byte-level BPE, number words cut into their parts; appends </s> as T5's does. `digits`:
    "single", one digit per token; "groups", digit runs cut into groups of three from the right
    ("7739" -> "7", "739"), as Llama 3's and GPT-4's tokenizers cut them, each group one token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    numbers = (pre_tokenizers.Digits(individual_digits=True) if digits == "single"
               else pre_tokenizers.Split(Regex(DIGIT_GROUPS), behavior="isolated"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(NUMBER_PARTS), behavior="isolated"),
        numbers,
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), max_token_length=10,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=1_000_000)


def model_class(spec: ModelSpec) -> type:
    from transformers import LlamaForCausalLM, T5ForConditionalGeneration

    return T5ForConditionalGeneration if spec.encoder_decoder else LlamaForCausalLM


def make_model(spec: ModelSpec, vocab_size: int, seed: int):
    from transformers import LlamaConfig, T5Config

    torch.manual_seed(seed)
    if spec.encoder_decoder:
        config = T5Config(vocab_size=vocab_size, d_model=spec.d_model, d_kv=spec.d_model // spec.heads,
                          d_ff=spec.d_ff, num_layers=spec.encoder_layers, num_decoder_layers=spec.decoder_layers,
                          num_heads=spec.heads, dropout_rate=0.0, pad_token_id=0, eos_token_id=1,
                          decoder_start_token_id=0, tie_word_embeddings=True)
    else:  # the prompt ends with </s> (the tokenizer appends it), so the output follows a separator
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=spec.d_model, intermediate_size=spec.d_ff,
                             num_hidden_layers=spec.decoder_layers, num_attention_heads=spec.heads,
                             num_key_value_heads=spec.heads, max_position_embeddings=1024, pad_token_id=0,
                             bos_token_id=1, eos_token_id=1, tie_word_embeddings=True)
    model = model_class(spec)(config)
    if spec.encoder_decoder:
        model.generation_config.decoder_start_token_id = 0
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model


def spec_of(c) -> ModelSpec:
    """The shape a model's config describes."""
    if c.is_encoder_decoder:
        return ModelSpec(c.d_model, c.d_ff, c.num_heads, c.num_layers, c.num_decoder_layers)
    return ModelSpec(c.hidden_size, c.intermediate_size, c.num_attention_heads, 0, c.num_hidden_layers)


def compose_digit_embeddings(model, tokenizer, seed: int) -> int:
    """Set the embedding of every all-digit token to the sum of a random vector per (place from the
    right, digit), scaled to the embedding's own spread; returns how many tokens it set."""
    gen = torch.Generator().manual_seed(seed)
    emb = model.get_input_embeddings().weight
    parts = torch.randn(3, 10, emb.shape[1], generator=gen) * emb.detach().std()
    n = 0
    with torch.no_grad():
        for token, i in tokenizer.get_vocab().items():
            if re.fullmatch("[0-9]{1,3}", token):
                places = [parts[p, int(d)] for p, d in enumerate(reversed(token))]
                emb[i] = sum(places) / len(places) ** 0.5
                n += 1
    return n


def cut_draft(target, layers: int):
    """The draft: the target's embedding, encoder (if any), first `layers` decoder layers and final norms."""
    spec = dataclasses.replace(spec_of(target.config), decoder_layers=layers)
    draft = make_model(spec, target.config.vocab_size, 0)
    own = draft.state_dict()
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if k in own})
    return draft.eval()


def early_exit_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """What a decoder cut after the layer that gave `hidden` predicts: the final norm, (T5) the tied
    head's d_model**-0.5 scaling, the head. A draft made of those first layers computes the same."""
    if not model.config.is_encoder_decoder:
        return model.lm_head(model.model.norm(hidden))
    hidden = model.decoder.final_layer_norm(hidden)
    if model.config.tie_word_embeddings:
        hidden = hidden * model.model_dim**-0.5
    return model.lm_head(hidden)


def _fmt_s(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def items_at(spec: TrainSpec, step: int, rng: random.Random) -> int:
    progress = (step - 1) / spec.steps
    if progress < spec.one_item_frac:
        return 1
    if progress < spec.one_item_frac + spec.few_items_frac:
        return rng.randint(1, min(3, spec.max_items))
    return rng.randint(1, spec.max_items)


@functools.cache
def evaluation_prompts(recipe: Recipe) -> frozenset[str]:
    """The demo prompts and the held-out probe's: never trained on (one-item prompts repeat: a
    time is one of 1,440)."""
    return frozenset(r["prompt"] for offset in (7, 99) for r in demo_prompts(recipe, offset))


def batch_at(recipe: Recipe, tokenizer, step: int):
    """Step `step`'s batch: fresh examples from a seed of its own (so a resumed run sees the same),
    none of them an evaluation prompt."""
    rng = random.Random(f"{recipe.seed}-train-{step}")
    held_out = evaluation_prompts(recipe)
    pairs = []
    while len(pairs) < recipe.train.batch_size:
        pair = data.example(rng, items_at(recipe.train, step, rng), recipe.kinds, recipe.max_number, recipe.labels,
                            recipe.distinct_kinds, recipe.ordered_kinds)
        if pair[0] not in held_out:
            pairs.append(pair)
    return teacher_forced(recipe.target.encoder_decoder, tokenizer([p for p, _ in pairs])["input_ids"],
                          tokenizer([r for _, r in pairs])["input_ids"])


def teacher_forced(encoder_decoder: bool, prompts: list[list[int]], outputs: list[list[int]]):
    """(input ids, attention mask, labels) to train or score `outputs` after `prompts`: an
    encoder-decoder reads the prompt and is labelled with the output; a decoder-only model reads
    both in one sequence, labelled on the output only."""
    if encoder_decoder:
        rows, labels = prompts, outputs
    else:
        rows = [p + o for p, o in zip(prompts, outputs, strict=True)]
        labels = [[-100] * len(p) + o for p, o in zip(prompts, outputs, strict=True)]
    x = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    y = torch.full((len(labels), max(map(len, labels))), -100, dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, labels, strict=True)):
        x[i, :len(r)] = torch.tensor(r)
        y[i, :len(lab)] = torch.tensor(lab)
    mask = (torch.arange(x.shape[1])[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
    return x, mask, y


def aligned(model, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and the labels they predict, position by position (a causal LM's position i predicts
    token i + 1; a T5 decoder's, token i)."""
    return (logits, y) if model.config.is_encoder_decoder else (logits[:, :-1], y[:, 1:])


def decoder_states(model, out) -> tuple[torch.Tensor, ...]:
    return out.decoder_hidden_states if model.config.is_encoder_decoder else out.hidden_states


def lr_at(spec: TrainSpec, step: int) -> float:
    progress = (step - 1) / spec.steps
    if progress < spec.warmup_frac:
        return spec.lr * max(progress / spec.warmup_frac, 0.02)
    t = (progress - spec.warmup_frac) / (1 - spec.warmup_frac)
    return spec.lr * (spec.final_lr_frac + (1 - spec.final_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.inference_mode()
def greedy(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """The model's greedy outputs, each ending with its end token unless cut by the budget: the
    target alone through the project's batch engine (`generate()` cannot run a decoder deeper than
    its encoder in transformers 5)."""
    from specdec_core.batch_engine import BatchSpeculativeGenerator
    from specdec_core.drafters import NoDrafter

    engine = BatchSpeculativeGenerator(model, NoDrafter(), batch_size=len(prompts), max_new_tokens=max_new_tokens)
    return [g.tokens for g in engine.generate_many([(ids, 0) for ids in tokenizer(prompts)["input_ids"]])]


@torch.inference_mode()
def exit_agreement(model, tokenizer, prompts: list[str], outputs: list[list[int]], layers: int) -> float:
    """Teacher-forced share of the model's own greedy tokens that an early exit predicts too."""
    x, mask, y = teacher_forced(model.config.is_encoder_decoder, tokenizer(prompts)["input_ids"], outputs)
    out = model(input_ids=x, attention_mask=mask, labels=y, output_hidden_states=True)
    full, labels = aligned(model, out.logits.argmax(-1), y)
    early, _ = aligned(model, early_exit_logits(model, decoder_states(model, out)[layers]).argmax(-1), y)
    mask = labels != -100
    return float(((full == early) & mask).sum() / mask.sum())


def probe(model, tokenizer, recipe: Recipe, rows: list[dict]) -> dict:
    from pipeline.quality import chrf, exact_match

    model.eval()
    outs = greedy(model, tokenizer, [r["prompt"] for r in rows], recipe.max_new_tokens)
    texts = tokenizer.batch_decode(outs, skip_special_tokens=True)
    refs = [r["reference"] for r in rows]
    res = {"exact": exact_match(texts, refs), "chrf": chrf(texts, refs)}
    for k, _ in recipe.train.exits:
        res[f"agree{k}"] = exit_agreement(model, tokenizer, [r["prompt"] for r in rows], outs, k)
    model.train()
    return res


def train(recipe: Recipe, tokenizer, workdir: Path | None = None, init: Path | None = None) -> tuple[object, dict]:
    """Train the target by steps (never by seconds), with its early exits; checkpoints in `workdir`
    (a rerun with the same workdir resumes where the last checkpoint was). `init`: a pair directory
    whose target's weights it starts from."""
    spec = recipe.train
    model = make_model(recipe.target, len(tokenizer), recipe.seed)
    if init is not None:
        model.load_state_dict(type(model).from_pretrained(init / "target", dtype=torch.float32).state_dict())
        logger.info("target: starts from %s", init / "target")
    elif recipe.compose_digits:
        logger.info("digit-group embeddings composed from places: %d tokens",
                    compose_digit_embeddings(model, tokenizer, recipe.seed + 3))
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=spec.lr)
    first, history = 1, []
    ckpt = workdir / "checkpoint.pt" if workdir else None
    if workdir:
        workdir.mkdir(parents=True, exist_ok=True)
    if ckpt is not None and ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        if state["recipe_hash"] == recipe.hash():
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            first, history = state["step"] + 1, state["history"]
            logger.info("resumed from %s at step %d", ckpt, state["step"])
    heldout = demo_prompts(recipe, seed_offset=99)  # not the demo's own prompts
    model.train()
    start = last = time.monotonic()
    ema = None
    logger.info("target: %.2fM parameters, %d steps of %d examples, exits %s", sum(p.numel() for p in
                model.parameters()) / 1e6, spec.steps, spec.batch_size, spec.exits)
    for step in range(first, spec.steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(spec, step)
        x, mask, y = batch_at(recipe, tokenizer, step)
        exits = spec.exits if step > spec.exit_start_frac * spec.steps else ()
        out = model(input_ids=x, attention_mask=mask, labels=y, output_hidden_states=bool(exits))
        loss = out.loss
        for k, weight in exits:
            logits, labels = aligned(model, early_exit_logits(model, decoder_states(model, out)[k]), y)
            loss = loss + weight * torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                                     ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = out.loss.item() if ema is None else 0.95 * ema + 0.05 * out.loss.item()
        now = time.monotonic()
        if now - last >= 30 or step == spec.steps:
            last = now
            done = step - first + 1
            logger.info("target: step %d/%d (%d%%) loss %.3f elapsed %s ETA %s", step, spec.steps,
                        100 * step // spec.steps, ema, _fmt_s(now - start),
                        _fmt_s((now - start) / done * (spec.steps - step)))
        if step % spec.eval_every == 0 or step == spec.steps:
            res = {"step": step, "loss": round(ema, 4), **probe(model, tokenizer, recipe, heldout)}
            history.append(res)
            logger.info("held-out prompts at step %d: %s", step, json.dumps(res))
            if ckpt is not None:
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                            "history": history, "recipe_hash": recipe.hash()}, tmp)
                os.replace(tmp, ckpt)
    model.eval()
    return model, {"steps": spec.steps, "final_loss": round(ema, 4) if ema is not None else None,
                   "train_seconds": round(time.monotonic() - start, 1), "history": history}


# --------------------------------------------------------------------------------------------
# The gate: the saved pair, run by the engine as the job runs it
# --------------------------------------------------------------------------------------------


def evaluate_pair(target_dir: Path, draft_dir: Path, rows: list[dict], max_new_tokens: int,
                  gamma: int = 4) -> dict:
    """Greedy decoding of the demo prompts by the engine: the target alone and with the model draft,
    interleaved prompt by prompt so that both see the same machine load."""
    from pipeline.quality import chrf, exact_match
    from specdec_core.text import GeneratorSpec, TextGenerator

    def load(drafter):
        return TextGenerator.load(GeneratorSpec(target_model=str(target_dir), draft_model=str(draft_dir),
                                                drafter=drafter, max_new_tokens=max_new_tokens,
                                                num_speculative_tokens=gamma))

    alone, spec = load("none"), load("model")
    alone.generate(rows[0]["prompt"])  # warm-up, not timed
    spec.generate(rows[0]["prompt"])
    a, s = [], []
    for r in rows:
        a.append(alone.generate(r["prompt"]))
        s.append(spec.generate(r["prompt"]))
    texts = [o["generation"] for o in a]
    refs = [r["reference"] for r in rows]
    drafted = sum(o["draft_tokens"] for o in s)
    draft_step = sum(o["draft_s"] for o in s) / max(sum(o["draft_steps"] for o in s), 1)
    target_step = sum(o["verify_s"] for o in a) / max(sum(o["verify_steps"] for o in a), 1)
    return {"exact": exact_match(texts, refs),
            "chrf": chrf(texts, refs),
            "acceptance": sum(o["accepted_tokens"] for o in s) / drafted if drafted else 0.0,
            "tokens_per_target_step": sum(o["new_tokens"] for o in s) / sum(o["verify_steps"] for o in s),
            "c": draft_step / target_step if target_step else None,
            "speedup": sum(o["latency_s"] for o in a) / sum(o["latency_s"] for o in s),
            "identical": sum(x["generation"] == y["generation"] for x, y in zip(a, s, strict=True)) / len(rows),
            "new_tokens": sum(o["new_tokens"] for o in a),
            "num_speculative_tokens": gamma,
            "threads": torch.get_num_threads()}


def check_gate(gate: QualityGate, measured: dict) -> None:
    problems = []
    if measured["exact"] < gate.min_exact:
        problems.append(f"exact matches {measured['exact']:.0%} < {gate.min_exact:.0%}")
    if measured["chrf"] < gate.min_chrf:
        problems.append(f"chrF {measured['chrf']:.1f} < {gate.min_chrf:g}")
    if measured["acceptance"] < gate.min_acceptance:
        problems.append(f"acceptance {measured['acceptance']:.3f} < {gate.min_acceptance}")
    if measured["speedup"] < gate.min_speedup:
        problems.append(f"speed-up {measured['speedup']:.2f}x < {gate.min_speedup}x")
    if measured["identical"] < 1.0:
        problems.append(f"outputs identical to the target alone's {measured['identical']:.0%} < 100%")
    if problems:
        raise DemoQualityError("the demo pair misses its quality gate: " + "; ".join(problems))


def _save(model, tokenizer, dest: Path) -> None:
    model.to(torch.float16).save_pretrained(dest)  # fp16 halves the repository's weight; loads as fp32 exactly
    tokenizer.save_pretrained(dest)
    model.to(torch.float32)


def write_pair(out: Path, target, tokenizer, rows: list[dict], recipe: Recipe, info: dict) -> dict:
    """Save, measure against the gate, and put in place with its manifest only if it passes; a pair
    that misses is kept aside as `out`.rejected (its manifest names the missed bars) for a look."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        target.to(torch.float16).to(torch.float32)  # the draft is cut from the target as shipped
        draft = cut_draft(target, recipe.draft_layers)
        _save(target, tokenizer, tmp / "target")
        _save(draft, tokenizer, tmp / "draft")
        pq.write_table(pa.Table.from_pylist(rows), tmp / PROMPTS)
        measured = evaluate_pair(tmp / "target", tmp / "draft", rows, recipe.max_new_tokens,
                                 recipe.num_speculative_tokens)
        logger.info("measured on the demo prompts: %s", json.dumps(measured))
        missed = None
        try:
            check_gate(recipe.gate, measured)
        except DemoQualityError as e:  # keep the rejected pair for a look, never in place of the good one
            missed = str(e)
        files = {p.relative_to(tmp).as_posix(): sha256_of(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {"recipe": recipe.name, "recipe_hash": recipe.hash(), "files": files, **info,
                    "quality": measured, "gate": dataclasses.asdict(recipe.gate),
                    "gate_passed": missed is None, "gate_missed": missed,
                    "built_with": {"python": sys.version.split()[0], "torch": torch.__version__,
                                   "cpu": torch.backends.cpu.get_cpu_capability()}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        dest = out
        if missed:
            dest = out.with_name(f"{out.name}.rejected")
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            os.replace(dest, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, dest)
        dest.chmod(0o755)  # mkdtemp made it private
        if missed:
            raise DemoQualityError(f"{missed} (the rejected pair is in {dest})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def retrain(out: Path = ASSETS, recipe: Recipe = FULL, workdir: Path | None = None,
            target_from: Path | None = None, init_from: Path | None = None) -> dict:
    """Build the pair and prompts into `out` (put in place only if the gate passes).
    `target_from`: a pair directory (a rejected one too) whose target is kept; only the draft is cut
    again (with this recipe's `draft_layers`) and measured."""
    from transformers import AutoTokenizer

    t0 = time.monotonic()
    rows = demo_prompts(recipe)
    if target_from is not None:
        tokenizer = AutoTokenizer.from_pretrained(Path(target_from) / "target")
        target = model_class(recipe.target).from_pretrained(Path(target_from) / "target", dtype=torch.float32).eval()
        info = {"target": {**read_manifest(Path(target_from)).get("target", {}), "reused_from": Path(target_from).name}}
    else:
        if recipe.init_from is not None:
            if init_from is None or read_manifest(init_from).get("recipe") != recipe.init_from:
                raise DemoSetupError(f"recipe {recipe.name} starts from a pair of recipe {recipe.init_from}: "
                                     f"give its directory with --init_from (DIR.rejected too)")
            tokenizer = AutoTokenizer.from_pretrained(init_from / "target")
        else:
            corpus = data.tokenizer_corpus(20_000, recipe.seed + 1, recipe.kinds, recipe.labels,
                                           exclude=evaluation_prompts(recipe))
            tokenizer = train_tokenizer(corpus, recipe.vocab_size, recipe.digits)
        bad = [r["prompt"] for r in rows if tokenizer.decode(tokenizer(r["prompt"])["input_ids"],
                                                              skip_special_tokens=True) != r["prompt"]]
        if bad:
            raise DemoSetupError(f"the tokenizer does not round-trip {bad[0]!r}")
        target, train_info = train(recipe, tokenizer, workdir, init_from if recipe.init_from else None)
        info = {"target": train_info}
        if recipe.init_from:
            info["target"]["init_from"] = {"recipe": recipe.init_from, **read_manifest(init_from).get("target", {})}
    info["target"]["params"] = sum(p.numel() for p in target.parameters())
    info["draft"] = {"decoder_layers": recipe.draft_layers, "note": "the target's encoder and first decoder layers"
                     if recipe.target.encoder_decoder else "the target's first decoder layers"}
    manifest = write_pair(Path(out), target, tokenizer, rows, recipe, info)
    logger.info("demo pair written to %s in %s", out, _fmt_s(time.monotonic() - t0))
    return manifest


@keeps_torch_threads
def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m pipeline.demo.models",
                        description="Check the committed demo pair, or rebuild it with its recipe.")
    ap.add_argument("--retrain", action="store_true", help="rebuild the pair and its prompts (about an hour)")
    ap.add_argument("--out", default=str(ASSETS), help=f"where the pair goes (default {ASSETS})")
    ap.add_argument("--recipe", choices=sorted(RECIPES), default=COMMITTED.name,
                    help="tiny: the CI-sized recipe (seconds; no real quality)")
    ap.add_argument("--workdir", default=None, help="checkpoints (a rerun with the same one resumes)")
    ap.add_argument("--target_from", default=None, metavar="DIR",
                    help="keep the target of a pair this recipe made (DIR.rejected too); cut and measure the draft")
    ap.add_argument("--init_from", default=None, metavar="DIR",
                    help="the pair (DIR.rejected too) a recipe with a first stage starts from")
    ap.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.retrain:
            if args.target_from and not (Path(args.target_from) / "target" / "config.json").is_file():
                raise DemoSetupError(f"--target_from {args.target_from}: no target/config.json there")
            manifest = retrain(Path(args.out), RECIPES[args.recipe], Path(args.workdir) if args.workdir else None,
                               Path(args.target_from) if args.target_from else None,
                               Path(args.init_from) if args.init_from else None)
        else:
            manifest = verify_assets(Path(args.out))
    except DemoSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: manifest[k] for k in ("recipe", "quality", "gate_passed")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
