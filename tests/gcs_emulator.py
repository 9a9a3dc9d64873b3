"""A local, in-memory GCS (gcp-storage-emulator) for tests: no network, no credentials.

Usage in a test module::

    @pytest.fixture(scope="module")
    def gcs():
        with gcs_emulator.running() as emu:
            yield emu

`emu.bucket(name)` creates a bucket, `emu.upload_dir(local, "gs://b/p")` / `emu.upload_file(...)` copy
files in, `emu.list("gs://b/p")` lists object names.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _split(gs_path: str) -> tuple[str, str]:
    assert gs_path.startswith("gs://"), gs_path
    bucket, _, name = gs_path[len("gs://"):].partition("/")
    return bucket, name


class Emulator:
    def __init__(self, host: str):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        self.host = host
        self.client = storage.Client(project="test-project", credentials=AnonymousCredentials())

    def bucket(self, name: str):
        from google.api_core.exceptions import Conflict

        try:
            return self.client.create_bucket(name)
        except Conflict:
            return self.client.bucket(name)

    def upload_file(self, local: str | os.PathLike, gs_path: str) -> None:
        bucket, name = _split(gs_path)
        self.client.bucket(bucket).blob(name).upload_from_filename(str(local))

    def upload_dir(self, local: str | os.PathLike, gs_prefix: str) -> list[str]:
        root = Path(local)
        names = []
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            dst = f"{gs_prefix.rstrip('/')}/{f.relative_to(root).as_posix()}"
            self.upload_file(f, dst)
            names.append(dst)
        return names

    def list(self, gs_prefix: str) -> list[str]:
        bucket, name = _split(gs_prefix)
        return sorted(f"gs://{bucket}/{b.name}" for b in self.client.list_blobs(bucket, prefix=name))

    def download(self, gs_path: str) -> bytes:
        bucket, name = _split(gs_path)
        return self.client.bucket(bucket).blob(name).download_as_bytes()


@contextlib.contextmanager
def running(startup_timeout_s: float = 30.0):
    """Start the emulator on a free port; point google-cloud-storage (and so Beam's gcsio) at it.

    Sets STORAGE_EMULATOR_HOST for this process (and any child it starts) and short-circuits
    Beam's credential lookup, restoring both on exit.
    """
    port = free_port()
    host = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port),
         "--in-memory", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    old_env = os.environ.get("STORAGE_EMULATOR_HOST")
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gcp-storage-emulator exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                urllib.request.urlopen(f"{host}/storage/v1/b", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gcp-storage-emulator did not answer on {host}") from None
                time.sleep(0.1)
        os.environ["STORAGE_EMULATOR_HOST"] = host
        with no_beam_credential_lookup():
            yield Emulator(host)
    finally:
        if old_env is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old_env
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@contextlib.contextmanager
def no_beam_credential_lookup():
    """Make Beam's GCS client anonymous at once.

    Without this, Beam (apache_beam/internal/gcp/auth.py) looks for Application Default
    Credentials with exponential back-off (~25 s) before it "connects anonymously". Marking its
    credential cache as initialised with `None` (a private API, Beam 2.77) skips the lookup; gcsio then
    builds `storage.Client.create_anonymous_client()`, which honours STORAGE_EMULATOR_HOST.
    It only reaches this process: run emulator pipelines in_memory, not multi_processing.
    """
    from apache_beam.internal.gcp import auth

    saved = auth._Credentials._credentials_init, auth._Credentials._credentials
    auth._Credentials._credentials_init, auth._Credentials._credentials = True, None
    try:
        yield
    finally:
        auth._Credentials._credentials_init, auth._Credentials._credentials = saved
