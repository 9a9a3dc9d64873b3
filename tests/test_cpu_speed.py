"""CPU preparation: the packed kernels' row threshold chosen by timing on the machine at hand,
and a draft's large linears with bf16 weights; neither may change what the target outputs."""

import copy

import pytest
import torch

from specdec_core import cpu_speed
from specdec_core.cpu_speed import PrepackedLinear, bf16_linears, packed_from_rows, prepare_for_cpu
from specdec_core.drafters import ModelDrafter
from specdec_core.engine import SpeculativeGenerator

needs_onednn = pytest.mark.skipif(not cpu_speed.prepack_available(), reason="oneDNN not in this torch build")


def _fake_timer(times):
    """Timings handed out in call order: stock then packed, for 1 row, 2 rows, ..."""
    it = iter(times)
    return lambda fn, reps: next(it)


@needs_onednn
@pytest.mark.parametrize(("times", "rows"), [
    ([1.0, 0.5], 1),  # packed clearly faster from one row (as on the AMD EPYC measured)
    ([1.0, 0.95, 1.0, 0.6], 2),  # within the margin at 1 row: not chosen there
    ([1.0, 1.1, 1.0, 0.9, 1.0, 0.9], 4),  # never clearly faster below 4: the fixed rule
])
def test_packed_from_rows_takes_the_first_clearly_faster_row_count(models, times, rows):
    target, _ = models["llama"]
    packed = [m for m in prepare_for_cpu(copy.deepcopy(target), min_weight=0, threshold_rows=4).modules()
              if isinstance(m, PrepackedLinear)]
    assert packed_from_rows(packed, timer=_fake_timer(times)) == rows
    assert packed_from_rows([]) == 4


@needs_onednn
def test_prepare_for_cpu_times_the_threshold_and_keeps_greedy_exact(models, tokenizer, monkeypatch):
    target, draft = models["llama"]
    real = cpu_speed.packed_from_rows
    chosen = []
    monkeypatch.setattr(cpu_speed, "packed_from_rows", lambda linears: chosen.append(real(linears)) or 1)
    fast = prepare_for_cpu(copy.deepcopy(target), min_weight=0)
    assert chosen and 1 <= chosen[0] <= 4  # really timed on this machine
    layers = [m for m in fast.modules() if isinstance(m, PrepackedLinear)]
    assert layers and all(m.threshold_rows == 1 for m in layers)  # what the timing chose is used everywhere
    ids = tokenizer("def add(a, b):\n    return").input_ids
    ref = SpeculativeGenerator(target, None, max_new_tokens=20).generate(ids).tokens
    out = SpeculativeGenerator(fast, ModelDrafter(draft), num_speculative_tokens=4, max_new_tokens=20).generate(ids)
    assert out.tokens == ref


def test_bf16_linears_need_native_bf16(models, monkeypatch):
    """Without native bf16 the draft is left as loaded (emulated bf16 is slower than fp32)."""
    monkeypatch.setattr(cpu_speed, "bf16_native", lambda: False)
    draft = copy.deepcopy(models["llama"][1])
    assert bf16_linears(draft, min_weight=0) == 0
    assert not any(isinstance(m, cpu_speed.Bf16Linear) for m in draft.modules())


@pytest.mark.skipif(not cpu_speed.bf16_native(), reason="this CPU has no native bf16 (the test above covers it)")
@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_bf16_linears_change_only_the_proposals(models, tokenizer, kind):
    target, draft = models[kind]
    d16 = copy.deepcopy(draft)
    assert bf16_linears(d16, min_weight=0) > 0
    assert next(d16.parameters()).dtype == torch.float32  # norms, embeddings stay fp32
    ids = tokenizer("def add(a, b):\n    return a + b\n").input_ids
    x = torch.tensor([ids])
    with torch.inference_mode():
        kw = {"decoder_input_ids": x[:, :4]} if draft.config.is_encoder_decoder else {}
        a, b = draft(x, **kw).logits, d16(x, **kw).logits
    assert b.dtype == torch.float32
    assert not torch.equal(a, b)  # really bf16 weights
    if kind == "llama":  # mostly the same proposals. Not asserted for the random tiny T5: its unscaled
        # attention logits (q.k up to ~300) make its softmax one-hot, so bf16 rounding flips whole rows.
        assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.8
    ref = SpeculativeGenerator(target, None, max_new_tokens=20).generate(ids).tokens
    out = SpeculativeGenerator(target, ModelDrafter(d16), num_speculative_tokens=4, max_new_tokens=20).generate(ids)
    assert out.tokens == ref and out.stats.draft_tokens > 0


def test_auto_gives_bf16_linears_to_a_greedy_jobs_draft_only(models, monkeypatch):
    """A seed's sample depends on the draft's numerics, and bf16 linears exist only on CPUs with native bf16: a
    sampled job's `auto` draft keeps its dtype, so a seed gives the same sample on every machine."""
    swapped = []
    monkeypatch.setattr(cpu_speed, "bf16_linears", lambda model: swapped.append(model) or 1)
    draft = models["llama"][1]
    assert cpu_speed.draft_in_dtype(draft, "auto", sampled=True) is draft and not swapped
    assert cpu_speed.draft_in_dtype(draft, "auto") is draft and swapped == [draft]


@pytest.mark.skipif(not cpu_speed.bf16_native(), reason="this CPU has no native bf16 (no bf16 linears to batch)")
def test_a_draft_of_bf16_linears_batches(tokenizer):
    """`--draft_dtype auto` on a native-bf16 CPU with `--batch_size` > 1: the draft's rows check compares at the
    margin of its bf16 numbers (at float32's it refused the job at load)."""
    from specdec_core.batch_engine import BatchSpeculativeGenerator
    from tests.tiny_models import make_model, perturbed_copy

    target = make_model("llama", tokenizer, seed=1, hidden=1024)  # (bf16 rounding past float32's margin)
    d16 = perturbed_copy(target, 0.05, seed=2)
    assert bf16_linears(d16) > 0
    prompts = [tokenizer(t).input_ids for t in ("def add(a, b):\n    return a + b\n", "The quick brown fox")]
    ref = [SpeculativeGenerator(target, None, max_new_tokens=12).generate(p).tokens for p in prompts]
    batched = BatchSpeculativeGenerator(target, ModelDrafter(d16), batch_size=2, num_speculative_tokens=3,
                                        max_new_tokens=12)
    assert [g.tokens for g in batched.generate_many([(p, 0) for p in prompts])] == ref


@pytest.mark.skipif(not cpu_speed.bf16_native(), reason="this CPU has no native bf16: a bf16 model is left as is")
def test_bf16_target_packed_keeps_speculative_output_its_own(models, tokenizer):
    """`--dtype bfloat16` on CPU: every linear is packed (for one row, used at every row count), so
    1-token and k-token passes share one kernel; speculative output equals the target alone's."""
    target, draft = models["llama"]
    t16 = prepare_for_cpu(copy.deepcopy(target).to(torch.bfloat16))
    layers = [m for m in t16.modules() if isinstance(m, PrepackedLinear)]
    assert layers and all(m.threshold_rows == 1 for m in layers)
    d16 = prepare_for_cpu(copy.deepcopy(draft).to(torch.bfloat16))
    ids = tokenizer("def add(a, b):\n    return a + b\n").input_ids
    ref = SpeculativeGenerator(t16, None, max_new_tokens=20).generate(ids).tokens
    out = SpeculativeGenerator(t16, ModelDrafter(d16), num_speculative_tokens=4, max_new_tokens=20).generate(ids)
    assert out.tokens == ref and out.stats.draft_tokens > 0


def test_a_programs_main_gives_the_caller_its_thread_count_back():
    """Tests and notebooks call programs' main() in-process: the program's thread count stays its own,
    even when it fails (on 2 cores a second thread left behind slowed every later test several times)."""
    from pipeline.threads import keeps_torch_threads

    before = torch.get_num_threads()

    @keeps_torch_threads
    def main(threads: int) -> int:
        torch.set_num_threads(threads)
        assert torch.get_num_threads() == threads
        if threads > 2:
            raise SystemExit(2)
        return 0

    assert main(before + 1 if before < 2 else 1) == 0
    assert torch.get_num_threads() == before
    with pytest.raises(SystemExit):
        main(3)
    assert torch.get_num_threads() == before
