"""The generated folder on disk: images written once (temp + rename), per-rank manifest parts, the manifest.

    DIR/run.json               settings the pixels depend on and the captions' hash (a run with others fails)
    DIR/g<guidance>/<id>_s<seed>.png
    DIR/parts/rank-<r>.jsonl   one row per finished image, appended by its rank after the image's rename
    DIR/manifest.csv           one row per image, sorted by key, rebuilt from the parts at the end of every run
    DIR/summary.json           images/s per rank and in total, of the last run
    DIR/scores/                per-shard scoring states (sdperf.quality.sharded)

An image appears by rename, so "done" is "the file exists"; an image a kill left without a row gets it next run.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from sdperf.core.errors import ConfigError
from sdperf.imagegen.keys import ImageKey
from sdperf.core.paths import blocking, sibling_tempfile
from sdperf.store.results import atomic_write_bytes, atomic_write_text, locked

RUN_FILE = "run.json"
PARTS_DIR = "parts"
MANIFEST = "manifest.csv"
SUMMARY = "summary.json"
KEY_COLUMNS = ["guidance", "prompt_id", "seed"]
REQUIRED = ("key", "prompt_id", "caption", "guidance", "seed", "file")  # what a reader needs of a manifest
COLUMNS = ["key", "prompt_id", "caption", "guidance", "seed", "file", "steps", "resolution", "profile", "dtype",
           "commit", "time_utc", "rank"]
_TEMP = re.compile(r"^\.(?P<name>.+\.png)\.[^.]+\.tmp$")  # results.atomic_write_bytes' temp file beside a PNG
_GUIDANCE_DIR = re.compile(r"^g[0-9]")  # keys.ImageKey.relpath's folder per guidance scale
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # a cell starting so runs as a formula in a spreadsheet (OWASP)
USER_TEXT = ("caption", "prompt_id")  # the manifest's columns that hold text a user wrote


def check_out_dir(out_dir) -> Path:
    """An existing or makeable folder whose subfolders a run writes into are writable, checked before any model."""
    path = Path(out_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out dir {str(path)!r} is a file, not a folder; give a new or existing folder")
    parent = blocking(path)
    if parent is not None:
        raise ConfigError(f"out dir {str(path)!r} cannot be created: {str(parent)!r} is not a writable folder")
    if path.is_dir():
        for sub in sorted(path.iterdir()):
            if sub.name != PARTS_DIR and not _GUIDANCE_DIR.match(sub.name):
                continue
            if not sub.is_dir():
                raise ConfigError(f"out dir {str(path)!r}: {str(sub)!r} is not a folder, but images or manifest "
                                  "rows go there: remove it or give a new --out")
            if blocking(sub) is not None:
                raise ConfigError(f"out dir {str(path)!r}: its folder {str(sub)!r} is not writable; images and "
                                  "manifest rows are written there: make it writable or give a new --out")
    return path


def captions_sha256(captions: dict[str, str]) -> str:
    """The captions a folder's images were made from (id -> text, in id order)."""
    return hashlib.sha256(json.dumps(sorted(captions.items()), ensure_ascii=False).encode()).hexdigest()


def claim_run_settings(out_dir: Path, settings: dict) -> None:
    """Record what the pixels depend on (created whole and exclusively), or check the folder was made with it."""
    path = out_dir / RUN_FILE
    text = json.dumps(settings, indent=2, sort_keys=True) + "\n"
    fd, tmp = sibling_tempfile(path, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
            return
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links: exclusive create, then the content
            if _create_exclusive(path, text):
                return
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _check_settings(out_dir, path, settings)


def _create_exclusive(path: Path, text: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return True


def _check_settings(out_dir: Path, path: Path, settings: dict) -> None:
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{str(path)!r} is not valid JSON ({exc}); it records the settings the images of "
                          f"{str(out_dir)!r} were made with: restore it or give a new --out") from exc
    except OSError as exc:
        raise ConfigError(f"{str(path)!r} cannot be read ({exc.strerror}); it records the settings the images of "
                          f"{str(out_dir)!r} were made with") from exc
    if not isinstance(old, dict):
        raise ConfigError(f"{str(path)!r} holds {type(old).__name__}, not the settings mapping it should")
    # a folder made before the captions were hashed is checked caption by caption instead (check_captions)
    diff = {k: (old.get(k), v) for k, v in settings.items()
            if old.get(k) != v and not (k == "captions_sha256" and k not in old)}
    if diff:
        said = "; ".join(f"{k}: folder has {a!r}, this run {b!r}" for k, (a, b) in diff.items())
        hint = (" (the captions differ: give the captions file and selection the folder was made with)"
                if "captions_sha256" in diff else "")
        raise ConfigError(f"out dir {str(out_dir)!r} holds images made with other settings ({said}){hint}; "
                          "rerun with the same profile and captions or give a new --out")


def check_captions(out_dir: Path, captions: dict[str, str]) -> None:
    """A caption id already in the folder's rows must mean the same text (a resume would skip its images)."""
    for row in read_parts(out_dir):
        text = captions.get(str(row["prompt_id"]))
        if text is not None and text != row["caption"]:
            raise ConfigError(f"out dir {str(out_dir)!r}: caption id {row['prompt_id']!r} was generated from "
                              f"{row['caption']!r}, this run gives it {text!r}; ids name the images: use the "
                              "captions file the folder was made with or give a new --out")


def png_bytes(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def write_image(out_dir: Path, key: ImageKey, image: np.ndarray) -> Path:
    path = out_dir / key.relpath
    atomic_write_bytes(path, png_bytes(image))
    return path


PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # every whole PNG's last 12 bytes: its empty IEND chunk


def whole_png(path: Path) -> bool:
    """Whether `path` is a regular file that starts and ends as a whole PNG (a truncated one ends elsewhere)."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size < 8 + len(PNG_END):
            return False
        with open(path, "rb") as fh:
            head = fh.read(8)
            fh.seek(-len(PNG_END), os.SEEK_END)
            return head == b"\x89PNG\r\n\x1a\n" and fh.read() == PNG_END
    except OSError:
        return False


def existing(out_dir: Path, keys) -> set[ImageKey]:
    """Keys whose image is on disk and whole (a cut one was damaged later: it is removed, to be generated again)."""
    by_dir: dict[str, set[str]] = {}
    done = set()
    for key in keys:
        folder, _, name = key.relpath.partition("/")
        if folder not in by_dir:
            with contextlib.suppress(FileNotFoundError):
                by_dir[folder] = set(os.listdir(out_dir / folder))
            by_dir.setdefault(folder, set())
        if name in by_dir[folder]:
            if whole_png(out_dir / key.relpath):
                done.add(key)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(out_dir / key.relpath)
    return done


def remove_stale_temps(out_dir: Path, keys) -> int:
    """Delete half-written temp files a killed run left for these keys (only its own: other ranks write theirs)."""
    mine = {key.relpath for key in keys}
    removed = 0
    for folder in {rel.partition("/")[0] for rel in mine}:
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(out_dir / folder):
                m = _TEMP.match(name)
                if m and f"{folder}/{m['name']}" in mine:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(out_dir / folder / name)
                        removed += 1
    return removed


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def utc_from_unix(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="milliseconds")


def unix_from_utc(text: str) -> float:
    """The inverse of utc_from_unix (no zone: UTC; unreadable: the far future, so such a row is never stale)."""
    try:
        when = dt.datetime.fromisoformat(str(text))
    except ValueError:
        return float("inf")
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


class ManifestPart:
    """This rank's append-only rows, under an exclusive lock: two launches into one folder fail, not interleave."""

    def __init__(self, out_dir: Path, rank: int):
        self.path = out_dir / PARTS_DIR / f"rank-{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.close()
            raise ConfigError(f"{str(self.path)!r} is locked by another process: a launch with rank {rank} is "
                              f"already writing into {str(out_dir)!r}; wait for it or give another --out") from None
        self._end_torn_line()

    def _end_torn_line(self) -> None:
        """A row cut short by a kill gets its line ended, so the next row is not glued onto it (and lost)."""
        with open(self.path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() == 0:
                return
            fh.seek(-1, os.SEEK_END)
            torn = fh.read(1) != b"\n"
        if torn:
            self._fh.write("\n")
            self._fh.flush()

    def append(self, row: dict) -> None:
        """One line, flushed to the OS at once: a killed process loses no finished row."""
        self._fh.write(json.dumps(row, sort_keys=True) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def part_files(out_dir: Path) -> list[Path]:
    return sorted((Path(out_dir) / PARTS_DIR).glob("rank-*.jsonl"))


def read_parts(out_dir: Path) -> list[dict]:
    """Every row of every part; a torn last line (a kill mid-write) is skipped, its image gets a row later."""
    rows = []
    for path in part_files(out_dir):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                row = json.loads(line)
                if isinstance(row, dict) and set(COLUMNS) <= set(row):
                    rows.append(row)
    return rows


def row_key(row: dict) -> ImageKey:
    return ImageKey(float(row["guidance"]), str(row["prompt_id"]), int(row["seed"]))


def rebuild_manifest(out_dir) -> pd.DataFrame:
    """manifest.csv from the parts: rows whose image exists, one per key (its latest row), sorted by key."""
    out_dir = Path(out_dir)
    with locked(out_dir / MANIFEST):  # independent shards may finish together: the last rebuild sees all rows
        latest: dict[ImageKey, dict] = {}
        for row in sorted(read_parts(out_dir), key=lambda r: str(r["time_utc"])):
            try:
                key = row_key(row)
            except (TypeError, ValueError):  # a part row no generate wrote: not an image of this folder
                continue
            # a row's file is where its key's image lives, nothing else (a row naming /etc/passwd or ../x is not one)
            if row["file"] == key.relpath and whole_png(out_dir / key.relpath):
                latest[key] = row
        table = pd.DataFrame([latest[k] for k in sorted(latest)], columns=COLUMNS)
        atomic_write_text(out_dir / MANIFEST, neutralised(table).to_csv(index=False))
    return table


def neutralise(text: str) -> str:
    """A quote before text a spreadsheet would run as a formula or that starts with a quote (`restore` undoes it)."""
    return "'" + text if text.startswith(FORMULA_START + ("'",)) else text


def restore(text: str) -> str:
    return text[1:] if text.startswith("'") else text


def neutralised(table: pd.DataFrame) -> pd.DataFrame:
    """The table as written to manifest.csv: its user-written columns neutralised."""
    return table.assign(**{c: table[c].astype(str).map(neutralise) for c in USER_TEXT})


def _inside(folder: Path, file: str) -> bool:
    """Whether `file` (a manifest's relative path) stays inside `folder`, links and '..' resolved."""
    if not file or Path(file).is_absolute():
        return False
    root = folder.resolve()
    return (root / file).resolve().is_relative_to(root)


def read_manifest(out_dir) -> pd.DataFrame:
    """A folder's manifest, one row per image with its `path`; a missing column or image fails naming it."""
    folder = Path(out_dir).expanduser()
    path = folder / MANIFEST
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} does not exist: generate into {str(folder)!r} first "
                          "(sdperf generate --out ...), or rebuild it with sdperf.imagegen.rebuild_manifest")
    df = pd.read_csv(path, dtype={"key": str, "prompt_id": str, "caption": str, "file": str},
                     keep_default_na=False)
    lacking = [c for c in REQUIRED if c not in df.columns]
    if lacking:
        raise ConfigError(f"{str(path)!r} lacks column(s) {', '.join(lacking)}; expected {', '.join(REQUIRED)}")
    for column in USER_TEXT:
        df[column] = df[column].map(restore)
    outside = [f for f in df["file"] if not _inside(folder, f)]
    if outside:
        raise ConfigError(f"{str(path)!r} names {len(outside)} file(s) outside its folder, e.g. {outside[0]!r}; a "
                          "manifest lists images by paths relative to its own folder")
    missing = [f for f in df["file"] if not (folder / f).is_file()]
    if missing:
        raise ConfigError(f"{str(path)!r} names {len(missing)} image(s) that are not in the folder, "
                          f"e.g. {missing[0]!r}")
    df["guidance"] = df["guidance"].astype(float)
    df["seed"] = df["seed"].astype(int)
    df["path"] = [str(folder / f) for f in df["file"]]
    return df
