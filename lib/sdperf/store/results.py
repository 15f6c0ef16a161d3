"""The study's one tidy table per profile: reports/<profile>/results.csv, a row per (notebook, scenario, metric).

Every write is a read-modify-write under a file lock, to a temp file then renamed, so a killed run leaves the old
table or the new, never half a file; under `sdperf run` a notebook's rows are staged (sdperf.store.staging).
"""
from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from sdperf.store import staging
from sdperf.core import environment
from sdperf.core.errors import ConfigError, short
from sdperf.core.paths import profile_reports, sibling_tempfile

KEY = ["notebook", "scenario", "metric"]
# lo/hi: min-max over fresh-process rounds; p10/p90: the spread inside one process; method: how it was taken; key:
# the catalog stack key; batch_size: images per generation; verdict: a ratio's speed verdict, or why not measured.
MEASURE_COLUMNS = ["value", "unit", "p10", "p90", "lo", "hi", "n", "status", "method", "key", "batch_size", "verdict",
                   "note"]
# run_id: one `sdperf run` (or one notebook opened alone); machine: the CPU/GPU fingerprint; setting: Profile.setting
ENV_COLUMNS = ["profile", "setting", "dtype", "device", "device_name", "cpu_model", "machine", "threads", "commit",
               "run_id", "torch", "diffusers", "python", "packages", "time_utc"]
COLUMNS = KEY + MEASURE_COLUMNS + ENV_COLUMNS
STATUSES = ("ok", "not_applicable", "skipped", "failed")
FASTER, SLOWER, NOISE = "faster", "slower", "within noise"  # sdperf.measure.rounds.speed_verdict's words
NOT_MEASURED_VERDICTS = {"not_applicable": "not applicable", "skipped": "skipped", "failed": "failed"}
VERDICTS = (FASTER, SLOWER, NOISE, *NOT_MEASURED_VERDICTS.values())
REQUIRED = KEY + ["status", "profile", "device", "machine", "commit", "time_utc"]  # to be replaced and placed
NUMERIC = ["value", "p10", "p90", "lo", "hi", "n", "batch_size"]  # a number or empty in every row


class DamagedTable(ConfigError):
    """results.csv (or a staged rows file) that is not whole: named with its file and line, never half-read."""


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """`path` written whole or not at all: `write(tmp)` fills a temp file beside it, synced and renamed over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = sibling_tempfile(path, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock beside `path`, so two notebooks of one profile never interleave their writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def results_path(profile: str) -> Path:
    return profile_reports(profile) / "results.csv"


def read_results(profile: str) -> pd.DataFrame:
    return read_table(results_path(profile))


def read_table(path: Path) -> pd.DataFrame:
    """The table at `path` (an empty one if there is none) after check_table: damage is an error, not a guess."""
    text = read_checked(path)
    if text is None:
        return pd.DataFrame(columns=COLUMNS)
    return with_verdicts(pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""]))


# Tables written before `verdict` and `batch_size` were columns said both only in prose (note, scenario); this is
# the one place that prose is read, and the next write stores the columns.
_LEGACY_VERDICT = re.compile(rf"({FASTER}|{SLOWER}|{NOISE}) \(noise band|; ({FASTER}|{SLOWER}|{NOISE})$")
_LEGACY_BATCH = re.compile(r", batch (\d+)$")


def with_verdicts(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with its `verdict` and `batch_size` columns: as stored, or derived for a table written before them."""
    if "verdict" not in df:
        found = df["note"].astype(str).str.extract(_LEGACY_VERDICT)
        said = found[0].fillna(found[1]).where(df["status"] == "ok")
        df["verdict"] = said.fillna(df["status"].map(NOT_MEASURED_VERDICTS))
    if "batch_size" not in df:
        df["batch_size"] = df["scenario"].astype(str).str.extract(_LEGACY_BATCH)[0]
    sizes = pd.to_numeric(df["batch_size"], errors="coerce")
    if sizes.notna().sum() == df["batch_size"].notna().sum() and (sizes.dropna() % 1 == 0).all():
        df["batch_size"] = sizes.astype("Int64")  # whole numbers stay whole (not 1.0) when written back
    return df[[c for c in COLUMNS if c in df]]


def check_results(profile: str) -> None:
    """Fail before anything is measured when results.csv is damaged, not when promoting rows into it."""
    read_checked(results_path(profile))


def read_checked(path: Path) -> str | None:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise DamagedTable(f"{str(path)!r} is a folder, not a results table; remove it") from None
    return check_table(path, data)


def _damage(path: Path, line: int, what: str) -> DamagedTable:
    return DamagedTable(f"results table {str(path)!r} is damaged at line {line}: {what}; nothing was read from it. "
                        "Repair or delete that line (or restore the file from git) and run again")


def check_table(path: Path, data: bytes) -> str:
    """`data` decoded when it is a whole table as to_csv writes it, else DamagedTable naming the file and line."""
    if not data:
        raise _damage(path, 1, "the file is empty (not even the header line)")
    text = _decode(path, data)
    if not text.endswith("\n"):
        raise _damage(path, text.count("\n") + 1, "the last line is torn (it has no line end: a write was cut off)")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
        _check_header(path, header)
        required = [header.index(c) for c in REQUIRED]
        numeric = [header.index(c) for c in NUMERIC if c in header]
        for row in reader:
            _check_row(path, reader.line_num, row, header, required, numeric)
    except csv.Error as exc:
        raise _damage(path, reader.line_num, f"not CSV ({exc})") from None
    return text


def _decode(path: Path, data: bytes) -> str:
    """UTF-8 without NUL bytes (both mean a binary file, or blocks of zeros a crash left)."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise _damage(path, data.count(b"\n", 0, nul) + 1, "binary data (a NUL byte), not CSV text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _damage(path, data.count(b"\n", 0, exc.start) + 1,
                      f"binary data (byte {data[exc.start]:#04x} is not UTF-8), not CSV text") from None


def _check_header(path: Path, header: list[str]) -> None:
    unknown = [c for c in header if c not in COLUMNS]
    missing = [c for c in REQUIRED if c not in header]
    if unknown or missing or len(set(header)) != len(header):
        raise _damage(path, 1, f"the header {short(header)} is not a results header (unknown columns: "
                      f"{short(unknown)}, missing: {short(missing)}); valid columns: {', '.join(COLUMNS)}")


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_row(path: Path, line: int, row: list[str], header: list[str], required: list[int],
               numeric: list[int] = ()) -> None:
    if len(row) != len(header):
        raise _damage(path, line, f"the row has {len(row)} field(s), the header {len(header)}")
    empty = [header[i] for i in required if not row[i].strip()]
    if empty:
        raise _damage(path, line, f"the row has no {', '.join(empty)} (every row needs {', '.join(REQUIRED)})")
    text = [(header[i], row[i]) for i in numeric if row[i].strip() and not _number(row[i])]
    if text:
        raise _damage(path, line, f"the row's {text[0][0]} is {short(text[0][1])}, not a number (the columns "
                      f"{', '.join(NUMERIC)} hold numbers or nothing)")


def upsert_rows(path: Path, rows: list[dict]) -> pd.DataFrame:
    """Replace rows with the same key, append new ones, write atomically; returns the new table."""
    new = pd.DataFrame(rows, columns=COLUMNS)
    with locked(path):
        if path.is_file():
            old = read_table(path)
            keys = set(map(tuple, new[KEY].astype(str).values))
            keep = ~old[KEY].astype(str).apply(tuple, axis=1).isin(keys)
            table = pd.concat([old[keep], new], ignore_index=True) if keep.any() else new
        else:
            table = new
        atomic_write_text(path, table.to_csv(index=False))
    return table


def promote_rows(profile: str, notebook: str, staged: Path) -> int:
    """A completed run's staged rows replace all the notebook's earlier rows, in one atomic write; how many rows."""
    path = results_path(profile)
    new = read_table(staged)
    with locked(path):
        old = read_table(path)
        table = pd.concat([old[old["notebook"] != notebook], new], ignore_index=True) if len(old) else new
        atomic_write_text(path, table.reindex(columns=COLUMNS).to_csv(index=False))
    for f in (Path(staged), Path(staged).with_name(Path(staged).name + ".lock")):
        f.unlink(missing_ok=True)
    return len(new)


@dataclass
class Recorder:
    """What a notebook uses to store its measurements; every row carries the environment it was taken in."""

    notebook: str
    profile: str
    env: dict
    dtype: str = "float32"

    @property
    def staged(self) -> bool:
        """Under `sdperf run` this notebook's rows wait in its run's staging file until it completes."""
        return staging.active(self.notebook)

    @property
    def path(self) -> Path:
        if self.staged:
            return staging.rows_path(self.profile, self.notebook, self.env.get("run_id") or environment.run_id())
        return results_path(self.profile)

    def _row(self, scenario: str, metric: str, value, unit: str, p10=None, p90=None, n=None,
             status: str = "ok", note: str = "", dtype: str | None = None, lo=None, hi=None,
             method: str = "", key: str = "", batch_size: int | None = None, verdict: str | None = None) -> dict:
        if status not in STATUSES:
            raise ValueError(f"status {status!r} is not valid; choose one of: {', '.join(STATUSES)}")
        verdict = verdict or NOT_MEASURED_VERDICTS.get(status)
        if verdict is not None and verdict not in VERDICTS:
            raise ValueError(f"{scenario}/{metric}: verdict {verdict!r} is not valid; choose one of: "
                             f"{', '.join(VERDICTS)}")
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        if status == "ok" and missing and not note:
            raise ValueError(f"{scenario}/{metric}: an 'ok' row needs a measured value or a note saying why not")
        if status == "ok" and not str(method or "").strip():
            raise ValueError(f"{scenario}/{metric}: an 'ok' row needs a method saying how it was measured")
        env = self.env
        row = {
            "notebook": self.notebook, "scenario": scenario, "metric": metric, "value": value, "unit": unit,
            "p10": p10, "p90": p90, "lo": lo, "hi": hi, "n": n, "status": status, "method": method, "key": key,
            "batch_size": batch_size, "verdict": verdict, "note": note, "profile": self.profile,
            "setting": env.get("setting"), "dtype": dtype or self.dtype, "device": env["device"],
            "device_name": env["device_name"], "cpu_model": env["cpu_model"], "machine": env.get("machine"),
            "threads": env["threads"], "commit": env["commit"], "run_id": env.get("run_id"),
            "torch": env["packages"].get("torch"), "diffusers": env["packages"].get("diffusers"),
            "python": env["python"],
            "packages": ";".join(f"{k}={v}" for k, v in env["packages"].items() if v), "time_utc": env["time_utc"],
        }
        empty = [c for c in REQUIRED if row[c] is None or not str(row[c]).strip()]
        if empty:
            raise ValueError(f"{scenario}/{metric}: a row needs {', '.join(empty)}; the environment record lacks them")
        return row

    def add(self, scenario: str, metric: str, value, unit: str, **kw) -> None:
        upsert_rows(self.path, [self._row(scenario, metric, value, unit, **kw)])

    def add_many(self, rows: list[dict]) -> None:
        upsert_rows(self.path, [self._row(**r) for r in rows])

    def timing(self, scenario: str, timing, metric: str = "latency", dtype: str | None = None,
               batch_size: int | None = None, method: str | None = None) -> None:
        """Steady-state median with p10/p90, first-call time and peak memory, as separate rows, each with `method`."""
        rows = [dict(scenario=scenario, metric=metric, value=timing.median, unit="s", p10=timing.p10,
                     p90=timing.p90, n=len(timing.times), dtype=dtype, batch_size=batch_size, method=method),
                dict(scenario=scenario, metric=f"{metric}_first_call", value=timing.first_call, unit="s",
                     n=1, dtype=dtype, batch_size=batch_size, method=method,
                     note="first call, includes warm-up/compile/build")]
        if timing.peak_memory_bytes is not None:
            rows.append(dict(scenario=scenario, metric="peak_memory", value=timing.peak_memory_bytes / 2**20,
                             unit="MiB", n=1, dtype=dtype, batch_size=batch_size, method=method,
                             note=timing.memory_kind))
        self.add_many(rows)

    def not_applicable(self, scenario: str, reason: str, metric: str = "latency", **kw) -> None:
        self.add(scenario, metric, None, "", status="not_applicable", note=f"not applicable: {reason}", **kw)

    def skipped(self, scenario: str, reason: str, metric: str = "latency", **kw) -> None:
        """Not measured on purpose (over the profile's time budget); the reason says what was measured instead."""
        self.add(scenario, metric, None, "", status="skipped", note=f"skipped: {reason}", **kw)

    def failed(self, scenario: str, error: BaseException | str, metric: str = "latency", **kw) -> None:
        msg = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.add(scenario, metric, None, "", status="failed", note=msg[:500], **kw)

    def view(self) -> pd.DataFrame:
        """The table as it will be when this notebook completes (its staged rows in place of its earlier ones)."""
        df = read_results(self.profile)
        if not self.staged:
            return df
        mine = read_table(self.path)
        return pd.concat([df[df["notebook"] != self.notebook], mine], ignore_index=True) if len(df) else mine

    def table(self) -> pd.DataFrame:
        df = self.view()
        return df[df["notebook"] == self.notebook].reset_index(drop=True)

    def current(self) -> pd.DataFrame:
        """Rows of every notebook taken on this machine at this commit: the only rows a table or a choice may read."""
        return current_rows(self.view(), self.env)


def current_rows(df: pd.DataFrame, env: dict) -> pd.DataFrame:
    if df.empty:
        return df
    same = df["commit"].astype(str) == str(env["commit"])
    if "machine" in df:
        same &= df["machine"].astype(str) == str(env.get("machine"))
    return df[same].reset_index(drop=True)
