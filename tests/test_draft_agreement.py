"""benchmarks/draft_agreement.py: its replay of the engine's greedy rounds."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "draft_agreement", Path(__file__).parents[1] / "benchmarks" / "draft_agreement.py")
draft_agreement = importlib.util.module_from_spec(spec)
spec.loader.exec_module(draft_agreement)


@pytest.mark.parametrize(("agree", "expected"), [
    ([True] * 10, (8, 8)),  # two rounds accept all 4 drafts, each plus the target's token
    ([False] * 3, (12, 0)),  # every round rejects its first draft and emits the target's token
    ([True, False, True, True, True, True, True], (8, 5)),  # 1 of 4, then 4 of 4 (the 7th is the end)
])
def test_replay_counts_the_engines_rounds(agree, expected):
    assert draft_agreement.replay(agree, gamma=4, max_new_tokens=64) == expected


def test_replay_stops_drafting_at_a_proposed_end():
    # The end (5th token) is the 3rd draft of round 2: 3 drafted there, not 4.
    assert draft_agreement.replay([True, False, True, True, True], gamma=4, max_new_tokens=64) == (7, 4)
    # A wrong end proposed as a round's first draft: 1 drafted; then the right end: 1.
    assert draft_agreement.replay([False, True], gamma=4, max_new_tokens=64, draft_ends=[True, False]) == (2, 1)


def test_replay_never_drafts_past_the_budget():
    # 6 tokens of budget: a round of 4 (all accepted, plus the target's token), then one of 0.
    assert draft_agreement.replay([True] * 6, gamma=4, max_new_tokens=6) == (4, 4)


@pytest.mark.slow
def test_replay_matches_the_engine_on_the_committed_pair():
    # The first 8 of the 40 prompts (about 340 positions, 90 rounds): the check is per round, not per prompt.
    measured = draft_agreement.measure(draft_agreement.demo_assets.ASSETS, gamma=4, max_new_tokens=64, first=8)
    # A draft that, after a wrong token, proposes an end on its own path stops there; the replay
    # sees only teacher-forced logits and counts those rounds' later drafts, so it can be a little low.
    assert 0 <= measured["acceptance_engine"] - measured["acceptance_replayed"] <= 0.005
    assert 0 < measured["agreement"] <= 1
