"""Ending a worker process that can decode no row any more, instead of failing every row it takes."""

from __future__ import annotations

import logging
import os

WORKER_LOST = 75  # the exit status (EX_TEMPFAIL: try again)


def end_worker(e: Exception) -> None:
    """Ends this process: its GPU fails every call since an error CUDA keeps (`DeviceLost`), or
    every copy of the pair is gone (`PairGone`), so each row it took would fail at once and the
    rest of the input would drain into failed rows. Dataflow starts the process again on a
    working device and retries its rows; a local job stops, its committed rows kept."""
    logging.getLogger(__name__).critical(
        "%s: %s: this worker process ends (exit status %d) so that it starts again with a working device; "
        "its rows are retried (a local job stops here: rerun it with --resume_from)", type(e).__name__, e, WORKER_LOST)
    logging.shutdown()
    os._exit(WORKER_LOST)
