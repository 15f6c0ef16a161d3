"""Runs the study's notebooks for one profile: validate, execute with papermill, stamp, convert, index.

Heavy libraries are imported inside the functions that need them: a bad profile or name fails before that cost.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sdperf.config.profiles import Profile, load_profile
from sdperf.core import environment, paths
from sdperf.core.errors import ConfigError
from sdperf.measure import ledger as ledgers
from sdperf.measure.worker import LOG_ENV
from sdperf.optimizations import catalog
from sdperf.run import eta
from sdperf.run.plan import check_notebook_parameters, check_sections, notebook_names, notebook_parameters, select
from sdperf.store import staging
from sdperf.store.stamps import (FAILED, OK, SKIPPED, fingerprint, mark_running, outputs_dir, read_running,
                                 read_stamp, running_path, should_skip, stamp_path, write_stamp)

KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL"]  # the kernel's own log: else TCP warnings, closing tracebacks
INJECTED_TAG = "injected-parameters"  # papermill's tag on the cell it adds after the `parameters` cell
ERROR_MARKER_TAG = "papermill-error-cell-tag"  # papermill's tag on the red banner cells it adds on failure


@dataclass
class Outcome:
    """What happened to one notebook in this run; `failure` is the stamp's error record when it failed."""

    name: str
    status: str
    seconds: float = 0.0
    failure: dict | None = None


def validate(profile_name: str | None, only: list[str] | None,
             notebooks_dir: Path | None = None) -> tuple[Profile, list[str]]:
    """Cheap checks first (folders, YAML, names, results table, notebook parameters, memory cap), then the device."""
    from sdperf.measure import memory
    from sdperf.store.results import check_results

    paths.resolve_env()  # before any kernel starts: it inherits the absolute folders validated here
    profile = load_profile(profile_name, check_runtime=False)
    check_sections(profile)
    check_outputs(profile.name)
    check_results(profile.name)
    check_weights_manifest(profile)
    memory.cap_bytes()  # a bad SDPERF_MEMORY_CAP_MIB fails here, naming it, not in the first notebook's preflight
    selected = select(only, notebook_names(notebooks_dir))
    check_notebook_parameters(profile, selected, notebooks_dir)
    from sdperf.optimizations import artefacts  # imports torch: after the cheap checks

    artefacts.cache_gib()  # a bad SDPERF_ENGINE_CACHE_GIB fails here, not after the doctor
    return load_profile(profile.name), selected


def check_weights_manifest(profile: Profile) -> None:
    """A local `weights:` folder with a manifest.json is verified before the first notebook, not inside it."""
    if not profile.weights:
        return
    from sdperf.config.profiles import weights_source
    from sdperf.refmodel.manifest import verify_weights

    verify_weights(*weights_source(profile.weights))


def check_outputs(profile: str) -> None:
    """The folders a run writes into can be written: a read-only one, or a file there, fails before hours of work."""
    root = paths.profile_reports(profile)
    for folder in (root, outputs_dir(profile), paths.figures_dir(profile)):
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"{str(folder)!r} is not a folder, but the run writes its reports there; remove it or "
                              f"set SDPERF_REPORTS_DIR to another folder")
        existing = paths.blocking(folder)
        if existing is not None:
            raise ConfigError(f"{str(folder)!r} cannot be written ({str(existing)!r} is not a writable folder); "
                              "make it writable or set SDPERF_REPORTS_DIR to another folder")


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _source_index(cells, index: int) -> int:
    """papermill counts its injected-parameters cell; the user's notebooks/<name>.ipynb does not have it."""
    return index - sum(INJECTED_TAG in _tags(c) for c in cells[:index])


def _read_partial(path: Path):
    import nbformat

    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception:  # an empty or half-written file: nothing to point at
        return None
    nb.cells = [c for c in nb.cells if ERROR_MARKER_TAG not in _tags(c)]
    return nb


def _last_started(cells) -> int | None:
    """On a timeout or kernel death papermill marks no cell as failed; the last one started is the culprit."""
    started = [i for i, c in enumerate(cells) if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    return started[-1] if started else None


def describe_failure(exc: BaseException, partial: Path) -> dict:
    """Where and why a notebook stopped, as indices into the source notebook."""
    from papermill.exceptions import PapermillExecutionError

    nb = _read_partial(partial)
    cells = nb.cells if nb is not None else []
    if isinstance(exc, PapermillExecutionError):
        index, ename, evalue = exc.cell_index, exc.ename, exc.evalue
    else:
        index, ename, evalue = _last_started(cells), type(exc).__name__, str(exc)
    exec_count = cells[index].get("execution_count") if index is not None and index < len(cells) else None
    return {"cell_index": None if index is None else _source_index(cells, index), "exec_count": exec_count,
            "ename": ename, "evalue": (str(evalue).strip().splitlines() or [""])[0]}


def watched_kernel_manager(log: Path | None = None):
    """(a kernel manager class dying with this process and logging to `log`, the kernel processes it launched)."""
    from jupyter_client import AsyncKernelManager

    from sdperf.measure import lifeline

    launched: list = []

    class WatchedKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            kw.setdefault("preexec_fn", lifeline.preexec(os.getpid()))
            with open(log, "ab") if log is not None else contextlib.nullcontext() as fh:  # the child keeps a copy
                if fh is not None:
                    kw.setdefault("stdout", fh)
                    kw.setdefault("stderr", fh)
                await super()._async_launch_kernel(kernel_cmd, **kw)
            launched.append(getattr(self.provisioner, "process", None))

    return WatchedKernelManager, launched


def kernel_died(failure: dict, process, oom_before: int | None) -> dict:
    """A dead kernel's failure record completed with why (lifeline.death_cause), in `evalue` and `kernel_exit`."""
    from sdperf.measure import lifeline

    if process is None or ("dead" not in failure["ename"].lower() and "died" not in failure["evalue"].lower()):
        return failure
    code = process.poll()
    if code is None:  # still running: its death was a lost heartbeat, not an exit
        return failure
    cause = lifeline.death_cause(code, process.pid, oom_before)
    return {**failure, "kernel_exit": cause, "evalue": f"{failure['evalue'].rstrip('.')}: kernel pid {process.pid} "
            f"ended by {cause}"}


def failure_line(name: str, failure: dict) -> str:
    where = f"cell {failure['cell_index']} " if failure.get("cell_index") is not None else ""
    return f"FAILED {name}: {where}({failure['ename']}: {failure['evalue']}); console output in {name}.log"


def _settle(tmp: Path, dest: Path) -> None:
    """Move the temp output onto its final name in one rename; an empty temp means nothing ran."""
    if tmp.exists() and tmp.stat().st_size:
        os.replace(tmp, dest)
    else:
        tmp.unlink(missing_ok=True)


def _remove(*files: Path) -> None:
    for f in files:
        f.unlink(missing_ok=True)


def execute(notebook: Path, profile: Profile) -> dict | None:
    """Run one notebook; None on success, else the failure record. `<name>.ipynb` is always a complete run."""
    import papermill

    out = outputs_dir(profile.name)
    out.mkdir(parents=True, exist_ok=True)
    name = notebook.stem
    final, failed = out / f"{name}.ipynb", out / f"{name}.failed.ipynb"
    fd, tmp_name = paths.sibling_tempfile(out / name, suffix=".ipynb")
    os.close(fd)
    tmp = Path(tmp_name)
    from sdperf.measure import lifeline

    log = part_log(profile.name, name)
    manager, kernels = watched_kernel_manager(log)
    oom_before = lifeline.oom_kills()
    try:
        with logging_to(log):
            papermill.execute_notebook(
                str(notebook), str(tmp), parameters=notebook_parameters(profile, name), kernel_name="python3",
                execution_timeout=profile.cell_timeout_s, cwd=str(paths.REPO_ROOT), progress_bar=False,
                log_output=False, extra_arguments=KERNEL_ARGS, kernel_manager_class=manager)
    except Exception as exc:  # papermill errors, timeouts, dead kernels: all become a failed notebook
        failure = kernel_died(describe_failure(exc, tmp), kernels[-1] if kernels else None, oom_before)
        _settle(tmp, failed)
        _remove(final, out / f"{name}.html")
        return failure
    except BaseException:  # interrupted (Ctrl-C, SIGTERM): not a result; the earlier complete run stands
        tmp.unlink(missing_ok=True)
        raise
    _settle(tmp, final)
    _remove(failed, out / f"{name}.failed.html")
    return None


def up_to_date(notebook: Path, profile: Profile, commit: str, force: bool) -> bool:
    """Whether its stamp says ok for this commit, notebook and profile, and no later run of it was interrupted."""
    current = fingerprint(profile.name, notebook, commit, environment.fingerprint(profile.device))
    return not force and should_skip(read_stamp(profile.name, notebook.stem), current) \
        and (outputs_dir(profile.name) / f"{notebook.stem}.ipynb").is_file() \
        and read_running(profile.name, notebook.stem) is None


def run_one(notebook: Path, profile: Profile, commit: str, force: bool, say) -> Outcome:
    name = notebook.stem
    current = fingerprint(profile.name, notebook, commit, environment.fingerprint(profile.device))
    if up_to_date(notebook, profile, commit, force):
        say(f"skipped {name}: already run for commit {commit}")
        return Outcome(name, SKIPPED)
    from sdperf.store.results import promote_rows

    run = environment.run_id()
    started = time.time()
    mark_running(profile.name, name, started)
    os.environ[staging.STAGE_ENV] = name  # the kernel inherits it: rows and figures are staged (sdperf.store.staging)
    try:
        failure = execute(notebook, profile)
    except BaseException:  # interrupted: nothing of this run becomes current; the marker asks for a rerun
        staging.discard(profile.name, name, run)
        raise
    finally:
        os.environ.pop(staging.STAGE_ENV, None)
    finished = time.time()
    if failure:
        staging.discard(profile.name, name, run)
        say(failure_line(name, failure))
    else:  # rows and figures first: a kill before the stamp below leaves the marker, so the notebook runs again
        promote_rows(profile.name, name, staging.rows_path(profile.name, name, run))
        staging.promote_figures(profile.name, name, run)
    write_stamp(profile.name, name, current, FAILED if failure else OK, started, finished, failure)
    running_path(profile.name, name).unlink(missing_ok=True)
    return Outcome(name, FAILED if failure else OK, finished - started, failure)


def executed_copy(profile: str, name: str) -> Path | None:
    out = outputs_dir(profile)
    for candidate in (out / f"{name}.ipynb", out / f"{name}.failed.ipynb"):
        if candidate.is_file():
            return candidate
    return None


def to_html(ipynb: Path) -> Path:
    from nbconvert import HTMLExporter

    from sdperf.store.results import atomic_write_text

    body, _ = HTMLExporter(embed_images=True).from_filename(str(ipynb))
    html = ipynb.with_suffix(".html")
    atomic_write_text(html, body)
    return html


def _fresh(html: Path, ipynb: Path) -> bool:
    return html.is_file() and html.stat().st_mtime >= ipynb.stat().st_mtime


def convert(profile: str, outcomes: list[Outcome], say) -> bool:
    """HTML for everything run now and for skipped notebooks whose HTML is missing or stale; False if any failed."""
    ok = True
    for outcome in outcomes:
        ipynb = executed_copy(profile, outcome.name)
        if ipynb is None or (outcome.status == SKIPPED and _fresh(ipynb.with_suffix(".html"), ipynb)):
            continue
        try:
            to_html(ipynb)
        except Exception as exc:  # a broken HTML export must not hide the run's results
            say(f"HTML export of {ipynb.name} failed: {type(exc).__name__}: {exc}")
            ok = False
    return ok


def summary_table(outcomes: list[Outcome]) -> str:
    import pandas as pd

    if not outcomes:
        return "no notebooks selected"
    rows = [{"notebook": o.name, "status": o.status, "seconds": round(o.seconds, 1)} for o in outcomes]
    for row, o in zip(rows, outcomes):  # why a notebook failed (a dead kernel's signal, memory) stays in view
        if o.failure:
            row["why"] = f"{o.failure['ename']}: {o.failure['evalue']}"
    return pd.DataFrame(rows).fillna("").to_string(index=False)


def write_environment(profile: Profile, beside: dict | None = None) -> Path:
    """reports/<P>/environment.json: the machine's record, with what the run was told to measure `beside`."""
    from sdperf.store.results import atomic_write_text

    path = paths.profile_reports(profile.name) / "environment.json"
    record = {**environment.record(profile.name, profile.device, catalog.packages()), **(beside or {})}
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return path


def _prefetch(profile: Profile, notebooks: list[str], folder: Path, workers: int, owners: dict | None) -> float:
    """The rounds up front (sdperf.run.prefetch; if they fail each notebook measures its own), stamped for eta."""
    from tqdm import tqdm

    from sdperf.run import prefetch

    started = time.time()
    try:
        with logging_to(part_log(profile.name, eta.ROUNDS_STAMP_NAME)):
            seconds = prefetch.run(profile, notebooks, folder, say=tqdm.write, owners=owners)
    except Exception as exc:  # noqa: BLE001 - the notebooks still measure everything themselves
        tqdm.write(f"stand-alone rounds up front failed ({type(exc).__name__}: {exc}); each notebook measures its own")
        return 0.0
    if workers:
        write_stamp(profile.name, eta.ROUNDS_STAMP_NAME, {"part": eta.ROUNDS, "workers": workers, "commit":
                    environment.git_commit(), "machine": environment.fingerprint(profile.device)}, OK, started,
                    time.time())
    return seconds


def part_log(profile: str, name: str) -> Path:
    """A part's console log beside its executed copy (reports/<P>/notebooks/<name>.log), emptied for this run."""
    out = outputs_dir(profile)
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{name}.log"
    log.write_text("")
    return log


@contextlib.contextmanager
def logging_to(log: Path):
    """Forked workers started inside write their console output to `log` (sdperf.measure.worker.to_log)."""
    os.environ[LOG_ENV] = str(log)
    try:
        yield
    finally:
        os.environ.pop(LOG_ENV, None)


def expected_parts(profile: Profile, stale: list[str], folder: Path) -> tuple[list, int, dict | None]:
    """(each part's expected seconds, the workers the rounds launch, the rounds' plan or None when it failed)."""
    from sdperf.run import prefetch

    machine = environment.fingerprint(profile.device)
    try:
        on_record = json.loads((paths.profile_reports(profile.name) / "environment.json").read_text())
        cpu = on_record.get("cpu_model", "") if isinstance(on_record, dict) else ""
    except (OSError, ValueError):
        cpu = ""
    try:
        owners = prefetch.by_notebook(profile, stale, folder)
        workers = prefetch.pending(profile, stale, folder, owners)
    except Exception:  # noqa: BLE001 - the rounds then fail (and say why) where they run; no estimate here
        owners, workers = None, 0
    guess = profile.expected
    parts = [eta.rounds(stamp_path(profile.name, eta.ROUNDS_STAMP_NAME), workers, machine, cpu, guess)] if workers \
        else []
    return parts + [eta.notebook(stamp_path(profile.name, n), n, machine, cpu, guess) for n in stale], workers, owners


def run(profile_name: str | None, only: list[str] | None = None, force: bool = False,
        notebooks_dir: Path | None = None, beside_survivors: bool = False, beside_load: bool = False) -> int:
    """Run the study for one profile (one run per machine and profile at a time); 0 when all ran or were up to date."""
    from sdperf.measure import contention

    profile, selected = validate(profile_name, only, notebooks_dir)
    os.environ[environment.RUN_ID_ENV] = ""  # a new run id for this run, shared by its notebooks' kernels
    with contention.machine_lock(f"profile {profile.name}, reports {paths.profile_reports(profile.name)}"), \
            staging.run_lock(profile.name, environment.run_id()):
        resume_rounds(profile, force)
        return _run_locked(profile, selected, force, notebooks_dir, beside_survivors, beside_load)


def resume_rounds(profile: Profile, force: bool, say=print) -> str:
    """Key this run's rounds by all that changes a timing, so a killed run's rounds are the next run's; the key."""
    parts = ledgers.resume_parts(environment.git_commit(), environment.fingerprint(profile.device),
                                 (paths.params_dir() / f"{profile.name}.yml").read_text(), environment.tree_digest())
    key = ledgers.resume_key(parts)
    os.environ[ledgers.KEY_ENV] = key
    folder = paths.scratch_dir(profile.name) / "rounds"
    for line in ledgers.forget(folder, keep=None if force else key, parts=parts):
        say(f"finished rounds not resumed, removed: {line}")
    ledgers.remember(folder, key, parts)
    return key


def check_survivors(profile: str, beside: bool = False, say=print) -> list[dict]:
    """Workers a killed launcher of this profile left running; a ConfigError unless `beside` (they bias figures)."""
    from sdperf.measure import lifeline

    where = lifeline.folder(profile)
    why = paths.unsafe_folder(where) if where.exists() or where.is_symlink() else None
    if why is not None:  # its pid files would be read, and removed, through the link
        raise ConfigError(f"sdperf keeps its worker records only in a real folder inside the reports folder, and "
                          f"{why}; nothing was removed: replace the link with a folder and run again")
    left = lifeline.survivors(profile)
    if not left:
        return left
    msg = f"processes a killed run left behind are still running: {lifeline.describe(left)}"
    if not beside:
        pids = " ".join(str(s["pid"]) for s in left)
        raise ConfigError(f"{msg}; stop them (kill {pids}) or pass --beside-survivors to measure beside them")
    say(f"warning: {msg}; measuring beside them (--beside-survivors)")
    return left


def check_quiet(beside: bool = False, say=print) -> dict | None:
    """Refuse a busy machine, naming the busiest, unless `beside`; returns what they took (None when quiet)."""
    from sdperf.measure import contention

    contention.threshold()  # a bad SDPERF_CONTENTION_SHARE is refused by name before anything is sampled
    taken = contention.wait_quiet(say=say)
    if not contention.contended(taken):
        return None
    who = contention.busiest()
    msg = (f"the machine is busy: {contention.words(taken, 'over the last second')}"
           + (f" (busiest: {', '.join(who)})" if who else ""))
    if not beside:
        raise ConfigError(f"{msg}; every ratio would time that load too: stop them, or pass --beside-load to measure "
                          "anyway (each worker still measures its own window, and its rows are marked)")
    say(f"warning: {msg}; measuring beside it (--beside-load)")
    return taken


def _run_locked(profile: Profile, selected: list[str], force: bool, notebooks_dir: Path | None,
                beside_survivors: bool = False, beside_load: bool = False) -> int:
    from tqdm import tqdm

    from sdperf.measure import doctor
    from sdperf.optimizations.torch_compile import clear_inductor
    from sdperf.report import report

    survivors = check_survivors(profile.name, beside_survivors, tqdm.write)
    load = check_quiet(beside_load, tqdm.write)
    for name in selected:
        if read_running(profile.name, name) is not None:
            tqdm.write(f"{name}: its last run was interrupted; its previous results stood and it runs again")
    removed = staging.clean_leftovers(profile.name)
    if removed:
        tqdm.write(f"removed {len(removed)} file(s) an interrupted run left: {', '.join(removed[:5])}"
                   + (" ..." if len(removed) > 5 else ""))
    folder = Path(notebooks_dir or paths.notebooks_dir())
    run_id = environment.run_id()
    commit = environment.git_commit()
    stale = [n for n in selected if not up_to_date(folder / f"{n}.ipynb", profile, commit, force)]
    found = doctor.record(profile) if notebooks_dir is None else None  # the catalog's rungs are the study's notebooks'
    if found is not None:
        tqdm.write(doctor.report(profile, found))
    parts, workers, owners = expected_parts(profile, stale, folder)
    tqdm.write(eta.plan_text(parts))
    prefetch_s = _prefetch(profile, stale, folder, workers, owners)
    outcomes, done = [], {eta.ROUNDS}
    with tqdm(selected, desc=f"sdperf {profile.name}", unit="notebook") as bar:
        for name in bar:
            bar.set_postfix_str(name)
            if name in stale:
                mine = next((p for p in parts if p.part == name), None)
                tqdm.write(f"{name}: expected {eta.minutes(mine.seconds if mine else None)}; "
                           f"about {eta.minutes(eta.left(parts, done))} left in the run")
            outcomes.append(run_one(folder / f"{name}.ipynb", profile, commit, force, tqdm.write))
            done.add(name)
    staging.remove_run(profile.name, run_id)
    clear_inductor(paths.scratch_dir(profile.name))  # inductor's cache holds code it runs: it goes with the run
    write_environment(profile, {"beside_survivors": [{k: s.get(k) for k in ("pid", "role", "stack", "rss_mib")}
                                                     for s in survivors],
                                "beside_load": load})  # at the end: a killed run leaves the last finished record
    if found is not None:
        doctor.write_record(found)
    html_ok = convert(profile.name, outcomes, tqdm.write)
    index = report.write_index(profile.name)
    print(summary_table(outcomes))
    if prefetch_s:
        print(f"stand-alone rounds measured before the notebooks (sdperf.run.prefetch): {prefetch_s:.1f} s")
    print(f"report: {index}")
    return 0 if html_ok and all(o.status != FAILED for o in outcomes) else 1
