"""Sampled output follows the target's distribution exactly (chi-square on a 6-token vocabulary).

Each test draws 1500 seeded 3-token continuations, compares their empirical distribution with
the exact target distribution (enumerated from the target's processed probabilities), and checks
that the same samples REJECT the draft's distribution, so the test has the power to fail.
The samples are drawn 128 rows at a time by the batched engine, whose row of a seed is that seed's
batch-1 sample (checked here on the first 100 seeds, and for every family in
test_batch_families): on a 2-core CPU, Llama's 1,500 samples took about 29 s one call at a time
and 3.4 s 128 rows at a time, a pass of these tiny models costing about as much at 128 rows as at 1.
"""

import itertools
import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.drafters import Drafter, ModelDrafter, NgramDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.processing import LogitsTransform, SamplingSettings, build_processors
from specdec_core.rows import FinishCheck, Generation
from tests.tiny_models import perturbed_copy

# 1500 samples a test: the power checks below still reject the draft's distribution at p < 1e-300
# (p = 0.0 in double precision) for every case, as the batched tests' 1500 do.
V, N_NEW, SAMPLES, SAME = 6, 3, 1500, 100
PROMPT = [1, 2, 3, 1, 2]


def tiny(kind: str, seed: int, std: float):
    torch.manual_seed(seed)
    ids = dict(vocab_size=V, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    if kind == "llama":
        cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, initializer_range=std, **ids)
        return LlamaForCausalLM(cfg).eval()
    cfg = T5Config(d_model=32, d_ff=64, d_kv=16, num_layers=1, num_heads=2, decoder_start_token_id=0,
                   initializer_factor=std * 10, **ids)
    return T5ForConditionalGeneration(cfg).eval()


@torch.inference_mode()
def exact_distribution(model, sampling: SamplingSettings, prompt: list[int] = PROMPT) -> dict[tuple, float]:
    """P(continuation) for every continuation of N_NEW tokens of `prompt`, by full recomputation (each
    prefix's next-token distribution computed once)."""
    enc = model.config.is_encoder_decoder
    start = [0] if enc else prompt
    transform = LogitsTransform(build_processors(sampling, model.generation_config, len(start), N_NEW, "cpu"))
    next_token: dict[tuple, torch.Tensor] = {}
    for i in range(N_NEW):
        for head in itertools.product(range(V), repeat=i):
            seq = start + list(head)
            if enc:
                logits = model(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([seq])).logits
            else:
                logits = model(input_ids=torch.tensor([seq])).logits
            next_token[head] = transform(seq, logits[0, -1:].float()).softmax(-1)[0]
    return {cont: math.prod(float(next_token[cont[:i]][cont[i]]) for i in range(N_NEW))
            for cont in itertools.product(range(V), repeat=N_NEW)}


def engines(target, drafter: Callable[[], Drafter], **settings) -> tuple[SpeculativeGenerator,
                                                                        BatchSpeculativeGenerator]:
    """The batch-1 engine and a batched one of 128 rows, over the same pair and settings (a drafter each)."""
    return (SpeculativeGenerator(target, drafter(), **settings),
            BatchSpeculativeGenerator(target, drafter(), batch_size=128, **settings))


def draw(pair: tuple[SpeculativeGenerator, BatchSpeculativeGenerator],
         check: Callable[[], FinishCheck] | None = None) -> list[Generation]:
    """SAMPLES seeded continuations of PROMPT, drawn by the batched engine; the first SAME must be
    the batch-1 engine's samples of those seeds, token for token."""
    one, batched = pair
    checks = [check() for _ in range(SAMPLES)] if check else None
    outs = batched.generate_many([(list(PROMPT), seed) for seed in range(SAMPLES)], checks)
    alone = [one.generate(PROMPT, seed, check() if check else None).tokens for seed in range(SAME)]
    assert [o.tokens for o in outs[:SAME]] == alone, "a batched row is not its seed's batch-1 sample"
    return outs


def counted(outs: list[Generation]) -> dict[tuple, int]:
    return dict(Counter(tuple(o.tokens) for o in outs))


def rejected_some(outs: list[Generation]) -> bool:
    """Some drafted tokens were accepted and some rejected (so the residual path was sampled too)."""
    return 0 < sum(o.stats.accepted_tokens for o in outs) < sum(o.stats.draft_tokens for o in outs)


def chi2_pvalue(counts: dict[tuple, int], probs: dict[tuple, float]) -> float:
    """Chi-square goodness of fit, pooling cells with fewer than 5 expected samples."""
    n = sum(counts.values())
    obs, exp, small_obs, small_exp = [], [], 0, 0.0
    for cont, p in probs.items():
        if p * n >= 5:
            obs.append(counts.get(cont, 0))
            exp.append(p * n)
        else:
            small_obs += counts.get(cont, 0)
            small_exp += p * n
    if small_exp > 0:
        obs.append(small_obs)
        exp.append(small_exp)
    elif small_obs:
        return 0.0  # samples outside the target's support
    obs, exp = np.array(obs, float), np.array(exp, float)
    exp = exp * obs.sum() / exp.sum()  # guard float drift
    return chisquare(obs, exp).pvalue


CASES = [
    ("llama", "model", SamplingSettings(temperature=1.0)),
    ("llama", "model", SamplingSettings(temperature=0.7, top_k=3)),
    ("llama", "model", SamplingSettings(temperature=1.3, top_p=0.8)),
    ("llama", "ngram", SamplingSettings(temperature=1.0)),
    ("t5", "model", SamplingSettings(temperature=1.0)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "drafter", "sampling"), CASES)
def test_sampling_matches_target_distribution(kind, drafter, sampling):
    # T5's initialisation saturates fast: a smaller std keeps its distributions soft.
    target = tiny(kind, seed=0, std=0.8 if kind == "llama" else 0.1)
    draft = perturbed_copy(target, noise=0.8, seed=1)
    make = (lambda: ModelDrafter(draft)) if drafter == "model" else (lambda: NgramDrafter(max_ngram=2))
    outs = draw(engines(target, make, num_speculative_tokens=2, max_new_tokens=N_NEW, sampling=sampling))
    counts = counted(outs)
    p_target = chi2_pvalue(counts, exact_distribution(target, sampling))
    assert p_target > 1e-3, f"samples do not follow the target (p={p_target:.2e})"
    if drafter == "model":
        # Power: the same samples must be distinguishable from the draft's distribution.
        assert chi2_pvalue(counts, exact_distribution(draft, sampling)) < 1e-6
    assert rejected_some(outs)  # (otherwise the residual path went untested)


@pytest.mark.slow
def test_sampling_stays_exact_when_the_target_has_more_output_rows(monkeypatch):
    """One tokenizer, output layers of two sizes (rows padded to another multiple, as Qwen2.5-7B's
    152064 against 0.5B's 151936; the padded rows are no token, here suppressed by the target's
    generation config): the two distributions differ in width (which crashed), the draft's
    giving the target's extra rows probability 0. A draft with more rows than the target is
    refused (`loading.check_pair`)."""
    import tests.test_engine_sampling as here

    base = V
    monkeypatch.setattr(here, "V", base + 2)
    target = tiny("llama", seed=0, std=0.8)
    target.generation_config.suppress_tokens = [base, base + 1]
    monkeypatch.setattr(here, "V", base)
    draft = tiny("llama", seed=1, std=0.8)
    monkeypatch.setattr(here, "V", base + 2)  # every continuation of the target
    sampling = SamplingSettings(temperature=1.0)
    outs = draw(engines(target, lambda: ModelDrafter(draft), num_speculative_tokens=2, max_new_tokens=N_NEW,
                        sampling=sampling))
    assert chi2_pvalue(counted(outs), exact_distribution(target, sampling)) > 1e-3
    assert rejected_some(outs)  # residuals drawn


def test_the_warpers_are_generates_in_its_order():
    """Temperature, then top-k, then top-p, as `generate()` chains them: the order changes the distribution where
    both cut (top-k 2 then top-p 0.5 of [.4, .3, .2, .1] keeps one token; top-p first would keep two)."""
    from transformers import GenerationConfig

    target = tiny("llama", 0, 0.8)
    for temperature in (0.7, 1.0):
        ours = build_processors(SamplingSettings(temperature=temperature, top_k=2, top_p=0.5),
                                target.generation_config, len(PROMPT), N_NEW, "cpu")
        config = GenerationConfig(do_sample=True, temperature=temperature, top_k=2, top_p=0.5)
        hf = target._get_logits_processor(config, input_ids_seq_length=len(PROMPT), device="cpu")
        assert [type(p) for p in ours] == [type(p) for p in hf]
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    probs = LogitsTransform(ours)(PROMPT, logits).softmax(-1)
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_the_target_drafting_for_itself_has_every_sampled_draft_accepted():
    """Drafts sampled from q = p are kept with probability min(1, p/q) = 1: the check must use the distribution each
    draft was drawn from (one-hot q keeps a draft only with probability p(x)), at batch 1 and batched."""
    target = tiny("llama", 0, 0.8)
    settings = dict(num_speculative_tokens=3, max_new_tokens=12, sampling=SamplingSettings(temperature=1.0))
    one = SpeculativeGenerator(target, ModelDrafter(target), **settings)
    batched = BatchSpeculativeGenerator(target, ModelDrafter(target), batch_size=4, **settings)
    rows = [(PROMPT[: 2 + s % 4], s) for s in range(4)]
    for stats in ([one.generate(p, s).stats for p, s in rows], [o.stats for o in batched.generate_many(rows)]):
        assert [(s.acceptance_rate, s.rejections) for s in stats] == [(1.0, 0)] * len(rows)
        assert min(s.accepted_tokens for s in stats) > 0


def test_same_seed_same_sample_different_seed_differs():
    target, draft = tiny("llama", 0, 0.8), tiny("llama", 1, 0.8)
    gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=2, max_new_tokens=12,
                               sampling=SamplingSettings(temperature=1.0))
    runs = [gen.generate(PROMPT, seed).tokens for seed in (7, 7, 8, 9, 10)]
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs[1:]}) > 1


def test_a_temperature_near_zero_fails_its_row_with_a_reason_that_names_it():
    """--temperature 1e-39 passes as finite and >= 0, and every row's logits divided by it overflow
    float32 (HF's `generate` fails too): the reason named only a wider --dtype, the run's widest."""
    from specdec_core.acceptance import NonFiniteProbabilities

    target, draft = tiny("llama", 0, 0.8), tiny("llama", 1, 0.8)
    gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=2, max_new_tokens=4,
                               sampling=SamplingSettings(temperature=1e-39))
    with pytest.raises(NonFiniteProbabilities, match="a --temperature near 0 overflows any"):
        gen.generate(PROMPT, 0)


@pytest.mark.slow
def test_adaptive_gamma_keeps_sampling_exact():
    """Gamma chosen from past acceptances leaves the output distribution exactly the target's."""
    from specdec_core.gamma import AdaptiveGamma, Costs

    target = tiny("llama", seed=0, std=0.8)
    draft = perturbed_copy(target, noise=0.8, seed=1)
    sampling = SamplingSettings(temperature=1.0)
    costs = Costs(c=0.05, v={k: 1.0 for k in range(2, 8)})
    policy = AdaptiveGamma(costs, max_gamma=3, share_across_items=False, early_stop=True)
    outs = draw(engines(target, lambda: ModelDrafter(draft), num_speculative_tokens=3, max_new_tokens=N_NEW,
                        sampling=sampling, gamma_policy=policy))
    assert chi2_pvalue(counted(outs), exact_distribution(target, sampling)) > 1e-3


@pytest.mark.slow
def test_a_draft_whose_logits_overflow_leaves_sampling_exact():
    """A draft whose logits are NaN after some tokens (an fp16 overflow, say) failed every sampled
    row in torch's sampler; it now proposes from the uniform distribution there (wasted drafts,
    the same accept/reject rule): the samples still follow the target, at batch 1 and batched."""
    target = tiny("llama", seed=0, std=0.8)
    draft = perturbed_copy(target, noise=0.3, seed=1)

    def overflow(module, args, kwargs, out):  # NaN logits after token 2 or 4, finite elsewhere
        ids = kwargs.get("input_ids", args[0] if args else None)
        ids = ids[:, -out.logits.shape[1]:]  # (the positions whose logits were kept)
        bad = (ids == 2) | (ids == 4)
        out.logits = out.logits.masked_fill(bad[..., None], float("nan"))
        return out

    sampling = SamplingSettings(temperature=1.0)
    pair = engines(target, lambda: ModelDrafter(draft), num_speculative_tokens=2, max_new_tokens=N_NEW,
                   sampling=sampling)
    batched = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=2,
                                        max_new_tokens=12, sampling=sampling)
    one = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=2, max_new_tokens=12,
                               sampling=sampling)
    draft.register_forward_hook(overflow, with_kwargs=True)  # (after the engines' self-checks at load)
    outs = draw(pair)
    assert chi2_pvalue(counted(outs), exact_distribution(target, sampling)) > 1e-3
    assert rejected_some(outs)
    rows = [(PROMPT[: 2 + s % 4], s) for s in range(8)]  # other lengths, longer outputs
    assert [o.tokens for o in batched.generate_many(rows)] == [one.generate(p, s).tokens for p, s in rows]
