"""A draft whose encoder is the target's (cut from the target's first layers): one encoder pass per
prompt serves both models, and every output stays the target's."""

import copy

import pytest
import torch

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.loading import share_encoder
from specdec_core.text import load_model_drafter
from tests.tiny_models import make_model, perturbed_copy

PROMPTS = ["The quick brown", "Summarize: the committee met on Tuesday", "Hi"]


def same_encoder_draft(target):
    """The target with other decoder weights (its embeddings, which the encoder uses too, kept)."""
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in draft.get_decoder().named_parameters():
            if "embed" not in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.std().clamp_min(1e-3))
    return draft


def count_encoder_calls(model) -> list[int]:
    calls = [0]
    model.get_encoder().register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("kind", ["t5", "bart"])
def test_only_an_encoder_with_the_targets_weights_is_shared(kind, tokenizer):
    target = make_model(kind, tokenizer, seed=1)
    draft = same_encoder_draft(target)
    assert draft.get_encoder() is not target.get_encoder()
    assert share_encoder(target, draft) and draft.get_encoder() is target.get_encoder()
    other = perturbed_copy(target, 0.05, seed=2)  # every weight differs
    assert not share_encoder(target, other) and other.get_encoder() is not target.get_encoder()
    half = same_encoder_draft(target).to(torch.bfloat16)  # same values, another dtype: not the same encoder
    assert not share_encoder(target, half)
    llama = make_model("llama", tokenizer, seed=1)
    assert not share_encoder(llama, copy.deepcopy(llama))


@pytest.mark.parametrize("kind", ["t5", "bart"])
def test_a_shared_encoder_runs_once_per_prompt_and_changes_no_output(kind, tokenizer):
    target = make_model(kind, tokenizer, seed=1)
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    alone = [SpeculativeGenerator(target, NoDrafter(), max_new_tokens=20).generate(ids).tokens for ids in prompts]
    drafts = {batch_size: same_encoder_draft(target) for batch_size in (1, 2)}  # before the target's hook
    calls = count_encoder_calls(target)

    def run(draft, batch_size, *counters):
        if batch_size == 1:
            gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=4, max_new_tokens=20)
        else:
            gen = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=batch_size,
                                            num_speculative_tokens=4, max_new_tokens=20)
        for counter in (calls, *counters):  # from here: the engines' self-checks at load encode too
            counter[0] = 0
        if batch_size == 1:
            outs = [gen.generate(ids).tokens for ids in prompts]
        else:
            outs = [g.tokens for g in gen.generate_many([(ids, 0) for ids in prompts])]
        return outs, calls[0]

    for batch_size, own in drafts.items():
        draft_calls = count_encoder_calls(own)
        outs, target_calls = run(own, batch_size, draft_calls)
        assert outs == alone and draft_calls[0] == target_calls  # unshared: the draft encodes every prompt too
        assert share_encoder(target, own)
        outs, shared_calls = run(own, batch_size)
        assert outs == alone and shared_calls == target_calls  # shared: the target's passes serve both
        if batch_size == 1:
            assert shared_calls == len(prompts)


def test_the_job_loads_a_draft_cut_from_the_target_with_the_targets_encoder(tokenizer, tmp_path):
    target = make_model("t5", tokenizer, seed=1)
    same_encoder_draft(target).save_pretrained(tmp_path / "draft")
    tokenizer.save_pretrained(tmp_path / "draft")
    drafter = load_model_drafter(str(tmp_path / "draft"), target, tokenizer, device=torch.device("cpu"),
                                 dtype=torch.float32)
    assert isinstance(drafter, ModelDrafter) and drafter.model.get_encoder() is target.get_encoder()
    perturbed_copy(target, 0.05, seed=2).save_pretrained(tmp_path / "other")
    tokenizer.save_pretrained(tmp_path / "other")
    other = load_model_drafter(str(tmp_path / "other"), target, tokenizer, device=torch.device("cpu"),
                               dtype=torch.float32)
    assert other.model.get_encoder() is not target.get_encoder()
