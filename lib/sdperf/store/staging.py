"""A notebook's outputs become current only when its run completes.

`sdperf run` executes each notebook with SDPERF_STAGE naming it: the notebook's results rows and figures go to
reports/<P>/.staging/<run id>/ instead of results.csv and figures/, and the notebook reads its own staged rows in
place of its earlier ones (10 and 12 read their own rows while they run). When the notebook finishes,
`sdperf.store.results.promote_rows` and `promote_figures` swap them in; when it fails or is interrupted, `discard` drops
them and the previous complete results stand as they were. A run killed outright (SIGKILL, a lost machine) leaves
its staging folder and hidden temp files behind; the next `sdperf run` of the profile removes them before it starts
(`clean_leftovers`), under the profile's run lock, so no live run's files are touched.

A notebook opened alone (JupyterLab, papermill, nbval) has no SDPERF_STAGE and writes results.csv directly.
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
    """Whether `notebook` runs under `sdperf run`, so that its outputs are staged."""
    return os.environ.get(STAGE_ENV) == notebook


def folder(profile: str, run_id: str) -> Path:
    return profile_reports(profile) / STAGING / run_id


def rows_path(profile: str, notebook: str, run_id: str) -> Path:
    return folder(profile, run_id) / f"{notebook}.csv"


def figures_path(profile: str, run_id: str) -> Path:
    return folder(profile, run_id) / "figures"


def figure_dir(profile: str, notebook: str, run_id: str) -> Path:
    """Where `notebook` saves its figures now: staged under `sdperf run`, else the report's figures/."""
    return figures_path(profile, run_id) if active(notebook) else figures_dir(profile)


def promote_figures(profile: str, notebook: str, run_id: str) -> int:
    """Move the run's figures of `notebook` (every `<notebook>__*` file: PNG, SVG and caption) into figures/ and
    delete its files the run no longer drew, so a figure and its caption come and go together."""
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
    """Drop what an unfinished run of `notebook` staged: its rows and its figures with their captions."""
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
    """Remove what killed runs left: every staging folder, the hidden partial notebooks and stamp or HTML temp files
    in notebooks/ (only a run writes there), and temp files of atomic writes in the report's folder and figures/
    older than STALE_TEMP_S (a notebook opened alone may be writing one now). Call with the run lock held.
    Returns what was removed, relative to the report's folder."""
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
    """paths.sibling_tempfile's names: '.<target name>.<random><suffix>', never a lock or the staging folder, and
    a file of its own (a link named like one is not followed: `is_file` would)."""
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
    """The id of the `sdperf run` of the profile under way now (it holds the run lock), else None: a notebook's
    'running' marker of any other run is one that was killed."""
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
