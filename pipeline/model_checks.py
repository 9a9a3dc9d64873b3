"""Preflight's checks of the job's models and tokenizer: where they are (a local folder, `gs://`, a hub id), that
they are whole and load, read from their files without loading any weights. Each failure is one `JobConfigError`
line naming the flag."""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from apache_beam.io.filesystems import FileSystems

from pipeline.errors import JobConfigError

if TYPE_CHECKING:  # (the options import torch)
    from pipeline.options import SpecDecOptions


CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer_config.json")


def config_files(path: str) -> list[str]:
    """The JSON configs (CONFIG_FILES) of a local or gs:// model directory, where present."""
    if path.startswith("gs://"):
        root = path.rstrip("/")
        return [f"{root}/{n}" for n in CONFIG_FILES if FileSystems.exists(f"{root}/{n}")]
    return [p for n in CONFIG_FILES if os.path.isfile(p := os.path.join(path, n))]


def check_reachable(flag: str, path: str) -> None:
    """A gs:// model directory this machine cannot reach (credentials, network, access) stops the job in one line, as an
    unreachable --input does, once the storage client's retries give up (about two minutes)."""
    if path.startswith("gs://"):
        try:
            FileSystems.exists(f"{path.rstrip('/')}/config.json")
        except Exception as e:  # Beam and the storage client raise several kinds
            raise JobConfigError(f"{flag} {path!r}: cannot reach it ({type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:300]})") from e


def check_config_files(flag: str, path: str, trust: bool) -> None:
    """A model directory's JSON configs are whole: transformers skips a generation_config.json it cannot parse
    without a word, and the job would decode past the model's end tokens. A model whose config or tokenizer
    config maps classes to its own Python files (auto_map) runs that code when loaded: refused unless
    --trust_remote_code. The JSON is read as data here, so nothing of the model directory is imported to
    decide. Hub ids are left to transformers, which raises before importing anything when trust_remote_code
    is False."""
    if not (path.startswith("gs://") or os.path.isdir(path)):
        return
    for file in config_files(path):
        try:
            with FileSystems.open(file) if file.startswith("gs://") else open(file, "rb") as f:
                config = json.loads(f.read().decode("utf-8"))  # (as transformers reads it: no BOM, no UTF-16)
            if not isinstance(config, dict):
                raise ValueError(f"a JSON {type(config).__name__}, not an object")
        except (OSError, ValueError) as e:
            raise JobConfigError(f"{flag} {path!r}: cannot read {os.path.basename(file)} ({e})") from e
        if not trust and config.get("auto_map"):
            names = ", ".join(sorted({str(v) for v in config["auto_map"].values()}))[:120]
            raise JobConfigError(f"{flag} {path!r} needs its own Python code ({os.path.basename(file)} auto_map: "
                                 f"{names}); pass --trust_remote_code to allow it")


def weight_files() -> tuple[str, ...]:
    """The weight files (or shard indexes) transformers loads a PyTorch model from."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    return SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME


def holds_any(directory: str, names: tuple[str, ...]) -> bool:
    """Whether a directory, local or gs://, holds one of these files."""
    if directory.startswith("gs://"):
        return any(FileSystems.exists(f"{directory.rstrip('/')}/{name}") for name in names)
    return any(os.path.isfile(os.path.join(directory, name)) for name in names)


def check_weights(flag: str, path: str) -> None:
    """The weights a local model loads from, whole: the first of `weight_files` the folder has, as transformers picks
    them (a leftover index beside a model.safetensors is never read); for an index, each file it lists, there. A
    safetensors header is read against its length (no tensor is), a zip-format .bin's end checked. One missing or cut
    short by an interrupted download or copy would fail every worker's load, in a traceback after the job began."""
    from safetensors import safe_open

    name = next((n for n in weight_files() if os.path.isfile(os.path.join(path, n))), None)
    if name is None:
        return
    files = [name]
    if name.endswith(".index.json"):
        try:
            with open(os.path.join(path, name)) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except Exception:  # (not an index transformers reads either: its load says why)
            return
        if missing := [f for f in files if not os.path.isfile(os.path.join(path, f))]:
            raise JobConfigError(f"{flag} {path!r}: {missing[0]}, listed in {name}, is missing"
                                 + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for file in files:
        try:
            if file.endswith(".safetensors"):
                with safe_open(os.path.join(path, file), "pt"):
                    pass
            else:
                with open(os.path.join(path, file), "rb") as f:
                    zipped = f.read(2) == b"PK"  # (torch's format since 1.6; an older pickle is not checked)
                if zipped and not zipfile.is_zipfile(os.path.join(path, file)):
                    raise ValueError("not a whole zip archive")
        except Exception as e:
            raise JobConfigError(f"{flag} {path!r}: {file} is damaged or cut short ({said(e)})") from e


def check_model_path(flag: str, path: str, trust: bool = False) -> None:
    if path.startswith("gs://") or os.path.exists(path) or path.startswith((".", "/", "~")):
        if not holds_any(path, ("config.json",)):
            raise JobConfigError(f"{flag} {path!r}: " + ("no config.json there" if path.startswith("gs://")
                                                          else "not a model directory (no config.json)"))
        if not holds_any(path, weight_files()):
            raise JobConfigError(f"{flag} {path!r}: no weights there ({', '.join(weight_files())})")
        if not path.startswith("gs://"):
            check_weights(flag, path)
    else:
        from transformers import AutoConfig

        check_hub_id(flag, path, "model", lambda **kw: AutoConfig.from_pretrained(path, trust_remote_code=trust, **kw))


def check_hub_id(flag: str, path: str, what: str, load: Callable[..., object]) -> None:
    """A hub id loads (`load(**kwargs)`: transformers' loader). The hub is asked once first (`model_info`), so that a
    repo that is not there, or that this machine may not read, is said at once: offline, the hub client's retries kept
    a typo's line waiting ~25 s. Without a hub to ask, the local hub cache decides, as transformers' own load does."""
    from huggingface_hub import constants, model_info
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        with quiet_transformers():
            if not constants.HF_HUB_OFFLINE:
                try:
                    model_info(path, timeout=10)
                except (RepositoryNotFoundError, GatedRepoError):  # (a private repo without a token: not found)
                    raise
                except HfHubHTTPError:  # (a mirror without the hub's API: the load decides)
                    pass
                except Exception as unreachable:
                    try:
                        load(local_files_only=True)
                        return
                    except OSError:
                        raise unreachable from None
            load()
    except Exception as e:
        if "trust_remote_code" in str(e):
            raise JobConfigError(f"{flag} {path!r} needs its own Python code; pass --trust_remote_code "
                                 "to allow it") from e
        raise JobConfigError(f"{flag} {path!r}: no local directory of that name, and no hub {what} of that id "
                             f"loads ({type(e).__name__})") from e


def check_tokenizer_path(path: str, trust: bool) -> None:
    """`--tokenizer`: a directory here, a gs:// directory with a tokenizer's files, or a hub id that
    loads (the workers would fail on every row otherwise, whatever the drafter)."""
    if path.startswith("gs://"):
        return  # (its files are looked for by `target_tokenizer`)
    if os.path.exists(path) or path.startswith((".", "/", "~")):
        if os.path.isfile(path):
            raise JobConfigError(f"--tokenizer {path!r}: a file: pass the folder that holds the tokenizer's files")
        if not os.path.isdir(path):
            raise JobConfigError(f"--tokenizer {path!r}: no such directory")
    else:
        from specdec_core.loading import load_tokenizer

        check_hub_id("--tokenizer", path, "tokenizer", lambda **kw: load_tokenizer(path, trust, **kw))


def target_tokenizer(opts: SpecDecOptions):
    """The job's tokenizer (--tokenizer, else the target's), or the one line saying which flag's cannot load; None for
    one on gs://, which the workers load (its folder is looked in for a tokenizer's files here)."""
    from specdec_core.loading import TOKENIZER_FILES, load_tokenizer

    flag, path = ("--tokenizer", opts.tokenizer) if opts.tokenizer else ("--target_model", opts.target_model)
    advice = "pass --tokenizer DIR, a folder that has one" if flag == "--target_model" else "pass a folder that has one"
    none_there = JobConfigError(f"{flag} {path!r}: no tokenizer there ({', '.join(TOKENIZER_FILES)}): {advice}")
    if path.startswith("gs://"):
        if not holds_any(path, TOKENIZER_FILES):
            raise none_there
        return None
    try:
        with quiet_transformers():
            return load_tokenizer(path, opts.trust_remote_code)
    except Exception as e:
        if os.path.isdir(path) and not holds_any(path, TOKENIZER_FILES):
            raise none_there from e
        raise JobConfigError(f"{flag} {path!r}: cannot load a tokenizer ({said(e)})") from e


def said(e: Exception) -> str:
    """An exception in one short line: its type and its message's first sentence."""
    return f"{type(e).__name__}: {' '.join(str(e).split()).split('. ')[0][:200]}"


def read_config(flag: str, path: str, trust: bool):
    """A model's config, or the one line saying why transformers cannot read it (a model type it does not know)."""
    from transformers import AutoConfig

    try:
        with quiet_transformers():
            return AutoConfig.from_pretrained(path, trust_remote_code=trust)
    except Exception as e:
        raise JobConfigError(f"{flag} {path!r}: transformers cannot read its config ({said(e)})") from e


@contextlib.contextmanager
def quiet_transformers():
    """transformers' warnings while preflight reads a model's files (the workers' loads still give them):
    on a config of a model type it does not know, its warning came before the job's one line."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    levels = hf_logging.get_verbosity(), hub_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()  # (its retries' warnings, offline)
    try:
        yield
    finally:
        hf_logging.set_verbosity(levels[0])
        hub_logging.set_verbosity(levels[1])


def read_generation_config(path: str):
    """A local model's generation config, or None where it has none."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path)
    except OSError:
        return None


def local_model_configs(opts: SpecDecOptions):
    """(flag, path, config) of the target and the model draft that are local (gs:// models are
    checked when the workers load them). Paths as `pipeline.run.parse_options` gives them (`~`
    expanded)."""
    models = [("--target_model", opts.target_model)]
    if opts.drafter == "model":
        models.append(("--draft_model", opts.draft_model))
    for flag, path in models:
        if not path.startswith("gs://"):
            yield flag, path, read_config(flag, path, opts.trust_remote_code)
