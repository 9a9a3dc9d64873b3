"""How closely a demo draft follows its target, token by token, and what that makes acceptance.

Greedy speculative decoding keeps the drafted tokens up to the first one whose argmax differs
from the target's, and the draft always continues from the target's own tokens. So the whole run
follows from one bit per position of the target's greedy output: does the draft's argmax equal
the target's token there? This measures those bits teacher-forced, replays the engine's rounds
on them (`replay`), and runs the engine itself beside, so the replay is checked against the acceptance the demo prints.

If each position agrees with probability p, independently, a round of gamma drafts accepts
p + p^2 + ... + p^gamma of them: acceptance 0.75 at gamma 4 (the demo gate) needs p of about 0.89.
The agreement is split by what the target wrote at the position (its first token, a part of a German
number word, another token, the end), beside the target's own confidence (mean top-1
probability; share of positions whose top two are within 0.1).

    python benchmarks/draft_agreement.py                 # the committed demo pair
    python benchmarks/draft_agreement.py --pair DIR      # a pair `--retrain` wrote (DIR.rejected too)
    python benchmarks/draft_agreement.py --rows 12       # the first 12 prompts only
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
from transformers import AutoTokenizer

from pipeline.demo import assets as demo_assets
from pipeline.demo import models as demo_models
from pipeline.demo import recipes as demo_recipes
from specdec_core.loading import load_model


def replay(agree: list[bool], gamma: int, max_new_tokens: int, ended: bool = True,
           draft_ends: list[bool] | None = None) -> tuple[int, int]:
    """(drafted, accepted) of the engine's greedy rounds (`SpeculativeGenerator.generate`) over a
    target output whose positions the draft gets right where `agree` is true; the last position is
    the target's end (`ended`) or its budget. A draft stops at an end token it proposes: the
    target's end, or a wrong end where `draft_ends` says so (its later wrong tokens are unknown
    here and counted as drafted)."""
    pos = drafted = accepted = 0
    while pos < len(agree):
        k = min(gamma, max_new_tokens - pos - 1)
        n = 0
        while n < k and pos + n < len(agree) and agree[pos + n]:  # an accepted end ends the item
            n += 1
        if ended and pos + n == len(agree):
            drafted += n
        elif n < k and draft_ends and draft_ends[pos + n]:
            drafted += n + 1
        else:
            drafted += k
        accepted += n
        pos += n + 1
    return drafted, accepted


def output_logits(model, x: torch.Tensor, mask: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Row 0's logits at the positions that predict its labelled (output) tokens."""
    logits, labels = demo_models.aligned(model, model(input_ids=x, attention_mask=mask, labels=y).logits, y)
    return logits[0][labels[0] != -100]


@torch.inference_mode()
def measure(pair: Path, gamma: int, max_new_tokens: int, first: int | None = None) -> dict:
    """first: the first this many demo prompts only (None: all)."""
    tok = AutoTokenizer.from_pretrained(pair / "target")
    target, draft = (load_model(str(pair / name), torch.device("cpu"), torch.float32) for name in ("target", "draft"))
    eos = target.generation_config.eos_token_id
    rows = demo_assets.demo_prompt_rows(pair)[:first]
    kinds = {k: [0, 0] for k in ("first", "number word", "other", "end")}
    top1, near_ties, drafted, accepted = [], [], 0, 0
    for row in rows:
        # The target's own greedy output (generate() cannot run a decoder deeper than its encoder).
        (ids,) = demo_models.greedy(target, tok, [row["prompt"]], max_new_tokens)
        forced = demo_models.teacher_forced(target.config.is_encoder_decoder, [tok(row["prompt"])["input_ids"]], [ids])
        probs, dlogits = output_logits(target, *forced).softmax(-1), output_logits(draft, *forced)
        agree, draft_ends = [], []
        for i, token in enumerate(ids):  # position i predicts output token i
            agree.append(int(dlogits[i].argmax(-1)) == token)
            draft_ends.append(int(dlogits[i].argmax(-1)) == eos)
            best = probs[i].topk(2).values
            top1.append(float(best[0]))
            near_ties.append(float(best[0] - best[1]) < 0.1)
            number = re.fullmatch(demo_models.NUMBER_PARTS, tok.decode([token]))
            kind = "first" if i == 0 else "end" if token == eos else "number word" if number else "other"
            kinds[kind][0] += agree[-1]
            kinds[kind][1] += 1
        d, a = replay(agree, gamma, max_new_tokens, ended=ids[-1] == eos, draft_ends=draft_ends)
        drafted, accepted = drafted + d, accepted + a
    engine = demo_models.evaluate_pair(pair / "target", pair / "draft", rows, max_new_tokens, gamma)
    positions = sum(n for _, n in kinds.values())
    return {
        "pair": str(pair),
        "positions": positions,
        "agreement": round(sum(a for a, _ in kinds.values()) / positions, 3),
        "agreement_by_kind": {k: {"positions": n, "agreement": round(a / n, 3) if n else None}
                              for k, (a, n) in kinds.items()},
        "target_mean_top1_prob": round(sum(top1) / len(top1), 3),
        "target_near_tie_share": round(sum(near_ties) / len(near_ties), 3),
        "acceptance_replayed": round(accepted / drafted, 3) if drafted else None,
        "acceptance_engine": round(engine["acceptance"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default=str(demo_assets.ASSETS))
    ap.add_argument("--gamma", type=int, default=4, help="drafts per round (the demo's --num_speculative_tokens)")
    ap.add_argument("--max_new_tokens", type=int, default=demo_recipes.FULL.max_new_tokens)
    ap.add_argument("--rows", type=int, default=None, help="the first this many demo prompts (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(json.dumps(measure(Path(args.pair), args.gamma, args.max_new_tokens, args.rows), indent=1))


if __name__ == "__main__":
    main()
