"""Logging for the command-line entry points: our progress lines, not Beam's internals."""

from __future__ import annotations

import logging


def setup_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("pipeline", "transforms", "specdec_core", "__main__"):
        logging.getLogger(name).setLevel(logging.INFO)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-shard bars on every model load drown the job's own lines
