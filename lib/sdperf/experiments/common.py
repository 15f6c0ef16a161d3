"""Pieces several run_variants notebooks share: the profile's precision as a key prefix, each configuration's
facts as a table, the baseline's own processes, and the speed/memory figure."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from sdperf.comparison import BASELINE, Comparison
from sdperf.plots import speedup_bars
from sdperf.study import Study


def at_dtype(study: Study, key: str) -> str:
    """`key` run in the profile's precision: GPU profiles (float16) are where fused attention kernels and per-op
    overheads matter, and every worker builds the fp32 pipeline, so the cast is a technique of the stack."""
    dtype = study.profile.dtype
    return key if dtype == "float32" else f"precision:{dtype}+{key}"


def facts_table(cmp: Comparison) -> pd.DataFrame:
    """What apply() found in each prepared pipeline (one row per configuration that ran)."""
    return pd.DataFrame([{"variant": k, **v} for k, v in cmp.facts.items() if v])


def baseline_runs(cmp: Comparison) -> pd.DataFrame:
    """Every fp32 eager baseline process of the run (two per round boundary), with all the worker reported."""
    raw = cmp.measured.raw
    return raw[(raw.config == BASELINE) & (raw.status == "ok")]


def speedup_and_memory(study: Study, cmp: Comparison, title: str, name: str):
    """speedup_bars (median with the min-max range over rounds) beside each configuration's own peak memory."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    speedup_bars(cmp.table, title, ax=left)
    ok = cmp.ok()
    right.bar(ok["variant"], ok["peak_memory_mib"], color=plt.cm.tab10.colors[:len(ok)])
    right.set(ylabel="peak memory (MiB)", title="each configuration's own process, timed calls")
    for ax in (left, right):  # long variant names: slanted and right-aligned under their bars
        plt.setp(ax.get_xticklabels(), rotation=35, ha="right", rotation_mode="anchor")
    study.save_figure(fig, name)
    return fig
