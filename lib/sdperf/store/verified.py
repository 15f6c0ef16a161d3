"""Cache entries that prove what they hold: a digest of each file written beside it, checked before the file is used.

A damaged entry (same-size scaled weights, a truncated file) loads silently and poisons a row, so every entry is
sealed when written whole (`<file>.sha256`, or one manifest per folder) and checked before it is read; one that fails
is moved into `.quarantine/` and built again.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import time
import warnings
from pathlib import Path

SEAL = ".sha256"  # a file's digest beside it
FOLDER_SEAL = ".sdperf-sealed.json"  # a folder's: {relative path: sha256} of every other file in it
QUARANTINE = ".quarantine"


def digest(path: Path) -> str:
    """The sha256 of a file's bytes (read in chunks: an SD 1.5 UNet's weights are 3.4 GB)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _seal_path(path: Path) -> Path:
    return path.with_name(path.name + SEAL)


def seal(path: Path) -> None:
    """Record `path`'s digest beside it, written whole; call once the file is complete and in place."""
    from sdperf.store.results import atomic_write_text

    atomic_write_text(_seal_path(Path(path)), digest(path) + "\n")


def check(path: Path) -> str | None:
    """Why `path` may not be used (no seal, a seal that does not match, unreadable), or None when it is intact."""
    path, sealed = Path(path), _seal_path(Path(path))
    if path.is_symlink() or sealed.is_symlink():
        return "it is a symbolic link (cache entries are written here, never linked)"
    try:
        want = sealed.read_text().strip()
    except FileNotFoundError:
        return "it has no digest (written before digests, or its writer was killed before sealing it)"
    except (OSError, UnicodeDecodeError) as exc:
        return f"its digest cannot be read ({exc})"
    try:
        have = digest(path)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    return None if have == want else f"its content does not match its digest (sha256 {have[:12]} != {want[:12]})"


def quarantine(path: Path, why: str) -> Path | None:
    """Move a damaged entry (a file with its seal, or a folder) into .quarantine/, warning why; its new path or None."""
    path = Path(path)
    where = path.parent / QUARANTINE
    where.mkdir(exist_ok=True)
    dest = where / f"{path.name}.{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    try:
        os.replace(path, dest)
    except FileNotFoundError:
        return None
    sealed = _seal_path(path)
    if sealed.exists() or sealed.is_symlink():
        with contextlib.suppress(OSError):
            os.replace(sealed, dest.with_name(dest.name + SEAL))
    warnings.warn(f"cache entry {str(path)!r} set aside in {str(where)!r} and built again: {why}", stacklevel=2)
    return dest


def load(path: Path, read, expect=None):
    """`read(path)` when sealed, intact, readable and `expect(value)` is None; else quarantined, None to rebuild."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return None
    why = check(path)
    if why is None:
        try:
            value = read(path)
        except Exception as exc:  # noqa: BLE001 - any failure to read a sealed entry means it is not what was sealed
            why = f"it cannot be read ({type(exc).__name__}: {str(exc)[:160]})"
        else:
            why = expect(value) if expect is not None else None
            if why is None:
                return value
    quarantine(path, why)
    return None


def write(path: Path, write_into) -> bool:
    """Write a cache entry whole with `write_into(tmp)` and seal it; a failed write only warns. Whether stored."""
    from sdperf.store.results import atomic_write

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, write_into)
        seal(path)
        return True
    except OSError as exc:
        for leftover in (path, _seal_path(path)):
            with contextlib.suppress(OSError):
                leftover.unlink()
        full = " (the disk is full)" if exc.errno == errno.ENOSPC else ""
        warnings.warn(f"cache entry {str(path)!r} not stored{full}: {exc.strerror or exc}; the result computed "
                      "now is kept and the entry is built again next time", stacklevel=2)
        return False


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != FOLDER_SEAL
                  and QUARANTINE not in p.relative_to(folder).parts)


def seal_folder(folder: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """Record and return the digest of every file in `folder` (`known`: digests just checked, not computed again)."""
    from sdperf.store.results import atomic_write_text

    folder = Path(folder)
    known = known or {}
    sums = {rel: known.get(rel) or digest(p) for p in _files(folder) for rel in [str(p.relative_to(folder))]}
    atomic_write_text(folder / FOLDER_SEAL, json.dumps(sums, indent=1, sort_keys=True))
    return sums


def check_folder(folder: Path) -> str | None:
    """Why the sealed `folder` may not be used (no manifest, a file missing, added, linked or changed), or None."""
    folder = Path(folder)
    try:
        sums = json.loads((folder / FOLDER_SEAL).read_text())
    except FileNotFoundError:
        return "it has no digests (written before digests, or its writer was killed before sealing it)"
    except (OSError, ValueError) as exc:
        return f"its digests cannot be read ({exc})"
    if not isinstance(sums, dict):
        return "its digests are not a mapping of file to sha256"
    have = {str(p.relative_to(folder)): p for p in _files(folder)}
    if set(have) != set(sums):
        odd = sorted(set(have) ^ set(sums))
        return f"its files differ from those sealed ({', '.join(odd[:3])}{' ...' if len(odd) > 3 else ''})"
    for rel, p in have.items():
        if p.is_symlink():
            return f"{rel} is a symbolic link"
        try:
            if digest(p) != sums[rel]:
                return f"{rel} does not match its digest"
        except OSError as exc:
            return f"{rel} cannot be read ({exc.strerror or exc})"
    return None


def prune_folder(folder: Path) -> tuple[list[Path], dict[str, str]]:
    """Delete a growing sealed folder's files its manifest does not match; (those deleted, digests of those kept)."""
    folder = Path(folder)
    try:
        sums = json.loads((folder / FOLDER_SEAL).read_text())
        sums = sums if isinstance(sums, dict) else {}
    except (OSError, ValueError):
        sums = {}
    gone, kept = [], {}
    for p in _files(folder):
        rel = str(p.relative_to(folder))
        try:
            ok = not p.is_symlink() and sums.get(rel) is not None and digest(p) == sums[rel]
        except OSError:
            ok = False
        if ok:
            kept[rel] = sums[rel]
        else:
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone, kept
