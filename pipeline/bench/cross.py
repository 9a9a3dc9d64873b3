"""`python -m pipeline.bench.cross [--quick]`: a draft with ANOTHER tokenizer, against HF.

The pair: two small causal LMs trained here on the same text (Python standard-library
sources) with two different byte-level BPE tokenizers (4096 and 1024 tokens), so the draft
really agrees with the target part of the time. Training takes a few minutes of CPU once; the
pair is cached (``--cache_dir``, keyed by the recipe) and reused.

Timed side by side, in one run, on the same prompts (held-out stdlib functions), greedy, at the
same gamma: the target alone (our loop, and plain HF `generate`), our cross-tokenizer drafter,
and Hugging Face's universal assisted generation (`generate(assistant_model=, tokenizer=,
assistant_tokenizer=)`, constant schedule, confidence early stop off). Methods run in turn per
prompt, so a load change on a shared machine hits them alike. With `--batch_sizes`, the target
alone and ours (gamma g, and the adaptive policy up to g) also decode all prompts B rows at a
time (continuous batching: one target pass verifies every row, each row drafting in its own
session), in turn per B (ABC CBA, `--repeats` times). Reported: tokens/s, speed-up over the
target alone at batch 1, tokens per target pass, acceptance in TARGET tokens (ours), and whether
each output equals the target-alone greedy output token for token.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import shlex
import sys
import time
from pathlib import Path

# Busy-waiting OpenMP threads collapse throughput when other processes share the cores (as in
# the demo recipe, pipeline/demo/models.py). Effective only before torch is imported.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from pipeline.bench.measure import ForwardMeter  # noqa: E402
from pipeline.byte_bpe import train_byte_level_bpe  # noqa: E402
from pipeline.demo import data as demo_data  # noqa: E402
from pipeline.flags import ArgumentParser, positive_int  # noqa: E402
from pipeline.threads import keeps_torch_threads

_LOG = logging.getLogger("pipeline.bench.cross")
RECIPE = {"target": {"n_embd": 256, "n_layer": 4, "n_head": 4}, "draft": {"n_embd": 128, "n_layer": 2, "n_head": 4},
          "vocab": {"target": 4096, "draft": 1024}, "ctx": 64, "batch": 8, "steps": {"target": 1000, "draft": 1500},
          "lr": 3e-3, "files": 80, "seed": 0, "version": 1}
HELD_OUT = ("textwrap.py", "shlex.py", "fractions.py", "bisect.py", "heapq.py", "string.py", "glob.py", "fnmatch.py")


def corpus(n_files: int) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts) from the standard library's Python sources."""
    root = demo_data.stdlib_root()
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size < 200_000)
    train = [p.read_text(errors="replace") for p in files if p.name not in HELD_OUT][:n_files]
    held = [(root / n).read_text(errors="replace") for n in HELD_OUT if (root / n).exists()]
    return train, held


def train_lm(tok, texts: list[str], shape: dict, steps: int, seed: int):
    """A GPT-2 LM trained on random windows of the token stream (by steps, never by seconds)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    rng = random.Random(seed)
    stream = torch.tensor([i for t in texts for i in tok(t)["input_ids"]])
    ctx, batch = RECIPE["ctx"], RECIPE["batch"]
    cfg = GPT2Config(vocab_size=len(tok), n_positions=1024, bos_token_id=tok.bos_token_id,
                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **shape)
    model = GPT2LMHeadModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=RECIPE["lr"], weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, RECIPE["lr"], total_steps=steps, pct_start=0.1)
    t0 = time.perf_counter()
    for step in range(steps):
        starts = [rng.randrange(len(stream) - ctx - 1) for _ in range(batch)]
        x = torch.stack([stream[s : s + ctx] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            _LOG.info("  step %d/%d loss %.3f (%.0f s)", step + 1, steps, loss.item(), time.perf_counter() - t0)
    return model.eval()


def load_pair(cache_dir: Path):
    """The cached (target, target tokenizer, draft, draft tokenizer), trained first if absent."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths: dict[str, Path] = {}
    shared = {k: v for k, v in RECIPE.items() if k not in ("target", "draft", "vocab", "steps")}
    texts: list[str] | None = None
    for role in ("target", "draft"):
        recipe = {**shared, "model": RECIPE[role], "vocab": RECIPE["vocab"][role], "steps": RECIPE["steps"][role]}
        key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
        path = cache_dir / f"{role}-{key}"
        if not (path / "config.json").exists():
            texts = texts or corpus(RECIPE["files"])[0]
            _LOG.info("training the %s once into %s (%d files, %.1f MB of text)", role, path, len(texts),
                      sum(map(len, texts)) / 1e6)
            tok = train_byte_level_bpe(texts, RECIPE["vocab"][role])
            _LOG.info("%s: %d-token tokenizer, model %s", role, len(tok), RECIPE[role])
            model = train_lm(tok, texts, RECIPE[role], RECIPE["steps"][role], RECIPE["seed"])
            model.save_pretrained(path)
            tok.save_pretrained(path)
        paths[role] = path
    out = []
    for role in ("target", "draft"):
        out += [AutoModelForCausalLM.from_pretrained(paths[role], dtype=torch.float32).eval(),
                AutoTokenizer.from_pretrained(paths[role])]
    return out


def prompts(tok, n: int, max_tokens: int = 96) -> list[list[int]]:
    """Held-out function openings: `def` line plus a few lines, as target token ids."""
    _, held = corpus(0)
    out = []
    for text in held:
        for i, line in enumerate(text.splitlines(keepends=True)):
            if line.lstrip().startswith("def ") and len(out) < n:
                head = "".join(text.splitlines(keepends=True)[i : i + 3])
                out.append(tok(head)["input_ids"][:max_tokens])
        if len(out) >= n:
            break
    return out


def tally(r: dict, seconds: float, passes: int, outs: list, references: list[list[int]]) -> None:
    """Add one timed call to a method's row: its outputs (HF's token lists, or our generations with their stats),
    each compared with its prompt's target-alone tokens."""
    r["s"] += seconds
    r["passes"] += passes
    for out, reference in zip(outs, references, strict=True):
        tokens = out if isinstance(out, list) else out.tokens
        if not isinstance(out, list):
            r["drafted"] += out.stats.draft_tokens
            r["accepted"] += out.stats.accepted_tokens
        r["tokens"] += len(tokens)
        r["same"] += tokens == reference
        r["compared"] += 1


def run(args: argparse.Namespace) -> dict:
    from specdec_core.batch_engine import BatchSpeculativeGenerator
    from specdec_core.cross_tokenizer import CrossTokenizerDrafter
    from specdec_core.drafters import NoDrafter
    from specdec_core.engine import SpeculativeGenerator
    from specdec_core.gamma import AdaptiveGamma

    target, ttok, draft, dtok = load_pair(Path(args.cache_dir))
    assert ttok.get_vocab() != dtok.get_vocab()
    g, n_new = args.gamma, args.max_new_tokens
    draft.generation_config.num_assistant_tokens = g
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    counter = ForwardMeter(target)  # the target's passes: a verification, or one plain step
    alone = SpeculativeGenerator(target, NoDrafter(), max_new_tokens=n_new)
    ours = SpeculativeGenerator(target, CrossTokenizerDrafter(draft, ttok, dtok), num_speculative_tokens=g,
                                max_new_tokens=n_new)

    def hf(ids: list[int], assisted: bool) -> list[int]:
        x = torch.tensor([ids])
        kw = dict(assistant_model=draft, tokenizer=ttok, assistant_tokenizer=dtok) if assisted else {}
        with torch.inference_mode():
            out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n_new,
                                  pad_token_id=ttok.pad_token_id, **kw)
        return out[0, len(ids):].tolist()

    methods = {
        "target alone (ours)": lambda ids: alone.generate(ids),
        "target alone (HF generate)": lambda ids: hf(ids, False),
        f"ours: cross-tokenizer g={g}": lambda ids: ours.generate(ids),
        f"HF universal assisted g={g}": lambda ids: hf(ids, True),
    }
    batched = {}  # each B: the target alone and ours (gamma g, and adaptive up to g), B rows at a time
    for b in args.batch_sizes:
        batched[f"target alone (ours), B={b}"] = BatchSpeculativeGenerator(target, NoDrafter(), batch_size=b,
                                                                          max_new_tokens=n_new)
        for name, policy in ((f"g={g}", None), (f"adaptive g<={g}", AdaptiveGamma(max_gamma=g))):
            batched[f"ours: cross-tokenizer {name}, B={b}"] = BatchSpeculativeGenerator(
                target, CrossTokenizerDrafter(draft, ttok, dtok), batch_size=b, num_speculative_tokens=g,
                max_new_tokens=n_new, gamma_policy=policy)
    rows = {m: {"s": 0.0, "tokens": 0, "passes": 0, "drafted": 0, "accepted": 0, "same": 0, "compared": 0, "errors": []}
            for m in [*methods, *batched]}
    ps = prompts(ttok, args.prompts)
    references = []
    for ids in ps[:1]:  # warm-up, untimed
        for fn in methods.values():
            fn(ids)
    for ids in ps:
        reference = None
        for m, fn in methods.items():
            r = rows[m]
            before = len(counter.calls)
            t0 = time.perf_counter()
            try:
                out = fn(ids)
            except Exception as e:  # reported, not hidden
                r["errors"].append(f"{type(e).__name__}: {e}"[:200])
                continue
            seconds = time.perf_counter() - t0
            reference = reference if reference is not None else (out if isinstance(out, list) else out.tokens)
            tally(r, seconds, len(counter.calls) - before, [out], [reference])
        references.append(reference)
    for engine in batched.values():
        engine.generate_many([(ids, 0) for ids in ps[:engine.batch_size]])  # warm-up, untimed
    names = list(batched)
    for group in zip(names[::3], names[1::3], names[2::3], strict=True):  # each B's three in turn: (ABC CBA) x repeats
        for m in (*group, *group[::-1]) * args.repeats:
            before, t0 = len(counter.calls), time.perf_counter()
            outs = batched[m].generate_many([(ids, 0) for ids in ps])
            tally(rows[m], time.perf_counter() - t0, len(counter.calls) - before, outs, references)
    base = rows["target alone (ours)"]
    base_tps = base["tokens"] / base["s"] if base["s"] else 0.0
    for r in rows.values():
        r["tps"] = r["tokens"] / r["s"] if r["s"] else 0.0
        r["speedup"] = r["tps"] / base_tps if base_tps else 0.0
        r["per_pass"] = r["tokens"] / r["passes"] if r["passes"] else 0.0
        r["acceptance"] = r["accepted"] / r["drafted"] if r["drafted"] else None
    return {"rows": rows, "prompts": len(ps), "gamma": g, "max_new_tokens": n_new,
            "threads": torch.get_num_threads(), "vocab": (len(ttok), len(dtok)),
            "params": (sum(p.numel() for p in target.parameters()), sum(p.numel() for p in draft.parameters()))}


def table(result: dict) -> str:
    lines = ["| method | tokens/s | speed-up vs target alone (ours) | tokens per target pass | acceptance "
             "(target tokens) | identical to target alone |", "|---|---|---|---|---|---|"]
    for m, r in result["rows"].items():
        acc = f"{r['acceptance']:.3f}" if r["acceptance"] is not None else "-"
        same = f"{r['same']}/{r['compared']}"
        if r["errors"]:
            same += f" ({len(r['errors'])} errors: {r['errors'][0]})"
        lines.append(f"| {m} | {r['tps']:.1f} | {r['speedup']:.2f}x | {r['per_pass']:.2f} | {acc} | {same} |")
    return "\n".join(lines)


@keeps_torch_threads
def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m pipeline.bench.cross", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="4 prompts x 48 tokens instead of 12 x 96")
    p.add_argument("--gamma", type=positive_int, default=4)
    p.add_argument("--prompts", type=positive_int, default=None)
    p.add_argument("--max_new_tokens", type=positive_int, default=None)
    p.add_argument("--batch_sizes", default="", help="comma-separated B > 1: also decode the prompts B rows at a time")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="batched: each B's engines run ABC CBA this many times (a noisy machine needs several)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--cache_dir", default=str(Path.home() / ".cache" / "specdec-beam" / "bench_cross"))
    p.add_argument("--json", default=None, help="also write the raw results here")
    args = p.parse_args(argv)
    args.prompts = args.prompts or (4 if args.quick else 12)
    args.max_new_tokens = args.max_new_tokens or (48 if args.quick else 96)
    sizes = [b.strip() for b in args.batch_sizes.split(",") if b.strip()]
    if not all(b.isdecimal() and int(b) > 1 for b in sizes):
        p.error(f"--batch_sizes {args.batch_sizes!r}: expected comma-separated integers > 1 (batch 1 always runs)")
    args.batch_sizes = [int(b) for b in sizes]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    cmd = "python -m pipeline.bench.cross " + shlex.join(sys.argv[1:] if argv is None else argv)
    print(f"command: {cmd.strip()}")
    print(f"target {result['params'][0] / 1e6:.1f}M params / {result['vocab'][0]} tokens, draft "
          f"{result['params'][1] / 1e6:.2f}M params / {result['vocab'][1]} tokens; {result['prompts']} prompts x "
          f"{result['max_new_tokens']} new tokens, greedy, gamma {result['gamma']}, {result['threads']} threads")
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
