"""The one quality scorer shared by the demo and the report."""

import pytest

from pipeline.quality import is_degenerate, looping_share, repeated_ngram_share, rouge, score_generations


@pytest.mark.parametrize("text", [
    "", "   ", "self.self.self.self.self.self.", "ctctctctctctctctctct",
    "Return the value. Return the value. Return the value. Return the value.",
    "        self._\n        self._\n        self._\n        self._\n",
])
def test_loops_and_empty_outputs_are_degenerate(text):
    assert is_degenerate(text)


@pytest.mark.parametrize("text", [
    "Return the absolute value of x.",
    "Return a list of (name, value) pairs for each option in the given section.",
    "Create a new ZipFile; mode is 'r', 'w', 'x' or 'a'.",
])
def test_ordinary_summaries_are_not(text):
    assert not is_degenerate(text)
    assert repeated_ngram_share(text) < 0.2 and looping_share(text) < 0.2


def test_loops_of_long_pieces_are_degenerate_through_their_repeated_words():
    """looping_share looks for pieces of up to 64 characters (the bound keeps it linear in the output's
    length); a sentence looping beyond that repeats its word 3-grams."""
    short = "0123456789abcdefghijklmnopqrstuvwxyz-ABCDEFGHIJKLMNOPQRSTUVWXYZ.:"[:64]
    assert looping_share(short * 4) == 1.0
    sentence = "The committee agreed to fund the new library on Tuesday after a long debate. "
    assert len(sentence) > 64
    assert looping_share(sentence * 4) == 0.0
    assert repeated_ngram_share(sentence * 4) >= 0.5 and is_degenerate(sentence * 4)


def test_rouge_is_the_reference_package_mean_f1():
    from rouge_score import rouge_scorer

    preds = ["Return the absolute value of x.", "Open a file."]
    refs = ["Return the absolute value of the argument.", "Close the file and flush it."]
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    expected = sum(scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(preds, refs, strict=True)) / 2
    assert rouge(preds, refs)["rougeL"] == pytest.approx(expected)
    assert rouge(refs, refs)["rouge1"] == pytest.approx(1.0)
    assert rouge(["zebra quantum"], ["Return the value"])["rougeL"] == 0.0


def test_score_generations_counts_degenerate_outputs():
    q = score_generations(["Return x.", "ctctctctctctctct", "", "Open the file."],
                          ["Return x.", "Return y.", "Close.", "Open a file."])
    assert q["degenerate_share"] == 0.5
    assert q["distinct_share"] == 1.0
    assert score_generations(["Return x.", "Return x.", "Return x.", "Open."])["distinct_share"] == 0.5
    assert 0 < q["rougeL"] < 1
    with pytest.raises(ValueError):
        rouge(["a"], [])


def test_bleu_and_chrf_are_sacrebleu_corpus_scores():
    import sacrebleu

    from pipeline.quality import bleu, chrf

    preds = ["The cat sat on the mat.", "There is a house by the river."]
    refs = ["The cat is sitting on the mat.", "A house stands by the river."]
    assert bleu(preds, refs) == pytest.approx(sacrebleu.corpus_bleu(preds, [refs]).score)
    assert chrf(preds, refs) == pytest.approx(sacrebleu.corpus_chrf(preds, [refs]).score)
    assert bleu(refs, refs) == pytest.approx(100.0) and chrf(refs, refs) == pytest.approx(100.0)
    scores = score_generations(preds, refs, metric="chrf")
    assert set(scores) == {"chrf", "degenerate_share", "distinct_share", "repeated_3gram_share"}
    with pytest.raises(ValueError, match="unknown metric"):
        score_generations(preds, refs, metric="meteor")
    with pytest.raises(ValueError):
        bleu(["a"], [])


def test_exact_match_is_the_share_of_equal_strings():
    from pipeline.quality import exact_match

    assert exact_match(["a b", "c", "d"], ["a b", "c ", "d"]) == pytest.approx(2 / 3)
    assert exact_match([], []) == 0.0
