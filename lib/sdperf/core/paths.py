"""Where the study reads profiles and writes reports; overridable so tests never touch the repo's reports/."""
from __future__ import annotations

import os
from pathlib import Path

from sdperf.core.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[3]
PARAMS_ENV = "SDPERF_PARAMS_DIR"
REPORTS_ENV = "SDPERF_REPORTS_DIR"


def _env_dir(var: str, default: Path) -> Path:
    """The folder $var names, made absolute (every process then agrees on it), else `default`; '' is an error."""
    value = os.environ.get(var)
    if value is None:
        return default
    if not value.strip():
        raise ConfigError(f"${var} is set but empty; unset it (default {str(default)!r}) or give a folder, "
                          f"e.g. {var}={str(default)}")
    return Path(os.path.abspath(os.path.expanduser(value)))


def resolve_env() -> None:
    """Write $SDPERF_PARAMS_DIR and $SDPERF_REPORTS_DIR back as absolute paths, for every child process to inherit."""
    for var, default in ((PARAMS_ENV, REPO_ROOT / "params"), (REPORTS_ENV, REPO_ROOT / "reports")):
        if var in os.environ:
            os.environ[var] = str(_env_dir(var, default))
            if Path(os.environ[var]).exists() and not Path(os.environ[var]).is_dir():
                raise ConfigError(f"${var}={os.environ[var]!r} is a file, not a folder; give a folder (it is made "
                                  f"when missing) or unset it (default {str(default)!r})")


def require_writable(folder: Path, what: str) -> Path:
    """`folder` when files can be written into it (made when missing), else a ConfigError naming what blocks it."""
    existing = blocking(folder)
    if existing is not None:
        raise ConfigError(f"{what}: {str(folder)!r} cannot be written ({str(existing)!r} is not a writable folder); "
                          f"make it writable or set {REPORTS_ENV} to another folder")
    return Path(folder)


def params_dir() -> Path:
    return _env_dir(PARAMS_ENV, REPO_ROOT / "params")


def notebooks_dir() -> Path:
    return REPO_ROOT / "notebooks"


def reports_root() -> Path:
    return _env_dir(REPORTS_ENV, REPO_ROOT / "reports")


def profile_reports(profile: str) -> Path:
    return reports_root() / profile


def scratch_dir(profile: str) -> Path:
    """What runs of a profile reuse but never publish (seeded weights, compiler caches, worker records)."""
    return profile_reports(profile) / ".scratch"


def figures_dir(profile: str) -> Path:
    return profile_reports(profile) / "figures"


def blocking(folder: Path) -> Path | None:
    """What stops files being written into `folder` (itself, or its nearest existing ancestor), else None."""
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return existing or folder
    return None


def sibling_tempfile(path: Path, suffix: str = "") -> tuple[int, str]:
    """A temp file beside `path` (for one atomic rename), opened for writing, with a plain open()'s mode, not 0600."""
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.fchmod(fd, 0o666 & ~current_umask())
    return fd, tmp


def current_umask() -> int:
    """The umask, read from /proc/self/status where Linux shows it (setting and restoring it races other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def unsafe_folder(folder: Path, root: Path | None = None) -> str | None:
    """Why sdperf may not remove files inside `folder` (outside `root`, or a symlink on the way), else None."""
    root = Path(root or reports_root())
    folder = Path(folder)
    try:
        rel = folder.relative_to(root)
    except ValueError:
        return f"{str(folder)!r} is not inside the reports folder {str(root)!r}"
    here = root
    for part in rel.parts:
        here = here / part
        if here.is_symlink():
            return f"{str(here)!r} is a symbolic link (to {os.readlink(here)!r})"
    real_root, real = os.path.realpath(root), os.path.realpath(folder)
    if os.path.commonpath([real_root, real]) != real_root:
        return f"{str(folder)!r} resolves to {real!r}, outside the reports folder {real_root!r}"
    return None


def removable(folder: Path, root: Path | None = None) -> bool:
    """Whether a clean-up may remove what sdperf wrote in `folder`; warns with unsafe_folder's reason when not."""
    why = unsafe_folder(folder, root)
    if why is not None:
        import warnings

        warnings.warn(f"sdperf removes nothing through {why}; remove or replace the link to let it clean up",
                      stacklevel=2)
    return why is None


def remove_owned(path: Path) -> None:
    """Remove one entry sdperf wrote in a `removable` folder: a tree, a file, or a link (never what it points to)."""
    import shutil

    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
