"""One look for every figure, saved as PNG (for the report) and SVG (for papers) under reports/<profile>/figures."""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib.pyplot as plt
import seaborn as sns

from sdperf import staging
from sdperf.results import atomic_write_bytes

STYLE = dict(style="whitegrid", context="notebook", palette="colorblind")


def use_style() -> None:
    sns.set_theme(**STYLE)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 150, "figure.autolayout": True,
                         "svg.hashsalt": "sdperf"})  # fixed ids keep SVGs diff-stable between runs


def save_figure(fig, profile: str, notebook: str, name: str) -> dict[str, Path]:
    """Write <notebook>__<name>.png/.svg atomically; returns their paths. Under `sdperf run` they are staged with the
    notebook's rows and reach figures/ only when the notebook completes (sdperf.staging)."""
    from sdperf.environment import run_id

    folder = staging.figure_dir(profile, notebook, run_id())
    out = {}
    for ext in ("png", "svg"):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, bbox_inches="tight", metadata={"Date": None} if ext == "svg" else None)
        path = folder / f"{notebook}__{name}.{ext}"
        atomic_write_bytes(path, buf.getvalue())
        out[ext] = path
    return out


def speedup_bars(table, title: str, ax=None, label_col: str = "variant"):
    """Speed-up over the fp32 baseline per variant with its p10/p90 range, PSNR written on each bar.
    Rows that were not measured are left out of the bars (their reasons are in the table beside)."""
    ok = table[table["status"] == "ok"].copy()
    ok["speedup_lo"] = ok["speedup_lo"].fillna(ok["speedup"])
    ok["speedup_hi"] = ok["speedup_hi"].fillna(ok["speedup"])
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(ok)), 3.6))
    err = [ok["speedup"] - ok["speedup_lo"], ok["speedup_hi"] - ok["speedup"]]
    ax.bar(ok[label_col], ok["speedup"], yerr=err, capsize=4, color=sns.color_palette(n_colors=len(ok)))
    ax.axhline(1.0, color="grey", ls=":")
    psnr = ok.get("image_psnr_db")
    for x, (s, q) in enumerate(zip(ok["speedup"], psnr if psnr is not None else [None] * len(ok))):
        if q is not None and q == q:
            ax.text(x, s, "identical" if q == float("inf") else f"{q:.0f} dB", ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="speed-up vs fp32 eager (x)", title=title)
    ax.tick_params(axis="x", labelrotation=20)
    return ax.figure
