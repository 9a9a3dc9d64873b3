"""transforms.model_cache.localize against a local GCS emulator (no network, no credentials)."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems

from tests import gcs_emulator
from transforms import model_cache
from transforms.model_cache import MARKER, ModelPathError, localize

BUCKET = "specdec-models-test"


@pytest.fixture(scope="module")
def gcs():
    with gcs_emulator.running() as emu:
        emu.bucket(BUCKET)
        yield emu


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A small fake model directory: config, weights-like binary (with a .gz name), a nested file."""
    root = tmp_path_factory.mktemp("model")
    (root / "config.json").write_text('{"model_type": "gpt2"}')
    (root / "model.safetensors").write_bytes(os.urandom(300_000))
    (root / "vocab.txt.gz").write_bytes(b"not really gzip")  # must be copied byte for byte, not gunzipped
    (root / "sub").mkdir()
    (root / "sub" / "extra.bin").write_bytes(b"\x00" * 10)
    return root


@pytest.fixture
def remote(gcs, model_dir, request) -> str:
    prefix = f"gs://{BUCKET}/{request.node.name}/model"
    gcs.upload_dir(model_dir, prefix)
    return prefix


@pytest.fixture
def count_opens(monkeypatch):
    """Count (and optionally slow down) FileSystems.open calls made by the cache."""
    calls = []
    real_open = FileSystems.open

    def counting_open(path, *a, **kw):
        calls.append(path)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(FileSystems, "open", staticmethod(counting_open))
    return calls


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and p.name != MARKER}


def test_local_paths_and_hub_ids_are_unchanged(monkeypatch, tmp_path):
    def boom(*a, **k):
        raise AssertionError("no filesystem access expected")

    monkeypatch.setattr(FileSystems, "match", staticmethod(boom))
    monkeypatch.setattr(FileSystems, "open", staticmethod(boom))
    for path in [str(tmp_path), "relative/dir", "gpt2", "meta-llama/Llama-3.2-1B", "file:///tmp/x", "", None]:
        assert localize(path) == path


def test_copies_gs_directory_once(remote, model_dir, tmp_path, count_opens):
    local = localize(remote, cache_root=str(tmp_path))
    assert Path(local).parent == tmp_path
    assert _tree(Path(local)) == _tree(model_dir)
    assert (Path(local) / MARKER).exists()
    assert len(count_opens) == 4
    # second call: a cache hit, nothing downloaded, same directory; a trailing slash is the same model
    assert localize(remote + "/", cache_root=str(tmp_path)) == local
    assert len(count_opens) == 4
    # no temporary directories are left behind
    name = Path(local).name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, name + ".lock"])


def test_cache_root_from_environment(remote, tmp_path, monkeypatch):
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "env-cache"))
    local = localize(remote)
    assert Path(local).parent == tmp_path / "env-cache"
    assert local == model_cache.cache_dir_for(remote)


@pytest.mark.parametrize("damage", ["truncate", "delete_file", "delete_marker", "corrupt_marker"])
def test_damaged_cache_is_repaired(remote, model_dir, tmp_path, count_opens, damage):
    local = Path(localize(remote, cache_root=str(tmp_path)))
    if damage == "truncate":
        (local / "model.safetensors").write_bytes(b"partial")
    elif damage == "delete_file":
        (local / "sub" / "extra.bin").unlink()
    elif damage == "delete_marker":
        (local / MARKER).unlink()
    else:
        (local / MARKER).write_text("{not json")
    count_opens.clear()
    assert Path(localize(remote, cache_root=str(tmp_path))) == local
    assert len(count_opens) == 4
    assert _tree(local) == _tree(model_dir)


def test_changed_remote_is_copied_again(gcs, remote, tmp_path):
    local = Path(localize(remote, cache_root=str(tmp_path)))
    time.sleep(1.1)  # the emulator's timestamps have second resolution
    new = tmp_path / "new-config.json"
    new.write_text('{"model_type": "bert"}')  # (the same size: a retrained model's files keep theirs)
    gcs.upload_file(new, f"{remote}/config.json")
    assert Path(localize(remote, cache_root=str(tmp_path))) == local
    assert (local / "config.json").read_text() == '{"model_type": "bert"}'


def test_two_models_of_the_same_folder_name_get_folders_of_their_own(tmp_path):
    """A target and a draft both uploaded as `.../hf` (or two runs' `.../model`) must never share a cache folder."""
    folders = {model_cache.cache_dir_for(p, str(tmp_path)) for p in ("gs://a/x/hf", "gs://b/y/hf", "gs://a/x/hf/")}
    assert len(folders) == 2 and all(Path(f).name.startswith("hf-") for f in folders)


def test_size_mismatch_during_copy_fails_and_leaves_no_cache(remote, tmp_path, monkeypatch):
    real = model_cache._remote_manifest

    def lying_manifest(path):
        m = real(path)
        m["model.safetensors"][0] += 1
        return m

    monkeypatch.setattr(model_cache, "_remote_manifest", lying_manifest)
    expected = r"model\.safetensors: copied 300000 bytes but the object has 300001"
    with pytest.raises(ModelPathError, match=expected):
        localize(remote, cache_root=str(tmp_path))
    assert not Path(model_cache.cache_dir_for(remote, str(tmp_path))).exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_leftovers_of_a_killed_copy_are_removed(remote, model_dir, tmp_path):
    dest = Path(model_cache.cache_dir_for(remote, str(tmp_path)))
    stale = tmp_path / f".tmp-{dest.name}-12345-deadbeef"
    (stale / "sub").mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    assert localize(remote, cache_root=str(tmp_path)) == str(dest)
    assert not stale.exists()
    assert _tree(dest) == _tree(model_dir)


def test_not_enough_disk_fails_before_copying(remote, tmp_path, monkeypatch, count_opens):
    import collections
    import shutil

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(ModelPathError, match=r"to copy and 0\.3 GB kept free, but 0\.0 GB free in .*--disk_size_gb") \
            as info:
        localize(remote, cache_root=str(tmp_path))
    assert "\n" not in str(info.value)
    assert count_opens == []


def test_errors_are_one_line(gcs, tmp_path):
    gcs.upload_file(__file__, f"gs://{BUCKET}/not-a-model/readme.txt")
    cases = {
        f"gs://{BUCKET}/no-such-dir": r"^gs://specdec-models-test/no-such-dir has no files",
        f"gs://{BUCKET}/not-a-model": r"^gs://specdec-models-test/not-a-model has no config\.json",
        "gs://no-such-bucket-xyz/m": r"^gs://no-such-bucket-xyz/m: cannot list the model directory",
    }
    for path, pattern in cases.items():
        with pytest.raises(ModelPathError, match=pattern) as info:
            localize(path, cache_root=str(tmp_path))
        assert "\n" not in str(info.value)


def _localize_in_threads(remote: str, root: str, log: str, n: int) -> None:
    """Run n threads of localize() in this process; log every FileSystems.open call to `log`."""
    real_open = FileSystems.open

    def logged_open(path, *a, **kw):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {path}\n")
        time.sleep(0.05)  # widen the race window
        return real_open(path, *a, **kw)

    FileSystems.open = staticmethod(logged_open)
    results, errors = [], []

    def work():
        try:
            results.append(localize(remote, cache_root=root))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    FileSystems.open = staticmethod(real_open)
    assert not errors, errors
    assert len(set(results)) == 1


def test_concurrent_processes_and_threads_copy_once(remote, model_dir, tmp_path):
    log = tmp_path / "opens.log"
    root = tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")  # children inherit the emulator settings
    args = (remote, str(root), str(log), 3)
    procs = [ctx.Process(target=_localize_in_threads, args=args) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    lines = log.read_text().splitlines()
    assert len(lines) == 4, lines  # 4 files, downloaded by exactly one of the 9 callers
    assert len({line.split()[0] for line in lines}) == 1
    assert _tree(Path(model_cache.cache_dir_for(remote, str(root)))) == _tree(model_dir)


def test_localized_tiny_model_loads_with_transformers(gcs, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.tiny_models import save_pair

    target, _ = save_pair(tmp_path / "models", "gpt2")
    remote = f"gs://{BUCKET}/tiny/gpt2-target"
    gcs.upload_dir(target, remote)
    local = localize(remote, cache_root=str(tmp_path / "cache"))
    model = AutoModelForCausalLM.from_pretrained(local)
    tok = AutoTokenizer.from_pretrained(local)
    assert model.config.vocab_size == len(tok)
