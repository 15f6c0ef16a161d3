"""A notebook's run stamp and running marker under reports/<profile>/notebooks/: its last complete run (commit,
checksums, status, times, error), and whether a later run of it was killed; written by the runner, read by the report.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

from sdperf.core import environment, paths
from sdperf.store import staging
from sdperf.store.verified import digest as sha256_file

OK, FAILED, SKIPPED = "ok", "failed", "skipped"


def outputs_dir(profile: str) -> Path:
    return paths.profile_reports(profile) / "notebooks"


def stamp_path(profile: str, name: str) -> Path:
    return outputs_dir(profile) / f"{name}.run.json"


def read_stamp(profile: str, name: str) -> dict | None:
    try:
        return json.loads(stamp_path(profile, name).read_text())
    except (OSError, ValueError):
        return None


def fingerprint(profile: str, notebook: Path, commit: str, machine: str | None = None) -> dict:
    """What must be unchanged for an earlier run to stand for this one: the code, notebook, profile and machine."""
    return {"commit": commit, "profile": profile, "notebook_sha256": sha256_file(notebook),
            "profile_sha256": sha256_file(paths.params_dir() / f"{profile}.yml"),
            "machine": machine or environment.fingerprint()}


def is_clean_commit(commit: str) -> bool:
    """A dirty or unknown tree cannot vouch for which code produced the earlier outputs."""
    return bool(commit) and commit != "unknown" and not commit.endswith("-dirty")


def should_skip(stamp: dict | None, current: dict) -> bool:
    if not stamp or stamp.get("status") != OK or not is_clean_commit(current["commit"]):
        return False
    return all(stamp.get(k) == v for k, v in current.items())


def _utc(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_stamp(profile: str, name: str, current: dict, status: str, started: float, finished: float,
                failure: dict | None = None) -> None:
    from sdperf.store.results import atomic_write_text

    stamp = {"notebook": name, **current, "status": status, "run_id": environment.run_id(),
             "started_utc": _utc(started), "finished_utc": _utc(finished), "duration_s": round(finished - started, 3)}
    if failure:
        stamp["error"] = failure
    atomic_write_text(stamp_path(profile, name), json.dumps(stamp, indent=2) + "\n")


def running_path(profile: str, name: str) -> Path:
    """Present while a run of the notebook is under way and left behind when it is killed, so the next run redoes it."""
    return outputs_dir(profile) / f"{name}.running.json"


def mark_running(profile: str, name: str, started: float) -> None:
    from sdperf.store.results import atomic_write_text

    marker = {"notebook": name, "run_id": environment.run_id(), "pid": os.getpid(), "started_utc": _utc(started)}
    atomic_write_text(running_path(profile, name), json.dumps(marker, indent=2) + "\n")


def read_running(profile: str, name: str) -> dict | None:
    try:
        marker = json.loads(running_path(profile, name).read_text())
    except (OSError, ValueError):
        return {} if running_path(profile, name).exists() else None
    return marker if isinstance(marker, dict) else {}


def interrupted(profile: str, name: str) -> dict | None:
    """The marker of a killed run of `name`: any marker but that of the run holding the profile's run lock now."""
    marker = read_running(profile, name)
    if marker is None:
        return None
    live = staging.running_run(profile)
    return marker if live is None or marker.get("run_id") != live else None
