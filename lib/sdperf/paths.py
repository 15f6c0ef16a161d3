"""Where the study reads profiles and writes reports; overridable so tests never touch the repo's reports/."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def params_dir() -> Path:
    return Path(os.environ.get("SDPERF_PARAMS_DIR", REPO_ROOT / "params"))


def notebooks_dir() -> Path:
    return REPO_ROOT / "notebooks"


def reports_root() -> Path:
    return Path(os.environ.get("SDPERF_REPORTS_DIR", REPO_ROOT / "reports"))


def profile_reports(profile: str) -> Path:
    return reports_root() / profile


def scratch_dir(profile: str) -> Path:
    """What runs of a profile reuse but never publish (seeded weights, compiler caches, worker records)."""
    return profile_reports(profile) / ".scratch"


def figures_dir(profile: str) -> Path:
    return profile_reports(profile) / "figures"


def sibling_tempfile(path: Path, suffix: str = "") -> tuple[int, str]:
    """A temp file beside `path` (same folder, so a later os.replace is one atomic rename), opened for writing.

    mkstemp creates its file with mode 0600 whatever the umask, and the rename keeps that mode: every result,
    figure and manifest would be unreadable to the other users or ranks of a shared output folder. The file gets
    the mode a plain open() would give it (0666 less the umask) before anything is written."""
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.fchmod(fd, 0o666 & ~current_umask())
    return fd, tmp


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status, since 4.7): setting
    and restoring it would leave a window in which another thread's files get mode 0666."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
