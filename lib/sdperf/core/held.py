"""A lock a second holder is refused at once: an flock on a file naming its holder, released when the holder ends."""
from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Callable


@contextlib.contextmanager
def exclusive(path: Path, holder: str, refusal: Callable[[str], Exception]):
    """Hold the lock at `path`, written with `holder`; if held elsewhere raise `refusal(what its holder wrote)`."""
    fh = open(path, "a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            raise refusal(fh.read().strip() or "another process") from None
        fh.seek(0)
        fh.truncate()
        fh.write(holder)
        fh.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()
