"""Did anything else take the CPUs while a configuration was timed? Measured, and a busy machine refused or marked.

Why. torch's OpenMP threads spin against any other load: with one other busy core on a 2-core machine, fp32 eager
took 12.9 s per image against 0.165 s quiet (78x), an engine 8.6x, and the ratio of the two read 38x where the
quiet machine says 1.16x; the twin's noise band cannot see it, since the twin is slowed alike. So:

- every worker samples /proc/stat over its timed calls (only the CPUs it may run on: a pytest worker pinned to one
  core is not disturbed by its neighbour on the other) and takes away its own CPU time (getrusage, every thread):
  what is left is what other processes took, and the steal column what the hypervisor gave to other guests. Their
  sum, as a share of the CPUs' time over the window, is the worker's `contention`;
- a worker over the share (SHARE_ENV, default DEFAULT_SHARE) is measured again once the machine is quiet
  (sdperf.measure.rounds), and a result still over it is kept but marked, in its rows' notes and on the page;
- `sdperf run` samples the machine before it starts and refuses a busy one, naming the busiest processes, and
  takes a machine-wide lock (MACHINE_LOCK_ENV, any profile and any reports folder): two runs at once slowed each
  other 7x at rc 0.
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
    """Jiffies of the CPUs this process may use (busy: user, nice, system, irq, softirq; steal; all), this
    process's own CPU seconds, and the monotonic clock."""

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
    """Whether a worker's `contention` is over the share others may take."""
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
    """Sample the machine each second until others take no more than the share, for at most `limit_s` (default
    QUIET_WAIT_S); returns the last sample (contended when the machine never quieted). With a share of 1 nothing
    can be contended, and nothing is sampled."""
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
    """One lock for the whole machine, whatever profile or reports folder: MACHINE_LOCK_ENV, else a file in the
    system's temp folder."""
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
