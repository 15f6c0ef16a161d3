"""One look for every figure, saved as PNG (for the report) and SVG (for papers) under reports/<profile>/figures."""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib.pyplot as plt
import seaborn as sns

from sdperf.paths import figures_dir
from sdperf.results import atomic_write_bytes

STYLE = dict(style="whitegrid", context="notebook", palette="colorblind")


def use_style() -> None:
    sns.set_theme(**STYLE)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 150, "figure.autolayout": True,
                         "svg.hashsalt": "sdperf"})  # fixed ids keep SVGs diff-stable between runs


def save_figure(fig, profile: str, notebook: str, name: str) -> dict[str, Path]:
    """Write <notebook>__<name>.png/.svg atomically; returns their paths."""
    out = {}
    for ext in ("png", "svg"):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, bbox_inches="tight", metadata={"Date": None} if ext == "svg" else None)
        path = figures_dir(profile) / f"{notebook}__{name}.{ext}"
        atomic_write_bytes(path, buf.getvalue())
        out[ext] = path
    return out
