"""Test-only: a reader started with this folder on ``PYTHONPATH`` and ``PGCDC_CHUNK_PAUSE_S``
set holds each incremental snapshot chunk's window open that many seconds after its low
watermark, before the chunk's rows are read. Writers running beside it then change rows
inside every window, so a chunk's rows giving way to the streamed changes happens for
certain rather than by chance (on a busy machine the writers may all but stop for the
few milliseconds a window lasts). Only the moment is chosen: the watermarks, the read and
the merge are the reader's own.

The process prints ``chunk pause: <s> s after each low watermark`` to stderr first, so the
test can tell that the pause it asked for is in place.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

_PAUSE = os.environ.get("PGCDC_CHUNK_PAUSE_S")

if _PAUSE:
    from cdc.incremental import worker

    _seconds = float(_PAUSE)
    _emit = worker._emit

    def _emit_then_pause(conn: Any, content: bytes) -> Any:
        written = _emit(conn, content)
        if content.endswith(b":low"):
            time.sleep(_seconds)
        return written

    worker._emit = _emit_then_pause
    sys.stderr.write(f"chunk pause: {_seconds} s after each low watermark\n")
    sys.stderr.flush()
