"""Prompt lookup's matching rule (its exactness is covered by the engine tests)."""

import numpy as np

from specdec_core.drafters import NgramDrafter, lookup


def test_lookup_takes_the_longest_ngram_then_its_earliest_occurrence():
    hay = np.array([1, 2, 3, 9, 9, 5, 1, 2, 3, 8, 4, 2, 3])
    # Longest first: "2 3" is the suffix's longest repeat (at 1 and 7); the earliest one wins.
    assert lookup(hay, range(3, 0, -1), 3) == [9, 9, 5]
    hay = np.array([1, 2, 3, 9, 9, 5, 1, 2, 3, 8, 1, 2, 3])
    # "1 2 3" occurs at 0 and 6 before the suffix: the earliest one's continuation is proposed.
    assert lookup(hay, range(3, 0, -1), 3) == [9, 9, 5]
    assert lookup(hay, range(3, 0, -1), 5) == [9, 9, 5, 1, 2]
    # The continuation is cut at the end of the text.
    assert lookup(np.array([4, 5, 4]), range(1, 0, -1), 5) == [5, 4]
    assert lookup(np.array([1, 2, 3]), range(2, 0, -1), 4) == []


def test_ngram_session_searches_an_encoder_prompt_and_respects_min_size():
    pick = None  # prompt lookup never calls the picker
    seq2seq = NgramDrafter(3, 2).start([5, 6, 7, 8], [0, 5, 6], pick)  # decoder starts from token 0
    assert seq2seq.propose([0, 5, 6], 2).tokens == [7, 8]
    assert seq2seq.propose([0, 9, 6], 2).tokens == []  # a 1-gram match is below min size 2
    causal = NgramDrafter(3, 1).start([5, 6, 7], [5, 6, 7], pick)
    assert causal.propose([5, 6, 7, 6], 3).tokens == [7, 6]
