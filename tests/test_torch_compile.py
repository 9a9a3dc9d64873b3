"""`--torch_compile`: the passes over static caches compiled by `torch.compile` (inductor's CPU code in
the tests marked `inductor`, dynamo and AOT autograd alone in the others: tests/conftest.py) give
the target's own greedy output, at batch 1 and in slots, decoder-only and encoder-decoder; a
compile that fails falls back to the uncompiled passes (or stops, strict); settings that would
compile nothing are refused."""

import logging

import pytest
import torch

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.drafters import ModelDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.graphs import MAX_GRAPH_WIDTH, PassGraphs
from specdec_core.pass_settings import PassSettings
from specdec_core.slot_kv import SlotKV
from specdec_core.text import GeneratorSpec
from tests.test_batch_engine import TEXTS, hf_greedy


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(t)["input_ids"] for t in TEXTS[:3]]


def count_compiled(*kvs: SlotKV) -> list[tuple[int, int]]:
    """The (rows, width) of each decode pass the compiled code of these caches ran."""
    runs = []
    for kv in kvs:
        compiled = kv.passes.compiled

        def counted(kind, fn, inp, *args, compiled=compiled):
            if kind == "decode":
                runs.append((inp.shape[0], inp.shape[1] - 2))
            return compiled(kind, fn, inp, *args)

        kv.passes.compiled = counted
    return runs


@pytest.mark.slow
# Inductor's code for Llama (the family of the GPU's main pair); T5 through dynamo alone, which traces
# the same hooks (AOT autograd's part, the writes into the buffers, is the same code for every family).
@pytest.mark.parametrize("kind", [pytest.param("llama", marks=pytest.mark.inductor),
                                  pytest.param("t5", marks=pytest.mark.dynamo)])
def test_compiled_passes_decode_what_generate_does(models, prompts, kind):
    """Batch 1 (target passes and chained draft rounds) and batched slots (an encoder-decoder's
    rows each at their own positions), compiled; a second batch recompiles nothing."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # (which leaves dynamo's counters as they are)
    before = counters["stats"]["unique_graphs"]
    target, draft = models[kind]
    n = 12
    reference = [hf_greedy(target, p, n) for p in prompts]
    drafter = ModelDrafter(draft, cuda_graphs="on", chain=True, torch_compile=True)
    gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=3, max_new_tokens=n, cuda_graphs="on",
                               torch_compile=True)
    runs = count_compiled(gen.static, drafter.static)
    assert [gen.generate(p).tokens for p in prompts] == reference
    assert {1, 4} <= {w for _, w in runs} and max(w for _, w in runs) <= MAX_GRAPH_WIDTH
    batch = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=2, num_speculative_tokens=3,
                                      max_new_tokens=n, cuda_graphs="on", torch_compile=True)
    runs = count_compiled(*batch.slots.values())
    assert [o.tokens for o in batch.generate_many([(p, 0) for p in prompts])] == reference
    assert runs and all(rows == 2 for rows, _ in runs)
    compiled = counters["stats"]["unique_graphs"]
    assert compiled >= before + 2  # dynamo compiled them here (no silent eager fallback)
    assert [o.tokens for o in batch.generate_many([(p, 0) for p in prompts[::-1]])] == reference[::-1]
    assert counters["stats"]["unique_graphs"] == compiled  # the same hooks, the same compiled passes


@pytest.mark.slow
@pytest.mark.dynamo
@pytest.mark.parametrize("family", ["bart", "umt5"])
def test_encoder_decoder_rows_at_their_own_positions_compiled(family):
    """Batched rows of an encoder-decoder, each at its own position: BART's learned position
    embeddings and UMT5's relative biases in every layer reach the compiled passes through hooks
    made once per cache; exact, and really compiled."""
    from tests.family_models import V, family_model
    from tests.test_batch_families import hf_greedy
    from tests.tiny_models import perturbed_copy

    # As when run alone: the shapes dynamo saw in earlier tests' passes would make these traces dynamic (slower).
    torch._dynamo.reset()
    target = family_model(family, seed=1)
    draft = perturbed_copy(target, 0.15, seed=2)
    draft.generation_config = target.generation_config
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, V - 6, (n,), generator=g).tolist() for n in (5, 12, 3)]
    batch = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True, torch_compile=True), batch_size=2,
                                      num_speculative_tokens=3, max_new_tokens=10, cuda_graphs="on",
                                      torch_compile=True)
    runs = count_compiled(*batch.slots.values())
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    assert [o.tokens for o in batch.generate_many([(p, 0) for p in prompts])] == [
        hf_greedy(target, p, 10) for p in prompts]
    assert {w for _, w in runs} >= {1, 4}  # draft steps and verify passes, compiled
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > before  # dynamo compiled them (no silent eager fallback)
    assert [o.tokens for o in batch.generate_many([(p, 0) for p in prompts[::-1]])] == [
        hf_greedy(target, p, 10) for p in prompts[::-1]]
    assert counters["stats"]["unique_graphs"] == compiled  # nothing compiled again for new rows' positions


def test_a_compile_that_fails_falls_back_even_when_strict(models, prompts, caplog):
    """Compiling is on by default on a GPU: a worker that cannot compile (no C compiler for
    Triton, say) still decodes, uncompiled, even with `--cuda_graphs on` (strict about graphs)."""
    target, _ = models["llama"]
    reference = hf_greedy(target, prompts[0], 6)

    def broken(*args):
        raise RuntimeError("no C compiler")

    for strict in (False, True):
        gen = SpeculativeGenerator(target, None, max_new_tokens=6, cuda_graphs="on", torch_compile=True)
        gen.static.passes.strict = strict
        gen.static.passes._compiled["decode"] = broken
        with caplog.at_level(logging.WARNING):
            assert gen.generate(prompts[0]).tokens == reference
        assert not gen.static.passes.compiles and "torch.compile failed (RuntimeError: no C compiler)" in caplog.text

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    gen.static.passes.compiles = True
    gen.static.passes._compiled["decode"] = out_of_memory  # the pass's own failure: raised, compiling kept
    with pytest.raises(torch.OutOfMemoryError):
        gen.generate(prompts[0])
    assert gen.static.passes.compiles and gen.static.passes._compiled["decode"] is out_of_memory


def test_an_engine_with_nothing_to_compile_says_so(models, caplog):
    target, _ = models["llama"]
    with caplog.at_level(logging.INFO, logger="specdec_core"):
        SpeculativeGenerator(target, None, max_new_tokens=4, torch_compile=True)  # no CUDA: no static cache
        BatchSpeculativeGenerator(target, None, batch_size=2, max_new_tokens=4, torch_compile=True)
    assert "--torch_compile: LlamaForCausalLM runs uncompiled" in caplog.text
    assert "--torch_compile: LlamaForCausalLM batches run uncompiled" in caplog.text


def test_settings_that_would_compile_nothing_are_refused():
    with pytest.raises(ValueError, match="--torch_compile on compiles the passes over static caches: not with "
                                         "--cuda_graphs off"):
        GeneratorSpec(target_model="t", drafter="none", torch_compile="on", cuda_graphs="off")
    with pytest.raises(ValueError, match="not with --device cpu"):
        GeneratorSpec(target_model="t", drafter="none", torch_compile="on", device="cpu")
    GeneratorSpec(target_model="t", drafter="none", torch_compile="on", device="cpu", cuda_graphs="on")


def test_auto_compiles_where_the_passes_are_cuda_graphs():
    """The default: compiled (and the draft's steps chained) on a GPU wherever --cuda_graphs puts
    the passes in graphs; never on a CPU unless asked; a bare `--torch_compile` means on."""
    from pipeline.options import SpecDecOptions
    from specdec_core.plan import compiles

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert compiles("auto", "auto", gpu) and compiles("auto", "on", gpu) and not compiles("auto", "off", gpu)
    assert not compiles("auto", "auto", cpu) and not compiles("auto", "on", cpu)
    assert compiles("on", "on", cpu) and not compiles("off", "auto", gpu)
    with pytest.raises(ValueError, match="--torch_compile 'sometimes': expected one of auto, on, off"):
        GeneratorSpec(target_model="t", drafter="none", torch_compile="sometimes")

    def parsed(*argv):
        return SpecDecOptions(["--input", "i", "--output", "o", "--target_model", "t", *argv]).torch_compile

    assert (parsed(), parsed("--torch_compile"), parsed("--torch_compile", "off")) == ("auto", "on", "off")


@pytest.mark.slow
@pytest.mark.dynamo
def test_compiling_without_a_graph_counts_as_one_off_work(models, prompts, caplog):
    """Passes compiled outside a capture (a CPU's, with --cuda_graphs on: it captures none) add
    their compile time to the cache's one-off seconds, which item time limits leave out; each
    item's stats say how much of its time it was (in all, and in its prefill)."""
    torch._dynamo.reset()
    target, _ = models["llama"]
    gen = SpeculativeGenerator(target, None, max_new_tokens=4, cuda_graphs="on", torch_compile=True)
    with caplog.at_level(logging.INFO, logger="specdec_core"):
        # the first allocates the buffers; then passes compile
        stats = [gen.generate(p).stats for p in prompts]
    setup = gen.static.passes.capture_s
    assert setup > 0 and "-token pass compiled" in caplog.text
    assert sum(s.setup_s for s in stats) == pytest.approx(setup)
    assert all(0 <= s.prefill_setup_s <= s.setup_s <= s.latency_s for s in stats)
    again = [gen.generate(p).stats for p in prompts[::-1]]  # nothing new to compile, nothing added
    assert gen.static.passes.capture_s == setup and all(s.setup_s == s.prefill_setup_s == 0 for s in again)


@pytest.mark.slow
def test_compiled_prefills_decode_what_generate_does(models):
    """Prompts' prefill passes (one logit kept, any width) through torch.compile too, as the GPU
    bench's "compiled prefills" run them: outputs unchanged, and the prefills really compiled."""
    torch._dynamo.reset()
    target, draft = models["llama"]
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (20, 33, 27)]  # wider than a graph's pass
    n = 8
    reference = [hf_greedy(target, p, n) for p in prompts]
    gen = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="on"), num_speculative_tokens=3,
                               max_new_tokens=n, cuda_graphs="on", torch_compile=True,
                               settings=PassSettings(compile_prefills=True))
    # Widths counted around the compiled call, not inside the traced pass (a list appended to in there is
    # a guard of its own: each prefill would recompile); a compile that failed returns None.
    widths, own = [], gen.static.passes.compiled

    def counted(kind, fn, inp, *args):
        out = own(kind, fn, inp, *args)
        if kind == "prefill" and out is not None:
            widths.append(inp.shape[1] - 2)
        return out

    gen.static.passes.compiled = counted
    assert [gen.generate(p).tokens for p in prompts] == reference
    assert "prefill" in gen.static.passes._compiled and widths[-2:] == [32, 26]  # (the first pass allocates)


@pytest.mark.slow
@pytest.mark.dynamo
def test_new_rows_in_compiled_slots_prefill_through_compiled_graphs(models, monkeypatch):
    """Compiled slots prefill new rows through one-row graphs of compiled passes (the GPU's
    default for the batch engine, measured faster there), here through a stand-in graph that runs
    the pass again at each replay (a traced one cannot trace compiled code): outputs unchanged,
    and every new row's prefill ran the compiled pass."""

    class Rerun:
        def __init__(self, run, static):
            self.run, self.static = run, static
            self.out = run(static).clone()

        def replay(self):
            self.out.copy_(self.run(self.static))

    monkeypatch.setattr(PassGraphs, "_record", lambda self, run, static: (graph := Rerun(run, static), graph.out))
    torch._dynamo.reset()
    target, draft = models["llama"]
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (20, 33, 9, 27)]
    n = 8
    reference = [hf_greedy(target, p, n) for p in prompts]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=2, num_speculative_tokens=3,
                                       max_new_tokens=n, cuda_graphs="on", torch_compile=True)
    slots = engine.slots[id(target)]
    assert slots.passes.compile_prefills
    slots.passes.on = engine.slots[id(draft)].graphs = True
    assert [o.tokens for o in engine.generate_many([(p, 0) for p in prompts])] == reference
    pre = slots._prefiller
    assert pre.passes.compile_prefills and "prefill" in pre.passes._compiled and pre.passes.captures > 0


@pytest.mark.slow
@pytest.mark.dynamo
def test_new_rows_prefills_of_16_and_4_rows_share_one_compile(models):
    """New rows' compiled prefill passes (16, 4 or 1 rows: `admission_rows`) keep their row count dynamic, so 16 and
    4 rows share one compile (one row gets its own: dynamo specializes a size of 1): on a GPU each compile of the
    target's prefill took about 50 s. Each pass writes the keys an uncompiled pass writes."""
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    target, _ = models["llama"]
    g = torch.Generator().manual_seed(9)
    kvs = [SlotKV(target, 16, graphs=False, compile=compiled, settings=PassSettings(compile_prefills=compiled))
           for compiled in (True, False)]
    compiles = []
    for rows in (16, 16, 4, 1, 4):  # (the first pass allocates the buffers, uncompiled)
        feeds = [torch.randint(3, 200, (int(n),), generator=g).tolist() for n in torch.randint(5, 12, (rows,))]
        before = counters["stats"]["unique_graphs"]
        for kv in kvs:
            kv.prefill_rows(feeds, [0] * rows)
        compiles.append(counters["stats"]["unique_graphs"] - before)
        keys = [kv.cache.layers[0].keys[:rows, :, :12] for kv in kvs]
        assert torch.allclose(*keys, atol=1e-5)
    assert compiles == [0, 1, 0, 1, 0]


@pytest.mark.slow
@pytest.mark.dynamo
@pytest.mark.parametrize("family", ["gemma2", "m2m100", "led"])
def test_compiled_passes_of_a_window_and_a_position_table(family):
    """--torch_compile over a mask per layer type (Gemma 2, rows past its window) and over
    position embeddings looked up on the device (M2M100's counted from the ids; LED's table, its
    one-token passes widened), batch 1 and in slots: what the GPU's compiled test checks with
    Triton's kernels, here traced by dynamo (inductor's numbers: Llama's test above)."""
    from tests.family_models import V, family_model
    from tests.test_batch_families import hf_greedy as hf_greedy_any

    torch._dynamo.reset()
    target, draft = family_model(family, seed=1), family_model(family, seed=2)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, V - 6, (n,), generator=g).tolist() for n in (5, 12, 3)]
    n = 16  # past the tests' 6-token window
    refs = [hf_greedy_any(target, p, n) for p in prompts]
    drafter = ModelDrafter(draft, cuda_graphs="on", chain=True, torch_compile=True)
    single = SpeculativeGenerator(target, drafter, num_speculative_tokens=3, max_new_tokens=n, cuda_graphs="on",
                                  torch_compile=True)
    runs = count_compiled(single.static)
    assert [single.generate(p).tokens for p in prompts] == refs, (family, "batch 1")
    # A batched job's worker compiles its slots' passes afresh (its batch-1 engine runs eagerly): so here, not
    # traced again as passes whose row count and buffer sizes dynamo saw change (slower, and not what a job runs).
    torch._dynamo.reset()
    batch = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=2, num_speculative_tokens=3,
                                      max_new_tokens=n, cuda_graphs="on", torch_compile=True)
    batched = count_compiled(*batch.slots.values())
    assert [o.tokens for o in batch.generate_many([(p, 0) for p in prompts])] == refs, (family, "batched")
    assert {rows for rows, _ in runs} == {1} and {rows for rows, _ in batched} == {2}  # really compiled
