"""Did anything else take the CPUs while a configuration was timed? Measured, and a busy machine refused or marked.

torch's OpenMP threads spin against any other load, and the twin is slowed alike, so the noise band cannot see it.
A worker's `contention` is what others took of its CPUs (/proc/stat less its own CPU time, plus steal) over its
timed calls; one over the share (SHARE_ENV) is measured again once the machine is quiet, then kept but marked.
"""
from __future__ import annotations

import contextlib
import math
import os
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sdperf.core.errors import ConfigError
from sdperf.core.held import exclusive

SHARE_ENV = "SDPERF_CONTENTION_SHARE"
DEFAULT_SHARE = 0.10  # of the CPUs' time over a worker's timed calls; a quiet 2-core VM measured under 0.03
MACHINE_LOCK_ENV = "SDPERF_MACHINE_LOCK"
QUIET_WAIT_S = 30.0  # how long a run waits for a busy machine to quiet down before it refuses or re-measures
BESIDE_LOAD = "MEASURED BESIDE OTHER LOAD"  # the mark in a row's note (the page counts such rows per notebook)
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def threshold() -> float:
    """SHARE_ENV as a share in (0, 1], else DEFAULT_SHARE; anything else is refused by name."""
    raw = os.environ.get(SHARE_ENV, "").strip()
    if not raw:
        return DEFAULT_SHARE
    try:
        share = float(raw)
    except ValueError:
        share = math.nan
    if not (0 < share <= 1):
        raise ConfigError(f"{SHARE_ENV}={raw!r} is not valid: set it to the share of the CPUs' time other processes "
                          f"may take while a configuration is timed, a number in (0, 1] (default {DEFAULT_SHARE})")
    return share


@dataclass(frozen=True)
class Sample:
    """Jiffies of the CPUs this process may use (busy, steal, all), its own CPU seconds, the monotonic clock."""

    busy: int
    steal: int
    total: int
    own_s: float
    at: float


def _cpus() -> set[int] | None:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def sample() -> Sample | None:
    """Now, or None where /proc/stat cannot be read (not Linux): then nothing is judged."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    mine, busy, steal, total = _cpus(), 0, 0, 0
    for line in lines:
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu" or (mine is not None and int(name[3:]) not in mine):
            continue
        v = dict(zip(_FIELDS, map(int, values)))
        busy += sum(v.get(k, 0) for k in ("user", "nice", "system", "irq", "softirq"))
        steal += v.get("steal", 0)
        total += sum(v.values())
    if total == 0:
        return None
    use = resource.getrusage(resource.RUSAGE_SELF)
    return Sample(busy, steal, total, use.ru_utime + use.ru_stime, time.monotonic())


def between(a: Sample | None, b: Sample | None) -> dict | None:
    """What others took between two samples of this process: {others_share, steal_share, share, window_s}."""
    if a is None or b is None or b.total <= a.total:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    capacity = (b.total - a.total) / hz
    others = max(0.0, (b.busy - a.busy) / hz - (b.own_s - a.own_s))
    steal = (b.steal - a.steal) / hz
    return {"others_share": others / capacity, "steal_share": steal / capacity,
            "share": min(1.0, (others + steal) / capacity), "window_s": b.at - a.at}


def contended(taken: dict | None, share: float | None = None) -> bool:
    return bool(taken) and taken.get("share", 0.0) > (threshold() if share is None else share)


def words(taken: dict, when: str = "while it was timed") -> str:
    """What others took in words: a worker's over its timed calls (a row's note), or the machine's `when`."""
    steal = f", the hypervisor {taken['steal_share']:.0%}" if taken.get("steal_share", 0) >= 0.005 else ""
    return f"other processes took {taken['others_share']:.0%} of its CPUs' time {when}{steal}"


def machine_now(seconds: float = 1.0) -> dict | None:
    """The machine's contention over `seconds` of this (sleeping) process: what every other process takes now."""
    a = sample()
    time.sleep(seconds)
    return between(a, sample())


def busiest(seconds: float = 1.0, top: int = 3) -> list[str]:
    """The processes that took the most CPU over `seconds`: 'pid 123 python3 (98%)'."""
    def times() -> dict[int, tuple[str, int]]:
        out = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                text = stat.read_text()
                name = text[text.index("(") + 1:text.rindex(")")]
                fields = text[text.rindex(")") + 2:].split()
                out[int(stat.parent.name)] = (name, int(fields[11]) + int(fields[12]))
        return out

    before = times()
    time.sleep(seconds)
    after = times()
    hz, me = os.sysconf("SC_CLK_TCK"), os.getpid()
    used = sorted(((t - before[p][1]) / hz / seconds, p, name) for p, (name, t) in after.items()
                  if p in before and p != me)
    return [f"pid {p} {name} ({u:.0%} of a CPU)" for u, p, name in reversed(used[-top:]) if u >= 0.05]


def wait_quiet(limit_s: float | None = None, say=None) -> dict | None:
    """Sample the machine until it is quiet, for at most `limit_s` (QUIET_WAIT_S); the last sample (None: share 1)."""
    if threshold() >= 1:
        return None
    deadline = time.monotonic() + (QUIET_WAIT_S if limit_s is None else limit_s)
    taken = machine_now()
    while contended(taken) and time.monotonic() < deadline:
        if say is not None:
            say(f"  waiting for a quiet machine: {words(taken)}")
        taken = machine_now()
    return taken


def lock_path() -> Path:
    return Path(os.environ.get(MACHINE_LOCK_ENV) or Path(tempfile.gettempdir()) / "sdperf-machine.lock")


@contextlib.contextmanager
def machine_lock(what: str):
    """Held by every `sdperf run`: a second one on the machine fails at once, naming the one that holds it."""
    path = lock_path()
    try:
        fh = open(path, "a+", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"the machine-wide run lock {str(path)!r} cannot be opened ({exc.strerror}); set "
                          f"{MACHINE_LOCK_ENV} to a writable file") from None
    fh.close()
    with contextlib.suppress(OSError):
        os.chmod(path, 0o666)  # every user's runs share it
    with exclusive(path, f"pid {os.getpid()}, {what}",
                   lambda holder: ConfigError(f"another `sdperf run` is measuring on this machine ({holder}; lock "
                                              f"{str(path)!r}): two runs at once time each other's load, so one "
                                              "waits; let it finish or stop it")):
        yield
