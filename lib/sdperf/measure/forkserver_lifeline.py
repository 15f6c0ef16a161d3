"""Imported first by the fork server (rounds.PRELOAD): the server dies with the process that started it. It acts
only inside a fork server whose launcher named itself in SDPERF_LAUNCHER_PID; anywhere else it does nothing."""
from __future__ import annotations

import os
import sys

from sdperf.measure import lifeline


def _in_forkserver() -> bool:
    """multiprocessing starts its fork server as `python -c 'from multiprocessing.forkserver import main; ...'`."""
    return sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules


_launcher = os.environ.get(lifeline.LAUNCHER_ENV, "")
if _in_forkserver() and _launcher.isdigit():
    lifeline.die_with_parent(int(_launcher))
