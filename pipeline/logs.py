"""Logging for the command-line entry points: our progress lines, not Beam's internals."""

from __future__ import annotations

import logging


def _not_an_interrupt(record: logging.LogRecord) -> bool:
    """Beam logs a failed bundle's traceback as it fails; Ctrl-C's is said by the launcher's one line."""
    return not (record.exc_info and record.exc_info[0] and issubclass(record.exc_info[0], KeyboardInterrupt))


def setup_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apache_beam.runners.common").addFilter(_not_an_interrupt)  # (once, however often called)
    for name in ("pipeline", "transforms", "specdec_core", "__main__"):
        logging.getLogger(name).setLevel(logging.INFO)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-shard bars on every model load drown the job's own lines
