"""The in-place KV cache holds exactly what transformers' concatenating DynamicCache holds."""

import pytest
import torch
from transformers import DynamicCache

from specdec_core import kv_cache
from specdec_core.kv_cache import GrowingLayer, growing_cache


def _kv(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, cols, 4, generator=g), torch.randn(rows, 2, cols, 4, generator=g)


def test_appends_crops_and_growth_match_concatenation(monkeypatch):
    monkeypatch.setattr(kv_cache, "MIN_SPARE", 3)  # grow often
    ours, ref = GrowingLayer(), DynamicCache().layer_class_to_replicate()
    buffers = set()
    for step, (cols, crop) in enumerate([(5, 0), (1, 0), (4, -3), (2, 0), (7, -1), (1, 0), (9, -6), (3, 0)]):
        k, v = _kv(1, cols, step)
        got, want = ours.update(k, v), ref.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), step
        buffers.add(ours._kbuf.data_ptr())
        ours.crop(crop)
        ref.crop(crop)
        assert ours.get_seq_length() == ref.get_seq_length()
        assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
    assert len(buffers) > 1, "the buffer never grew: the test did not exercise growth"


def test_appends_write_into_spare_columns_without_copying():
    layer = GrowingLayer()
    layer.update(*_kv(1, 8, 0))
    buffer = layer._kbuf.data_ptr()
    for step in range(1, 20):
        layer.update(*_kv(1, 1, step))
        layer.crop(-1) if step % 3 == 0 else None
    assert layer._kbuf.data_ptr() == buffer


@pytest.mark.parametrize(("held", "added"), [(6, 2), (1, 1), (1, 3)])
def test_rows_replaced_from_outside_are_adopted(held, added):
    """Batch row selection (and BatchKV.merge) assign keys/values; the next update must start
    from them, not from the stale buffer: a single held column too."""
    ours, ref = growing_cache(), DynamicCache()
    for cache in (ours, ref):
        cache.update(*_kv(3, held, 0), layer_idx=0)
        cache.batch_select_indices(torch.tensor([2, 0]))
    got, want = ours.update(*_kv(2, added, 1), layer_idx=0), ref.update(*_kv(2, added, 1), layer_idx=0)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_model_logits_equal_with_either_cache(kind, models, tokenizer):
    """A real model fed step by step, with rollbacks, gives the same logits through both caches."""
    from specdec_core.batch_kv import feed_to, one_row
    from specdec_core.decoder import initial_decoder_ids

    target, _ = models[kind]
    ids = tokenizer("def add(a, b):\n    return a + b").input_ids
    ours, ref = one_row(target, ids), one_row(target, ids)
    ref.cache = DynamicCache()
    seq = initial_decoder_ids(target, ids) + ([] if kind == "llama" else ids)
    for end, keep in [(len(seq) - 4, None), (len(seq) - 1, len(seq) - 3), (len(seq), None)]:
        if keep is not None:
            ours.rollback(0, keep)
            ref.rollback(0, keep)
        a, b = feed_to(ours, seq[:end], 2), feed_to(ref, seq[:end], 2)
        assert torch.equal(a, b), (kind, end)
    assert ours.cache.layers and all(isinstance(layer, GrowingLayer) for layer in ours.cache.layers)


def test_a_narrower_row_view_stays_in_the_buffer():
    """BatchKV.drop narrows the rows to a prefix of the buffer's; appends go on in place and hold
    what a concatenating cache holds for those rows."""
    ours, ref = GrowingLayer(), DynamicCache().layer_class_to_replicate()
    for layer in (ours, ref):
        layer.update(*_kv(3, 6, 0))
    buffer = ours._kbuf.data_ptr()
    ours.keys, ours.values = ours.keys[:2], ours.values[:2]
    ref.keys, ref.values = ref.keys[:2], ref.values[:2]
    got, want = ours.update(*_kv(2, 3, 1)), ref.update(*_kv(2, 3, 1))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert ours._kbuf.data_ptr() == buffer
