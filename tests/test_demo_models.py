"""Fast tests of the demo's model making, in tiny mode (a few seconds of training)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from pipeline import demo_models as dm


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One tiny pair, built once for the module (copies are made for destructive tests)."""
    workdir = tmp_path_factory.mktemp("demo")
    before = dict(dm.TRAIN_COUNTS)
    target_dir, draft_dir = dm.ensure_demo_models(workdir, tiny=True)
    assert dm.TRAIN_COUNTS["target"] == before["target"] + 1
    assert dm.TRAIN_COUNTS["draft"] == before["draft"] + 1
    return workdir, target_dir, draft_dir


def _copy(src_workdir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(src_workdir, dst)
    return dst


def test_split_is_deterministic_and_disjoint():
    files = dm.stdlib_files()
    assert files == sorted(files) and len(files) > 50
    train, held = dm.split_files(files, dm.FULL.heldout_mod)
    assert not set(train) & set(held)
    assert set(train) | set(held) == set(files)
    assert 0.03 < len(held) / len(files) < 0.2
    assert dm.split_files(files, dm.FULL.heldout_mod) == (train, held)


def test_pair_is_ordinary_hf_dirs_sharing_a_tokenizer(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    workdir, target_dir, draft_dir = built
    assert target_dir == workdir / "models" / "target" and draft_dir == workdir / "models" / "draft"
    t_tok, d_tok = AutoTokenizer.from_pretrained(target_dir), AutoTokenizer.from_pretrained(draft_dir)
    assert t_tok.get_vocab() == d_tok.get_vocab()
    assert (t_tok.bos_token, t_tok.eos_token, t_tok.pad_token) == ("<s>", "</s>", "<pad>")
    text = "def f(x):\n    return x + 1\n"
    ids = t_tok(text, add_special_tokens=False)["input_ids"]
    assert t_tok.decode(ids) == text  # byte-level BPE round-trips code exactly
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    assert target.config.vocab_size == draft.config.vocab_size == len(t_tok)
    assert target.config.eos_token_id == t_tok.eos_token_id
    assert sum(p.numel() for p in draft.parameters()) < sum(p.numel() for p in target.parameters())
    out = target.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)
    assert out.shape[1] <= len(ids) + 5
    for d in (target_dir, draft_dir):
        marker = json.loads((d / dm.MARKER).read_text())
        assert marker["steps"] > 0 and marker["weights_sha256"]


def test_cache_is_reused(built):
    workdir, target_dir, draft_dir = built
    before = dict(dm.TRAIN_COUNTS)
    mtimes = [(d / dm.WEIGHTS).stat().st_mtime_ns for d in (target_dir, draft_dir)]
    assert dm.ensure_demo_models(workdir, tiny=True) == (target_dir, draft_dir)
    assert dm.TRAIN_COUNTS == before
    assert [(d / dm.WEIGHTS).stat().st_mtime_ns for d in (target_dir, draft_dir)] == mtimes


def test_truncated_target_weights_are_repaired(built, tmp_path, caplog):
    workdir = _copy(built[0], tmp_path)
    weights = workdir / "models" / "target" / dm.WEIGHTS
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    reason = dm.validate_cached(weights.parent, dm.TINY.hash("target"))
    assert reason is not None and "\n" not in reason
    before = dict(dm.TRAIN_COUNTS)
    with caplog.at_level("WARNING", logger="pipeline.demo_models"):
        target_dir, draft_dir = dm.ensure_demo_models(workdir, tiny=True)
    assert "rebuilding" in caplog.text
    assert dm.TRAIN_COUNTS["target"] == before["target"] + 1
    assert dm.TRAIN_COUNTS["draft"] == before["draft"] + 1  # the draft follows its target
    assert dm.validate_cached(target_dir, dm.TINY.hash("target")) is None
    before = dict(dm.TRAIN_COUNTS)
    dm.ensure_demo_models(workdir, tiny=True)  # and the repaired cache is reused
    assert dm.TRAIN_COUNTS == before


def test_corrupt_draft_only_retrains_the_draft(built, tmp_path):
    workdir = _copy(built[0], tmp_path)
    (workdir / "models" / "draft" / dm.WEIGHTS).write_bytes(b"not a safetensors file")
    before = dict(dm.TRAIN_COUNTS)
    dm.ensure_demo_models(workdir, tiny=True)
    assert dm.TRAIN_COUNTS["target"] == before["target"]
    assert dm.TRAIN_COUNTS["draft"] == before["draft"] + 1


def test_missing_marker_means_rebuild(built, tmp_path):
    workdir = _copy(built[0], tmp_path)
    (workdir / "models" / "target" / dm.MARKER).unlink()  # e.g. a run killed while saving
    assert dm.validate_cached(workdir / "models" / "target", dm.TINY.hash("target")) is not None
    before = dict(dm.TRAIN_COUNTS)
    dm.ensure_demo_models(workdir, tiny=True)
    assert dm.TRAIN_COUNTS["target"] == before["target"] + 1
    assert not [p for p in (workdir / "models").iterdir() if p.name.startswith(".")]  # no temp dirs left


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_unwritable_workdir_is_one_line_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(dm.DemoSetupError) as err:
            dm.ensure_demo_models(ro / "work", tiny=True)
        msg = str(err.value)
        assert "\n" not in msg and "cannot write" in msg and str(ro) in msg
    finally:
        ro.chmod(0o700)


def test_workdir_that_is_a_file_is_one_line_error(tmp_path):
    # Works as root too: a regular file where the work directory should be.
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(dm.DemoSetupError) as err:
        dm.ensure_demo_models(blocker / "work", tiny=True)
    msg = str(err.value)
    assert "\n" not in msg and "cannot write" in msg


def test_prompts_parquet_from_heldout_files(built):
    workdir, target_dir, _ = built
    path = dm.write_demo_prompts(workdir, 5, target_dir, tiny=True)
    assert path == workdir / "prompts.parquet"
    table = pq.read_table(path)
    assert table.column_names[:2] == ["id", "prompt"] and "source_file" in table.column_names
    rows = table.to_pylist()
    assert len(rows) == 5 and len({r["id"] for r in rows}) == 5
    _, held = dm.split_files(dm.stdlib_files(), dm.TINY.heldout_mod)
    assert all(r["source_file"] in held for r in rows)
    assert all(r["prompt"].rstrip().endswith(":") and "def " in r["prompt"] for r in rows)
    # deterministic
    again = dm.write_demo_prompts(workdir, 5, target_dir, tiny=True)
    assert pq.read_table(again).to_pylist() == rows
