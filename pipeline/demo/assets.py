"""The committed demo pair (``pipeline/demo/pair/``) and its prompts, checked by hash before use."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ASSETS = Path(__file__).with_name("pair")
MANIFEST = "MANIFEST.json"
PROMPTS = "prompts.parquet"


class DemoSetupError(RuntimeError):
    """A problem the user must fix (damaged assets, unwritable directory), as one line."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(assets: Path = ASSETS) -> dict:
    try:
        return json.loads((assets / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise DemoSetupError(f"{assets / MANIFEST}: cannot read the demo pair's manifest ({e}); restore it "
                             "from git or rebuild with `python -m pipeline.demo.models --retrain`") from None


def verify_assets(assets: Path = ASSETS) -> dict:
    """The manifest, once every file it lists has its recorded SHA-256; else a one-line error."""
    manifest = read_manifest(assets)
    for rel, digest in sorted(manifest["files"].items()):
        path = assets / rel
        if not path.is_file():
            problem = "is missing"
        elif sha256_of(path) != digest:
            problem = "does not match its recorded SHA-256 (damaged or changed)"
        else:
            continue
        raise DemoSetupError(f"demo pair file {path} {problem}; restore it (git checkout -- {assets}) "
                             f"or rebuild the pair with `python -m pipeline.demo.models --retrain`")
    return manifest


def demo_pair_dirs(assets: Path = ASSETS) -> tuple[Path, Path]:
    """(target dir, draft dir): ordinary Hugging Face directories, verified."""
    verify_assets(assets)
    return assets / "target", assets / "draft"


def demo_prompt_rows(assets: Path = ASSETS) -> list[dict]:
    """The committed demo prompts: id, prompt (English), reference (German), items."""
    import pyarrow.parquet as pq

    return pq.read_table(assets / PROMPTS).to_pylist()
