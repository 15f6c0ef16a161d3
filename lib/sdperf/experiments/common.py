"""Pieces several run_variants notebooks share (candidates for comparison.py / plots.py)."""
from __future__ import annotations

import matplotlib.pyplot as plt

from sdperf.comparison import Comparison
from sdperf.optimizations import half_precision
from sdperf.plots import speedup_bars
from sdperf.study import Study


def at_dtype(pipe, dtype: str):
    """The profile's precision for the variants: run_variants hands apply() an fp32 pipeline, and GPU profiles
    (float16) are where fused attention kernels and per-op overheads matter."""
    return pipe if dtype == "float32" else half_precision.apply(pipe, dtype)


def speedup_and_memory(study: Study, cmp: Comparison, title: str, name: str):
    """speedup_bars beside the peak memory of each measured variant's timed calls."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    speedup_bars(cmp.table, title, ax=left)
    ok = cmp.ok()
    right.bar(ok["variant"], ok["peak_memory_mib"], color=plt.cm.tab10.colors[:len(ok)])
    kind = cmp.baseline.timing.memory_kind.split(" (")[0]
    right.set(ylabel="peak memory (MiB)", title=f"{kind} during the timed calls")
    for ax in (left, right):  # long variant names: slanted and right-aligned under their bars
        plt.setp(ax.get_xticklabels(), rotation=35, ha="right", rotation_mode="anchor")
    study.save_figure(fig, name)
    return fig
