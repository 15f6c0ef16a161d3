"""The scaling figures: published and measured curves on one pair of axes, against perfect linear scaling. Each curve
is normalized to its own smallest size (scale = N / N0), so an 8-GPU DGX sweep and a 1-rank CPU sweep share the axes;
the absolute figure sets samples/s per device side by side on a log axis.
"""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

MEASURED_STYLE = dict(lw=2.6, marker="o", ms=7)
PUBLISHED_STYLE = dict(lw=1.4, marker="s", ms=4, alpha=0.85)


def measured_curves(weak: pd.DataFrame, strong: pd.DataFrame, where: str) -> list[tuple[str, pd.DataFrame]]:
    """(legend label, rows) per measured curve: weak per engine and per-rank batch, strong per global batch."""
    out = []
    for (engine, b), g in weak.groupby(["engine", "per_rank_batch"]):
        if g["world_size"].nunique() > 1:
            out.append((f"measured {where}: {engine}, weak, {b}/rank", g))
    for (engine, glob), g in strong.groupby(["engine", "global_batch"]):
        out.append((f"measured {where}: {engine}, strong, global {glob}", g))
    return out


def scope_note(ax, note: str | None) -> None:
    """What the measured curves can show, in a box under the axes (never over a curve): on a CPU, ranks sharing
    one machine's cores beside GPU clusters show DDP's overhead on one machine, not cluster scaling."""
    if note:
        ax.annotate(textwrap.fill(note, 120), xy=(0.5, 0), xycoords="axes fraction", xytext=(0, -42),
                    textcoords="offset points", ha="center", va="top", fontsize=8,
                    bbox=dict(boxstyle="round,pad=0.4", fc="#fff6d5", ec="0.6"))


def _log2_axes(ax, max_scale: float) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ticks = [2**k for k in range(int(max_scale).bit_length())]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])


def speedup_figure(published: pd.DataFrame, measured: list[tuple[str, pd.DataFrame]], title: str,
                   note: str | None = None):
    """Speed-up over each curve's smallest size against scale, with the perfect-linear diagonal; `note` says under
    the axes what the measured curves can show."""
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    max_scale = max([published["scale"].max()] + [g["scale"].max() for _, g in measured])
    ax.plot([1, max_scale], [1, max_scale], color="grey", ls="--", lw=1, label="perfect linear scaling")
    colors = sns.color_palette("colorblind", n_colors=published["curve"].nunique() + len(measured))
    for color, (curve, g) in zip(colors, published.groupby("curve", sort=False)):
        ax.plot(g["scale"], g["speedup"], color=color, label=f"{curve} (from {g['gpus'].min()} GPUs)",
                **PUBLISHED_STYLE)
    for color, (label, g) in zip(colors[published["curve"].nunique():], measured):
        ax.plot(g["scale"], g["speedup"], color=color, label=label, **MEASURED_STYLE)
    _log2_axes(ax, max_scale)
    ax.set(xlabel="devices / smallest size of the curve (x)", ylabel="samples/s / samples/s at smallest size (x)",
           title=title)
    ax.legend(fontsize=7.5, loc="upper left")
    scope_note(ax, note)
    return fig


def efficiency_figure(published: pd.DataFrame, measured: list[tuple[str, pd.DataFrame]], title: str,
                      note: str | None = None):
    """Scaling efficiency (speed-up / scale) per curve; 1.0 is perfect linear."""
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    colors = sns.color_palette("colorblind", n_colors=published["curve"].nunique() + len(measured))
    for color, (curve, g) in zip(colors, published.groupby("curve", sort=False)):
        ax.plot(g["scale"], g["efficiency"], color=color, label=curve, **PUBLISHED_STYLE)
    for color, (label, g) in zip(colors[published["curve"].nunique():], measured):
        ax.plot(g["scale"], g["efficiency"], color=color, label=label, **MEASURED_STYLE)
    ax.axhline(1.0, color="grey", ls="--", lw=1, label="perfect linear scaling")
    ax.set_xscale("log", base=2)
    ticks = [2**k for k in range(int(published["scale"].max()).bit_length())]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    top = max([1.05] + [g["efficiency"].max() + 0.05 for _, g in measured])
    ax.set(xlabel="devices / smallest size of the curve (x)", ylabel="scaling efficiency (speed-up / scale)",
           ylim=(0, top), title=title)
    ax.legend(fontsize=7.5, loc="lower left")
    scope_note(ax, note)
    return fig


def ratio_figure(ratios: pd.DataFrame):
    """H100 over A100 per node count (NeMo sweep), and the 4-node comparison table with its stated figure."""
    sweep = ratios[ratios["table"].str.startswith("node sweep")]
    comp = ratios[~ratios["table"].str.startswith("node sweep")]
    labels = [f"{int(n)} node{'s' if n > 1 else ''}" for n in sweep["nodes"]]
    labels += [f"{int(n)} nodes, comparison table" for n in comp["nodes"]]
    values = list(sweep["ratio"]) + list(comp["ratio"])
    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    colors = [sns.color_palette("colorblind")[0]] * len(sweep) + [sns.color_palette("colorblind")[1]] * len(comp)
    ax.bar(labels, values, color=colors)
    for x, v in enumerate(values):
        ax.text(x, v - 0.04, f"{v:.2f}x", ha="center", va="top", fontsize=8, color="white")
    if len(comp):
        ax.scatter([len(sweep)], [comp["stated"].iloc[0]], color="black", zorder=3, marker="_", s=400,
                   label=f"NeMo's stated speed-up: {comp['stated'].iloc[0]:g}x")
        ax.legend(fontsize=8, loc="lower right")
    ax.set(ylabel="H100 / A100 throughput (x)", title="NeMo: DGX H100 over DGX A100, SD at 512px (published)")
    ax.tick_params(axis="x", labelrotation=20)
    return fig


def per_device_figure(published: pd.DataFrame, measured: pd.DataFrame, where: str, note: str | None = None):
    """Absolute samples/s per device (GPU or rank) against the number of devices, log-log; the measured median
    with its p10-p90 range over timed steps."""
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    for curve, g in published.groupby("curve", sort=False):
        ax.plot(g["gpus"], g["value"] / g["gpus"], label=curve, **PUBLISHED_STYLE)
    ok = measured[(measured["status"] == "ok") & ~measured["control"].astype(bool)]
    for (engine, b), g in ok.groupby(["engine", "per_rank_batch"]):
        g = g.sort_values("world_size")
        line, = ax.plot(g["world_size"], g["samples_per_s_per_rank"], label=f"measured {where}: {engine}, {b}/rank",
                        **MEASURED_STYLE)
        if {"samples_per_s_p10", "samples_per_s_p90"} <= set(g.columns):  # per rank: global figures / world size
            lo = g["samples_per_s_p10"] / g["world_size"]
            hi = g["samples_per_s_p90"] / g["world_size"]
            ax.errorbar(g["world_size"], g["samples_per_s_per_rank"], yerr=[g["samples_per_s_per_rank"] - lo,
                        hi - g["samples_per_s_per_rank"]], fmt="none", ecolor=line.get_color(), capsize=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="devices (GPUs, or ranks here)", ylabel="samples/s per device",
           title="Training throughput per device: published GPUs and this machine")
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside the curves
    scope_note(ax, note)
    return fig


def memory_figure(measured: pd.DataFrame, where: str):
    """Per-rank peak memory of every configuration that ran, by engine; the hatched part is what the rank held
    before the UNet was built (runtime, libraries, dataset), the rest is training's own."""
    ok = measured[measured["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    if ok.empty:
        ax.text(0.5, 0.5, "no configuration ran", ha="center", transform=ax.transAxes)
        return fig
    engines = list(dict.fromkeys(ok["engine"]))
    colors = dict(zip(engines, sns.color_palette("colorblind", n_colors=len(engines))))
    labels = [f"{r.engine} W{r.world_size} b{r.per_rank_batch}{' ctl' if r.control else ''}" for r in ok.itertuples()]
    ax.bar(labels, ok["peak_memory_mib"], color=[colors[e] for e in ok["engine"]])
    ax.bar(labels, ok["baseline_memory_mib"], color="none", edgecolor="black", hatch="//", lw=0.6,
           label="held before the UNet was built")
    for x, r in enumerate(ok.itertuples()):
        ax.text(x, r.peak_memory_mib, f"+{r.training_memory_mib:.0f}", ha="center", va="bottom", fontsize=8)
    kind = ok["memory_kind"].iloc[0].split(" (")[0]
    ax.set(ylabel="MiB per rank (largest rank)", xlabel="", title=f"Per-rank peak memory ({kind}), {where}")
    ax.legend(fontsize=8, loc="lower right")
    ax.tick_params(axis="x", labelrotation=20)
    return fig
