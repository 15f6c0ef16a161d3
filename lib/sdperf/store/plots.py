"""One look for every figure, saved as PNG (for the report) and SVG (for papers) with its caption
(sdperf.store.figure_captions) under reports/<profile>/figures; ratio axes that turn logarithmic past a 10x span."""
from __future__ import annotations

import io
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from sdperf.store import figure_captions, staging
from sdperf.store.figure_captions import Caption
from sdperf.store.results import atomic_write_bytes

STYLE = dict(style="whitegrid", context="notebook", palette="colorblind")


def use_style() -> None:
    sns.set_theme(**STYLE)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 150, "figure.autolayout": True,
                         "svg.hashsalt": "sdperf"})  # fixed ids keep SVGs diff-stable between runs


def save_figure(fig, profile: str, notebook: str, name: str, caption: Caption) -> dict[str, Path]:
    """Write <notebook>__<name>.png/.svg and its caption, caption first, atomically; returns their paths."""
    from sdperf.core.environment import run_id

    if not isinstance(caption, Caption):
        raise TypeError(f"save_figure({name!r}) needs a figure_captions.Caption, not {type(caption).__name__}")
    folder = staging.figure_dir(profile, notebook, run_id())
    text = caption.to_json()
    out = {"caption": figure_captions.sidecar(folder / f"{notebook}__{name}.png")}
    atomic_write_bytes(out["caption"], text.encode("utf-8"))
    for ext in ("png", "svg"):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, bbox_inches="tight", metadata={"Date": None} if ext == "svg" else None)
        path = folder / f"{notebook}__{name}.{ext}"
        atomic_write_bytes(path, buf.getvalue())
        out[ext] = path
    return out


LOG_ABOVE = 10.0  # a ratio axis turns logarithmic when the ratios it draws span more than this factor


def ratio_scale(ax, values, axis: str = "y") -> str:
    """A log scale ('0.05x', '1x') when the ratios span more than LOG_ABOVE; returns 'log' or 'linear'."""
    if axis not in ("x", "y"):
        raise ValueError(f"ratio_scale: axis {axis!r}; valid: 'x', 'y'")
    v = pd.to_numeric(pd.Series(list(values), dtype="object"), errors="coerce").astype(float).to_numpy()
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) == 0 or v.max() / v.min() <= LOG_ABOVE:
        return "linear"
    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    subs = (1.0, 2.0, 5.0) if np.log10(v.max() / v.min()) <= 3 else (1.0,)
    target.set_major_locator(LogLocator(base=10, subs=subs))
    target.set_minor_locator(NullLocator())
    target.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    (ax.set_ylim if axis == "y" else ax.set_xlim)(v.min() / 1.6, v.max() * 1.6)
    return "log"


def speedup_bars(table, title: str, ax=None, label_col: str = "variant"):
    """Speed-up over fp32 per variant, median with min-max over rounds, PSNR on each bar; unmeasured rows left out."""
    ok = table[table["status"] == "ok"].copy()
    ok["speedup_lo"] = ok["speedup_lo"].fillna(ok["speedup"])
    ok["speedup_hi"] = ok["speedup_hi"].fillna(ok["speedup"])
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(ok)), 4.2))
    err = [ok["speedup"] - ok["speedup_lo"], ok["speedup_hi"] - ok["speedup"]]
    labels = ["\n".join(textwrap.fill(part, 26) for part in str(v).split("\n")) for v in ok[label_col]]
    ax.bar(labels, ok["speedup"], yerr=err, capsize=4, color=sns.color_palette(n_colors=len(ok)))
    ax.axhline(1.0, color="grey", ls=":")
    psnr = ok.get("image_psnr_db")
    for x, (hi, q) in enumerate(zip(ok["speedup_hi"], psnr if psnr is not None else [None] * len(ok))):
        if q is not None and q == q:  # above the range bar's cap, not over it
            ax.annotate("identical" if q == float("inf") else f"{q:.0f} dB", (x, hi), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8)
    scale = ratio_scale(ax, [1.0, *ok["speedup"], *ok["speedup_lo"], *ok["speedup_hi"]])
    if scale == "linear" and len(ok):  # room above the tallest range for its PSNR label
        ax.set_ylim(0, max(1.0, float(ok["speedup_hi"].max())) * 1.15)
    ax.set(ylabel="speed-up vs fp32 eager (x" + (", log)" if scale == "log" else ")"), title=title)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")  # long names side by side
    return ax.figure
