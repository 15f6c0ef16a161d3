"""A notebook's outputs become current only when its run completes.

Under `sdperf run` (SDPERF_STAGE naming the notebook) its rows and figures go to reports/<P>/.staging/<run id>/, to
be promoted when it completes or discarded; a notebook opened alone writes results.csv directly.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from sdperf.core.errors import ConfigError
from sdperf.core.held import exclusive
from sdperf.core.paths import figures_dir, profile_reports, remove_owned, unsafe_folder

STAGE_ENV = "SDPERF_STAGE"
STAGING = ".staging"
RUN_LOCK = ".run.lock"
STALE_TEMP_S = 60.0  # a temp file of an atomic write lives milliseconds; one older than this belongs to a dead run


def active(notebook: str) -> bool:
    return os.environ.get(STAGE_ENV) == notebook


def folder(profile: str, run_id: str) -> Path:
    return profile_reports(profile) / STAGING / run_id


def rows_path(profile: str, notebook: str, run_id: str) -> Path:
    return folder(profile, run_id) / f"{notebook}.csv"


def figures_path(profile: str, run_id: str) -> Path:
    return folder(profile, run_id) / "figures"


def figure_dir(profile: str, notebook: str, run_id: str) -> Path:
    return figures_path(profile, run_id) if active(notebook) else figures_dir(profile)


def promote_figures(profile: str, notebook: str, run_id: str) -> int:
    """Move the run's `<notebook>__*` files (PNG, SVG, caption) into figures/ and delete those it no longer drew."""
    staged = figures_path(profile, run_id)
    new = sorted(staged.glob(f"{notebook}__*")) if staged.is_dir() else []
    final = figures_dir(profile)
    final.mkdir(parents=True, exist_ok=True)
    names = {p.name for p in new}
    for old in final.glob(f"{notebook}__*"):
        if old.name not in names:
            old.unlink(missing_ok=True)
    for path in new:
        os.replace(path, final / path.name)
    return len(new)


def discard(profile: str, notebook: str, run_id: str) -> None:
    rows = rows_path(profile, notebook, run_id)
    for path in (rows, rows.with_name(rows.name + ".lock")):
        path.unlink(missing_ok=True)
    staged = figures_path(profile, run_id)
    if staged.is_dir():
        for path in staged.glob(f"{notebook}__*"):
            path.unlink(missing_ok=True)


def remove_run(profile: str, run_id: str) -> None:
    """The run's staging folder, once every notebook of it is promoted or discarded (nothing through a link)."""
    path = folder(profile, run_id)
    if unsafe_folder(path.parent) is None:
        remove_owned(path)


def clean_leftovers(profile: str, now: float | None = None) -> list[str]:
    """Remove what killed runs left (temp files outside notebooks/ only past STALE_TEMP_S); call under the run lock."""
    root = profile_reports(profile)
    removed = []
    staging = root / STAGING
    subs = [(root, STALE_TEMP_S), (root / "notebooks", 0.0), (figures_dir(profile), STALE_TEMP_S)]
    refused = [why for f in [staging] + [s for s, _ in subs] if (f.exists() or f.is_symlink())
               and (why := unsafe_folder(f)) is not None]
    if refused:  # before anything is removed, and before a new run stages its rows through the link
        raise ConfigError(f"sdperf cleans and writes only real folders inside the reports folder, and {refused[0]}; "
                          "nothing was removed: replace the link with a folder (or point $SDPERF_REPORTS_DIR at "
                          "the other disk) and run again")
    if staging.is_dir():
        for path in sorted(staging.iterdir()):
            if path.is_dir() or path.is_symlink():  # run folders (a link: itself, never what it points to)
                remove_owned(path)
                removed.append(str(path.relative_to(root)))
    now = time.time() if now is None else now
    for sub, min_age in subs:
        if not sub.is_dir():
            continue
        for path in sorted(sub.iterdir()):
            if _is_temp(path) and now - _mtime(path) >= min_age:
                path.unlink(missing_ok=True)
                removed.append(str(path.relative_to(root)))
    return removed


def _is_temp(path: Path) -> bool:
    """paths.sibling_tempfile's names ('.<target name>.<random><suffix>'), a file, not a link, lock or staging."""
    name = path.name
    return (not path.is_symlink() and path.is_file() and name.startswith(".") and name.count(".") >= 2
            and not name.endswith(".lock") and name not in (RUN_LOCK, STAGING))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")


@contextlib.contextmanager
def run_lock(profile: str, run_id: str):
    """One `sdperf run` per profile at a time: a second one fails at once, naming the process that holds it."""
    root = profile_reports(profile)
    root.mkdir(parents=True, exist_ok=True)
    path = root / RUN_LOCK
    with exclusive(path, f"pid {os.getpid()} run {run_id}",
                   lambda holder: ConfigError(f"another `sdperf run --profile {profile}` is running ({holder}; lock "
                                              f"{str(path)!r}); wait for it to finish or stop it")):
        yield


def running_run(profile: str) -> str | None:
    """The id of the profile's `sdperf run` under way now (holding the run lock), else None."""
    path = profile_reports(profile) / RUN_LOCK
    if not path.is_file():
        return None
    with open(path, "a+", encoding="utf-8") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().split(" run ")
            return holder[1].strip() if len(holder) == 2 else "unknown"
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None
