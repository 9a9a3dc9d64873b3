"""A draft of the target's tokenizer with fewer positions than the target (learned position
tables, which fail past their end): it drafts while a row fits them, then the target goes on
alone, at batch 1 and batched, eagerly and over static caches; an encoder-decoder draft's own
encoder reads a longer prompt cut to its positions; no row verifies drafts past the target's own positions.
Output exact throughout."""

import pytest
import torch

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.drafters import ModelDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.processing import SamplingSettings
from tests.family_models import family_model
from tests.test_batch_families import hf_greedy
from tests.tiny_models import perturbed_copy

SHORT = 16  # the draft's positions; the target's are 96
NEW = 20
LENGTHS = (4, 9, 14, 21, 6)  # prompts that end before, across and past the draft's positions


@pytest.fixture(scope="module", params=["opt", "bart"])
def case(request):
    family = request.param
    target = family_model(family, seed=1, max_position_embeddings=96)
    draft = family_model(family, seed=1, max_position_embeddings=SHORT)
    near = perturbed_copy(target, 0.1, seed=2).state_dict()  # a draft that agrees in part
    draft.load_state_dict({k: v for k, v in near.items() if "embed_positions" not in k}, strict=False)
    draft.generation_config = target.generation_config
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 100, (n,), generator=gen).tolist() + [2] for n in LENGTHS]
    return target, draft, prompts, [hf_greedy(target, p, NEW) for p in prompts]


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_greedy_rows_past_the_drafts_positions_equal_the_target_alone(case, graphs):
    target, draft, prompts, want = case
    chain = graphs == "on"  # (static caches: a round's draft steps chained too)
    one = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=graphs, chain=chain), num_speculative_tokens=3,
                               max_new_tokens=NEW, cuda_graphs=graphs)
    outs = [one.generate(p) for p in prompts]
    assert [o.tokens for o in outs] == want
    drafted = [o.stats.draft_tokens for o in outs]
    assert max(drafted) > 0
    if not target.config.is_encoder_decoder:  # a prompt past the positions is never drafted
        assert [d == 0 for d in drafted] == [n + 1 >= SHORT for n in LENGTHS]
        assert [not any(o.stats.gammas) for o in outs] == [n + 1 >= SHORT for n in LENGTHS]  # (none asked for)
    batched = BatchSpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=graphs, chain=chain), batch_size=3,
                                        num_speculative_tokens=3, max_new_tokens=NEW, cuda_graphs=graphs)
    rows = batched.generate_many([(p, 0) for p in prompts])
    assert [o.tokens for o in rows] == want
    assert [o.stats.gammas for o in rows] == [o.stats.gammas for o in outs]  # the drafts each round asked for


def test_a_seeds_sample_is_the_same_batched(case):
    """Where drafting stops depends on a row's length alone: a seed's sample at batch 1 and in a
    batch agree (fixed gamma), rows past the draft's positions included."""
    target, draft, prompts, _ = case
    sampling = SamplingSettings(temperature=1.0)
    one = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=3, max_new_tokens=NEW,
                               sampling=sampling)
    batched = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=3,
                                        max_new_tokens=NEW, sampling=sampling)
    alone = [one.generate(p, seed=s).tokens for s, p in enumerate(prompts)]
    assert [o.tokens for o in batched.generate_many([(p, s) for s, p in enumerate(prompts)])] == alone


@pytest.mark.parametrize("family", ["opt", "gpt_bigcode"])
def test_rows_ending_on_the_targets_last_position_draft_nothing_past_it(family):
    """A budget past a learned-position target's table (the engines' API; the pipeline fails such a prompt before any
    work) and a draft of more positions: a row that ends on the table's last position verifies no draft past it
    (an index error before) and equals `generate()`, at batch 1 and batched."""
    n, new = 32, 24
    target = family_model(family, seed=1, max_position_embeddings=n)
    draft = family_model(family, seed=1, max_position_embeddings=96)
    near = perturbed_copy(target, 0.05, seed=2).state_dict()
    draft.load_state_dict({k: v for k, v in near.items() if "embed_positions" not in k and "wpe" not in k},
                          strict=False)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 100, (k,), generator=gen).tolist() for k in (25, 6)]
    target.generation_config.eos_token_id = hf_greedy(target, prompts[0], n - 25)[-1]  # ends on the last position
    draft.generation_config = target.generation_config
    want = [hf_greedy(target, p, new) for p in prompts]
    assert len(want[0]) == n - 25 < new
    one = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=4, max_new_tokens=new)
    outs = [one.generate(p) for p in prompts]
    assert [o.tokens for o in outs] == want
    assert outs[0].stats.gammas[-3:] == [3, 2, 1]  # (its last rounds: as many drafts as positions are left)
    batched = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=4,
                                        max_new_tokens=new)
    assert [o.tokens for o in batched.generate_many([(p, 0) for p in prompts])] == want


def test_an_encoder_decoder_drafts_encoder_reads_a_long_prompt_cut_with_its_end_token_kept():
    """Cut to the draft encoder's positions, a prompt keeps its last token (the end token the encoder was trained to
    read last), not its first `limit` tokens."""
    drafter = ModelDrafter(family_model("bart", seed=1, max_position_embeddings=SHORT))
    limit = drafter.encoder_limit
    assert limit == SHORT
    long = list(range(3, 3 + 2 * limit)) + [2]
    assert drafter.encoder_prompt(long) == long[: limit - 1] + [2]
    assert drafter.encoder_prompt(long[:limit]) == long[:limit]  # (a prompt that fits is read whole)
