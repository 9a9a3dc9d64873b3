"""Decoder-only families beyond Llama and GPT-2, each with its own position scheme (RoPE variants,
learned positions with an offset, ALiBi built from the mask), MLP and norm layout: greedy output
equals `generate()` at batch 1 and batched, eagerly and over static caches (the passes CUDA graphs
replay on a GPU, here run eagerly), or static caches are refused with the reason, and
`--cuda_graphs auto` then runs the model eagerly."""

import pytest
import torch

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.drafters import ModelDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.processing import SamplingSettings
from specdec_core.static_decoder import graph_support
from tests.family_models import DECODER_FAMILIES, V, family_model
from tests.tiny_models import perturbed_copy

# Families whose passes static caches cannot take, and why (the rest must decode over them).
NO_STATIC = {"bloom": "takes no position_ids", "falcon-alibi": "ALiBi"}


def _pair_and_prompts(family: str):
    target = family_model(family, seed=1, window=None)
    gen = torch.Generator().manual_seed(0)
    return target, perturbed_copy(target, 0.1, seed=2), [torch.randint(3, V, (n,), generator=gen).tolist()
                                                         for n in (5, 9, 3, 12, 7)]


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_greedy_equals_generate_at_batch_one_and_batched(family):
    target, draft, prompts = _pair_and_prompts(family)
    with torch.inference_mode():
        refs = [target.generate(torch.tensor([p]), do_sample=False, max_new_tokens=16)[0, len(p):].tolist()
                for p in prompts]
    why = graph_support(target)
    assert (why is None) == (family not in NO_STATIC) and NO_STATIC.get(family, "") in (why or ""), why
    for mode in ("off", "on"):
        if mode == "on" and why:
            with pytest.raises(ValueError, match="cuda_graphs on"):
                SpeculativeGenerator(target, None, cuda_graphs=mode)
            continue
        drafter = ModelDrafter(draft, cuda_graphs=mode)
        single = SpeculativeGenerator(target, drafter, num_speculative_tokens=3, max_new_tokens=16, cuda_graphs=mode)
        assert (single.static is not None) == (mode == "on")
        outs = [single.generate(p) for p in prompts]
        assert [o.tokens for o in outs] == refs, (family, mode, "batch 1")
        assert sum(o.stats.accepted_tokens for o in outs) > 0  # the draft's tokens really went through verify
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=mode), batch_size=3,
                                           num_speculative_tokens=3, max_new_tokens=16, cuda_graphs=mode)
        assert (engine.slots[id(target)] is not None) == (mode == "on")
        assert [g.tokens for g in engine.generate_many([(p, 0) for p in prompts])] == refs, (family, mode, "batched")


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_sampled_rows_equal_the_batch_one_sample_of_their_seed(family):
    """Sampled: each batched row is the batch-1 sample of its seed (the batch-1 engine's own
    distribution is tested statistically elsewhere), eagerly and over static caches where taken."""
    target, draft, prompts = _pair_and_prompts(family)
    sampling = SamplingSettings(temperature=1.0, top_k=20)
    items = [(p, 50 + i) for i, p in enumerate(prompts)]
    for mode in ("off",) if family in NO_STATIC else ("off", "on"):
        single = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=mode), num_speculative_tokens=3,
                                      max_new_tokens=12, sampling=sampling, cuda_graphs=mode)
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=mode), batch_size=3,
                                           num_speculative_tokens=3, max_new_tokens=12, sampling=sampling,
                                           cuda_graphs=mode)
        alone = [single.generate(p, seed).tokens for p, seed in items]
        assert [g.tokens for g in engine.generate_many(items)] == alone, (family, mode)
        assert len({tuple(a) for a in alone}) > 1
