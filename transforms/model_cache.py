"""Copy model directories from gs:// (or any remote Beam filesystem) to a local cache, once per machine.

`transformers.from_pretrained` only reads local directories and hub ids, so a `gs://` model is
first copied to local disk. On a Dataflow worker several SDK processes (and several threads in
each) load the model at about the same time; the copy must happen once and never be seen half done:

- an exclusive `fcntl.flock` on `<cache_dir>.lock` serialises processes and threads (each call opens
  its own file description, so threads of one process exclude each other too);
- files are downloaded into a fresh temporary directory next to the cache, each file's size is checked
  against the remote listing, a marker file with the remote manifest is written last, and only then is
  the directory renamed into place (a rename within one filesystem is atomic);
- every call re-lists the remote directory (one list request) and compares it with the marker and with
  the local file sizes, so a partial, corrupted or outdated cache is repaired on the next call;
  temporary copies left by a killed process are deleted, and a copy that cannot fit on the disk
  fails at once with the sizes in the message.

Local paths and hub ids are returned unchanged.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid

_LOGGER = logging.getLogger(__name__)

CACHE_ENV = "SPECDEC_MODEL_CACHE"
MARKER = ".specdec-cache-complete.json"
# A directory is a model/tokenizer directory if it has one of these at its top level.
DIRECTORY_MARKERS = ("config.json", "tokenizer_config.json")
_REMOTE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_CHUNK = 8 << 20
_MAX_PARALLEL_DOWNLOADS = 8
_DISK_HEADROOM = 256 << 20


class ModelPathError(ValueError):
    """A model location that cannot be used; the message is one line and names the location."""


def is_remote(path: str) -> bool:
    """True for `scheme://...` locations (gs://, s3://, ...) that Beam's FileSystems must read."""
    return bool(_REMOTE.match(path)) and not path.startswith("file://")


def default_cache_root() -> str:
    return os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "specdec-beam-models")


def cache_dir_for(path: str, cache_root: str | None = None) -> str:
    """The local directory that `localize(path)` fills: `<root>/<last path part>-<hash of path>`."""
    remote = path.rstrip("/")
    digest = hashlib.sha256(remote.encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", remote.rsplit("/", 1)[-1]) or "model"
    return os.path.join(cache_root or default_cache_root(), f"{name}-{digest}")


def localize(path: str, cache_root: str | None = None) -> str:
    """Return a local directory holding the model at `path`.

    Local directories and hub ids come back unchanged. `gs://bucket/dir` (any remote Beam
    filesystem) is copied once per machine to `cache_root` (default: $SPECDEC_MODEL_CACHE, else
    `<tempdir>/specdec-beam-models`) and the local copy's path is returned.
    Raises ModelPathError with a one-line message when the location is empty or not a model directory.
    """
    if not path or not is_remote(path):
        return path
    remote = path.rstrip("/")
    manifest = _remote_manifest(remote)
    dest = cache_dir_for(remote, cache_root)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with _locked(dest + ".lock"):
        if _is_complete(dest, manifest):
            _LOGGER.info("Model cache hit: %s -> %s", remote, dest)
            return dest
        _download(remote, manifest, dest)
    return dest


def _remote_manifest(remote: str) -> dict[str, list]:
    """{relative path: [size, last_updated]} for every object under `remote/`."""
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    # Beam globs cannot quote meta-characters: turn them into `?` (a superset of the literal path)
    # and keep only the exact prefix below.
    pattern = re.sub(r"[\[\]*?]", "?", remote) + "/**"
    try:
        (result,) = FileSystems.match([pattern])
    except BeamIOError as e:
        causes = "; ".join(_one_line(v) for v in (getattr(e, "exception_details", None) or {}).values())
        raise ModelPathError(f"{remote}: cannot list the model directory ({causes or _one_line(e)})") from e
    except ValueError as e:  # e.g. an unknown scheme or a malformed bucket name
        raise ModelPathError(f"{remote}: {_one_line(e)}") from e
    prefix = remote + "/"
    manifest: dict[str, list] = {}
    for meta in result.metadata_list:
        if not meta.path.startswith(prefix) or meta.path.endswith("/"):
            continue  # "directory" placeholder objects
        rel = meta.path[len(prefix):]
        if rel.startswith("/") or ".." in rel.split("/"):
            raise ModelPathError(f"{remote}: unsafe object name {meta.path!r}")
        manifest[rel] = [int(meta.size_in_bytes), meta.last_updated_in_seconds]
    if not manifest:
        raise ModelPathError(f"{remote} has no files (expected a Hugging Face model directory)")
    if not any(m in manifest for m in DIRECTORY_MARKERS):
        raise ModelPathError(f"{remote} has no config.json (nor tokenizer_config.json): not a model dir")
    return manifest


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def _locked(lock_path: str):
    # Each call opens its own file description, so flock also excludes other threads of this process.
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _is_complete(dest: str, manifest: dict[str, list]) -> bool:
    """The marker records exactly this remote manifest and every local file has the remote size."""
    try:
        with open(os.path.join(dest, MARKER)) as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        return False
    if recorded.get("files") != manifest:
        _LOGGER.warning("Model cache %s is outdated or was written for other files; copying again", dest)
        return False
    for rel, (size, _) in manifest.items():
        try:
            if os.path.getsize(os.path.join(dest, rel)) != size:
                _LOGGER.warning("Model cache %s: %s has the wrong size; copying again", dest, rel)
                return False
        except OSError:
            _LOGGER.warning("Model cache %s: %s is missing; copying again", dest, rel)
            return False
    return True


def _download(remote: str, manifest: dict[str, list], dest: str) -> None:
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    parent = os.path.dirname(dest)
    stem = f".tmp-{os.path.basename(dest)}-"
    # We hold the lock, so any temporary copy of this model is left over from a killed process.
    for name in os.listdir(parent):
        if name.startswith(stem):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    total = sum(size for size, _ in manifest.values())
    free = shutil.disk_usage(parent).free
    if free < total + _DISK_HEADROOM:
        # (an outdated copy stays until the new one is whole: a running copy of the pair may read it)
        stale = " beside the outdated copy there" if os.path.lexists(dest) else ""
        raise ModelPathError(
            f"{remote}: {total / 1e9:.1f} GB to copy and {_DISK_HEADROOM / 1e9:.1f} GB kept free, but "
            f"{free / 1e9:.1f} GB free in {parent}{stale} "
            f"(on Dataflow raise --disk_size_gb, or point {CACHE_ENV} at a larger disk)")
    tmp = os.path.join(parent, f"{stem}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    start = time.monotonic()

    def fetch(rel: str) -> None:
        local = os.path.join(tmp, *rel.split("/"))
        os.makedirs(os.path.dirname(local), exist_ok=True)
        # UNCOMPRESSED: AUTO would transparently gunzip a `*.gz` file and break the size check.
        with FileSystems.open(f"{remote}/{rel}", compression_type=CompressionTypes.UNCOMPRESSED) as src, \
                open(local, "wb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
        got, want = os.path.getsize(local), manifest[rel][0]
        if got != want:
            raise ModelPathError(f"{remote}/{rel}: copied {got} bytes but the object has {want}")

    try:
        os.makedirs(tmp)
        workers = max(1, min(_MAX_PARALLEL_DOWNLOADS, len(manifest)))
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="model-cache") as pool:
            for fut in [pool.submit(fetch, rel) for rel in sorted(manifest)]:
                fut.result()
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump({"source": remote, "files": manifest}, f)
            f.flush()
            os.fsync(f.fileno())
        if os.path.lexists(dest):  # an incomplete or outdated copy: move it aside, then replace it
            old = f"{tmp}.old"
            os.rename(dest, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, dest)
    except ModelPathError:
        raise
    except Exception as e:
        raise ModelPathError(f"{remote}: copy to {dest} failed: {_one_line(e)}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _LOGGER.info("Copied %s (%d files, %.1f MB) to %s in %.1f s", remote, len(manifest), total / 1e6, dest,
                 time.monotonic() - start)
