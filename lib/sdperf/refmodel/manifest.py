"""A model folder's manifest.json, checked so that it covers the folder: what loads is exactly what was hashed.

A manifest proves nothing about the files it leaves out, so `verify` refuses an empty one, entries not inside the
folder and any unlisted file. No torch here: `weights:` folders are checked before diffusers loads them.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath

from sdperf.core.errors import ConfigError, short

MANIFEST = "manifest.json"
CHUNK = 1 << 20


def sha256(path: Path) -> str:
    """A file's sha256, read 1 MiB at a time (weights are hundreds of MB to GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_files(folder: Path) -> list[str]:
    """Every file under `folder` but the manifest, as relative posix paths, symlinks included but not followed."""
    folder = Path(folder)
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            rel = Path(root, name).relative_to(folder).as_posix()
            if rel != MANIFEST:
                found.append(rel)
    return sorted(found)


def read(folder: Path) -> dict:
    """The manifest as a mapping whose `files` is a mapping of path -> sha256 hex; ConfigError otherwise."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{str(path)!r} cannot be read as a JSON manifest ({type(exc).__name__}: "
                          f"{short(str(exc))})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise ConfigError(f"{str(path)!r}: 'files' must be a mapping of relative path -> sha256, got {short(files)}")
    return manifest


def _outside(folder: Path, entry: str) -> bool:
    """An entry that is not a plain relative path, or that resolves (through symlinks) outside the folder."""
    pure = PurePosixPath(entry)
    if not entry or pure.is_absolute() or ".." in pure.parts or "\\" in entry or entry.startswith("~"):
        return True
    root = folder.resolve()
    target = (folder / entry).resolve()
    return target != root and root not in target.parents


def check_cover(folder: Path, files: dict) -> None:
    """The manifest's list is not empty, stays inside the folder, and leaves out no file of it."""
    folder = Path(folder)
    if not files:
        raise ConfigError(f"the manifest of {str(folder)!r} lists no files, so it verifies nothing; rebuild the "
                          "folder (a manifest must list every file in it)")
    escaping = [e for e in files if _outside(folder, e)]
    escaping += [e for e in folder_files(folder) if e not in files and _outside(folder, e)]
    if escaping:
        raise ConfigError(f"the manifest of {str(folder)!r} names files outside the folder (absolute, '..' or a "
                          f"symlink out of it): {short(sorted(set(escaping)))}; every entry must be a path inside it")
    unlisted = [f for f in folder_files(folder) if f not in files]
    if unlisted:
        raise ConfigError(f"{str(folder)!r} holds files its manifest does not list: {short(unlisted)}; remove them "
                          "or rebuild the folder (anything unlisted could be loaded unchecked)")


def verify(folder: Path) -> dict:
    """The manifest, after checking that it covers the folder and every listed file's sha256; ConfigError else."""
    folder = Path(folder)
    manifest = read(folder)
    files = manifest["files"]
    check_cover(folder, files)
    missing = [f for f in files if not (folder / f).is_file()]
    changed = [f for f, digest in files.items() if f not in missing and sha256(folder / f) != digest]
    if missing or changed:
        raise ConfigError(f"model folder {str(folder)!r} does not match its manifest: "
                          + "; ".join(p for p in (f"missing {short(missing)}" if missing else "",
                                                  f"changed {short(changed)}" if changed else "") if p)
                          + "; rebuild it or restore the files (for the reference model: `sdperf train-reference` "
                          "or git)")
    return manifest


def write_files(folder: Path) -> dict:
    """{relative path: sha256} of every file in `folder` but the manifest: exactly what verify will demand."""
    folder = Path(folder)
    return {rel: sha256(folder / rel) for rel in folder_files(folder) if (folder / rel).is_file()}


def verify_weights(source: str, local: bool) -> None:
    """A local weights folder that carries a manifest.json is verified before anything loads from it."""
    if local and (Path(source) / MANIFEST).is_file():
        verify(Path(source))
