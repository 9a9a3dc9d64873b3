"""Quality of generations, one implementation for the demo and the report.

ROUGE comes from Google's `rouge-score` package (the reference implementation behind most
published summarization numbers), BLEU and chrF for translation from `sacrebleu` (the
standard, reproducible implementation), never from hand-written scoring. Degeneracy is ours, two
signs of a model stuck in a loop: the share of an output's word 3-grams that repeat an earlier
one (a line printed again and again scores near 1, ordinary prose near 0), and the share of its
characters inside a piece of up to 64 characters repeated four or more times in a row (`ctctctct`,
`self.self.self.`, which no word split sees; a longer piece with word breaks in it repeats word
3-grams, which the first share counts; one without, 65 characters or more of a single word again
and again, is seen by neither). The bound keeps the search linear in an output's length:
unbounded, it tried every piece length at every position, 0.7 s for a 4,000-character output and
10 s for 16,000.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ROUGE_KINDS = ("rouge1", "rouge2", "rougeL")
METRICS = ("rouge", "bleu", "chrf")  # summarization, translation, translation
DEGENERATE_AT = 0.5  # an output whose repeated 3-gram or looping-character share reaches this is degenerate
_WORDS = re.compile(r"\w+|[^\w\s]")
_LOOP = re.compile(r"(.{2,64}?)\1{3,}", re.DOTALL)  # a piece of 2 to 64 characters, then 3+ copies of it


def repeated_ngram_share(text: str, n: int = 3) -> float:
    """1 - distinct n-grams / n-grams, over words and punctuation marks (0 for texts under n words)."""
    words = _WORDS.findall(text)
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def looping_share(text: str) -> float:
    """Share of characters inside runs of one piece (2 to 64 characters) repeated 4+ times in a row."""
    return sum(m.end() - m.start() for m in _LOOP.finditer(text)) / len(text) if text else 0.0


def is_degenerate(text: str) -> bool:
    """Empty, or mostly repeating itself."""
    return (not text.strip() or repeated_ngram_share(text) >= DEGENERATE_AT
            or looping_share(text) >= DEGENERATE_AT)


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1/2/L F1 (Porter stemming, as in the usual summarization setups)."""
    from rouge_score import rouge_scorer

    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        return dict.fromkeys(ROUGE_KINDS, float("nan"))
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KINDS), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_KINDS, 0.0)
    for pred, ref in zip(predictions, references, strict=True):
        for kind, score in scorer.score(ref or "", pred or "").items():
            totals[kind] += score.fmeasure
    return {kind: total / len(predictions) for kind, total in totals.items()}


def rouge_unread_share(references) -> float:
    """The share of a text column's letters and digits ROUGE never sees: rouge-score's tokenizer (that of published
    ROUGE figures) keeps a-z and 0-9 only, so Cyrillic, Greek or CJK text scores 0 whatever the output. Counted in
    Arrow (a large run's references are not copied into Python strings a second time)."""
    import pyarrow.compute as pc

    lower = pc.utf8_lower(references)
    letters, read = (pc.sum(pc.count_substring_regex(lower, pattern)).as_py() or 0
                     for pattern in (r"[\pL\pN]", "[a-z0-9]"))
    return 1 - read / letters if letters else 0.0


def _sacrebleu_args(predictions: Sequence[str], references: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    return [p or "" for p in predictions], [[r or "" for r in references]]


def bleu(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (0-100), sacrebleu's defaults (13a tokenization, one reference per item)."""
    import sacrebleu

    if not predictions:
        return float("nan")
    return sacrebleu.corpus_bleu(*_sacrebleu_args(predictions, references)).score


def chrf(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF (0-100), sacrebleu's defaults (character 6-grams, beta 2)."""
    import sacrebleu

    if not predictions:
        return float("nan")
    return sacrebleu.corpus_chrf(*_sacrebleu_args(predictions, references)).score


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Share of predictions equal to their reference, character for character (0 for none)."""
    return sum(p == r for p, r in zip(predictions, references, strict=True)) / max(len(predictions), 1)


def score_generations(predictions: Sequence[str], references: Sequence[str | None] | None = None,
                      metric: str = "rouge") -> dict[str, float]:
    """`metric` against references (when given; a None reference leaves its output out of the metric, which
    would otherwise score it as "" or skip it, by metric) and how many outputs are degenerate (all of them)."""
    out: dict[str, float] = {}
    if references is not None:
        scored = [(p, r) for p, r in zip(predictions, references, strict=True) if r is not None]
        preds, refs = [p for p, _ in scored], [r for _, r in scored]
        if metric == "rouge":
            out.update(rouge(preds, refs))
        elif metric in ("bleu", "chrf"):
            out[metric] = (bleu if metric == "bleu" else chrf)(preds, refs)
        else:
            raise ValueError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})")
    n = len(predictions)
    # A model that ignores its input writes one generic text for every prompt: no single output
    # is degenerate, but the set is.
    out["distinct_share"] = len(set(predictions)) / n if n else float("nan")
    out["degenerate_share"] = sum(map(is_degenerate, predictions)) / n if n else float("nan")
    out["repeated_3gram_share"] = sum(map(repeated_ngram_share, predictions)) / n if n else float("nan")
    return out
