"""How long a run will take: each part's expected seconds, said before the run starts and counted down as it goes.

A part's figure (the rounds up front, each notebook) comes from its last timed run here, else the profile's last run
on record, else its `expected:` section, each saying which, since another CPU may be several times faster.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

ROUNDS = "rounds up front"
ROUNDS_STAMP_NAME = "rounds-up-front"  # stamped like a notebook (sdperf.store.stamps): <name>.run.json


@dataclass(frozen=True)
class Expected:
    """One part's expected seconds (None: no run of it on record) and where that figure comes from."""

    part: str
    seconds: float | None
    source: str
    kind: str = ""  # "here", or where the figure was taken (the profile's run on record, its CPU)


def _seconds(value) -> float | None:
    """A duration as written in a stamp or a profile: a finite number >= 0, else None (damaged is no figure)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _read(path: Path) -> dict | None:
    try:
        stamp = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) and _seconds(stamp.get("duration_s")) is not None else None


MEASURED_ON_CHARS = 160  # of a profile's expected.measured_on said per run: the note is for reading, not a log


def _kind(stamp: dict, machine: str, cpu_on_record: str) -> str:
    if stamp.get("machine") == machine:
        return "the last run here"
    return f"the profile's last run on record, on {cpu_on_record or 'another machine'}"


def _source(stamp: dict, machine: str, cpu_on_record: str) -> str:
    return f"{_kind(stamp, machine, cpu_on_record)} ({stamp.get('finished_utc', '?')})"


def _estimate_source(estimate: dict) -> str:
    said = str(estimate.get("measured_on", "?"))
    if len(said) > MEASURED_ON_CHARS:
        said = said[:MEASURED_ON_CHARS - 1] + "…"
    return f"the profile's estimate (measured on {said})"


def _estimate(estimate: dict | None, *path: str) -> float | None:
    value = estimate if isinstance(estimate, dict) else {}
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    return _seconds(value)


def notebook(stamp_path: Path, name: str, machine: str, cpu_on_record: str = "",
             estimate: dict | None = None) -> Expected:
    """Notebook `name`'s expected seconds from its stamp when that run completed ok, else from the `estimate`."""
    stamp = _read(stamp_path)
    if stamp is None or stamp.get("status") != "ok":
        seconds = _estimate(estimate, "notebooks_s", name)
        if seconds is not None:
            where = _estimate_source(estimate)
            return Expected(name, float(seconds), where, where)
        return Expected(name, None, "no complete run on record")
    return Expected(name, float(stamp["duration_s"]), _source(stamp, machine, cpu_on_record),
                    _kind(stamp, machine, cpu_on_record))


def rounds(stamp_path: Path, workers_left: int, machine: str, cpu_on_record: str = "",
           estimate: dict | None = None) -> Expected:
    """The rounds up front: seconds per worker of their last run (or estimate), times the workers still to launch."""
    stamp = _read(stamp_path)
    if workers_left <= 0:
        return Expected(ROUNDS, 0.0, "all measured already")
    workers = stamp.get("workers") if stamp is not None else None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers <= 0:
        per = _estimate(estimate, "rounds_per_worker_s")
        if per is not None:
            where = _estimate_source(estimate)
            return Expected(ROUNDS, float(per) * workers_left,
                            f"{float(per):.0f} s per worker x {workers_left}, {where}", where)
        return Expected(ROUNDS, None, "no run on record")
    per = float(stamp["duration_s"]) / workers
    return Expected(ROUNDS, per * workers_left,
                    f"{per:.0f} s per worker x {workers_left}, {_source(stamp, machine, cpu_on_record)}",
                    _kind(stamp, machine, cpu_on_record))


def minutes(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def plan_text(parts: list[Expected]) -> str:
    """The line `sdperf run` prints first: the expected time, what it rests on, and the parts with no run on record."""
    if not parts:  # every selected notebook is up to date: the run only rebuilds the page
        return "expected time: none: every selected notebook already ran for this commit (--force measures again)"
    known = [p for p in parts if p.seconds is not None]
    unknown = [p.part for p in parts if p.seconds is None]
    total = sum(p.seconds for p in known)
    if not known:
        return ("expected time: unknown (no run of these parts on record here or in the profile's report, and no "
                "estimate in the profile)")
    sources = sorted({p.kind for p in known if p.kind})
    head = f"expected time: {'at least ' if unknown else 'about '}{minutes(total)}"
    tail = f"; from {', '.join(sources)}" if sources else ""
    return head + tail + (f"; no run on record of {', '.join(unknown)}" if unknown else "")


def left(parts: list[Expected], done: set[str]) -> float | None:
    """Expected seconds of the parts not yet done (None when one of them has no run on record)."""
    rest = [p.seconds for p in parts if p.part not in done]
    return None if any(s is None for s in rest) else float(sum(rest))
