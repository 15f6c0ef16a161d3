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
