"""Pieces several run_variants notebooks share: the keys a notebook compares, the profile's precision as a key
prefix, each configuration's facts as a table, the baseline's own processes, and the speed/memory figure."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from sdperf.config.profiles import load_profile
from sdperf.measure.comparison import BASELINE, Comparison
from sdperf.optimizations import catalog
from sdperf.store.plots import speedup_bars
from sdperf.measure.study import Study


def profile_keys(profile: str | None, given: list | None, notebook: str | None, *families: str,
                 lossy: bool | None = None) -> list[str]:
    """The keys a notebook compares: `given` when a caller set them (papermill -p, JupyterLab), else those of the
    profile's one technique list that `notebook` owns, of `families` (sdperf.optimizations.catalog.among)."""
    if given is not None:
        return list(given)
    return catalog.among(load_profile(profile, check_runtime=False).techniques, notebook, families, lossy)


def ratio_columns(*ratios: str) -> list[str]:
    """Each ratio's table columns: its median, its min-max over rounds and its verdict."""
    return [f"{r}{end}" for r in ratios for end in ("", "_lo", "_hi", "_verdict")]


def at_dtype(study: Study, key: str) -> str:
    """`key` run in the profile's precision (every worker builds fp32, so the cast is a technique of the stack)."""
    dtype = study.profile.dtype
    return key if dtype == "float32" else f"precision:{dtype}+{key}"


def facts_table(cmp: Comparison) -> pd.DataFrame:
    """What apply() found in each prepared pipeline, one row per configuration that ran."""
    return pd.DataFrame([{"variant": k, **v} for k, v in cmp.facts.items() if v])


def with_skipped(cmp: Comparison, skipped: list[dict]) -> Comparison:
    """`cmp` with the rows of configurations skipped before anything ran, in its table's columns."""
    if skipped:
        cmp.table = pd.concat([cmp.table, pd.DataFrame(skipped)], ignore_index=True).reindex(columns=cmp.table.columns)
    return cmp


def baseline_runs(cmp: Comparison) -> pd.DataFrame:
    """Every fp32 eager baseline process of the run (two per round boundary), with all the worker reported."""
    raw = cmp.measured.raw
    return raw[(raw.config == BASELINE) & (raw.status == "ok")]


def rounds_n(study: Study, table: pd.DataFrame) -> str:
    """What a comparison figure's medians are over, read from the rows it draws: rounds per configuration."""
    ok = table[table.status == "ok"] if "status" in table else table
    if "variant" in ok:  # the baseline's bar is 1 by definition; its processes open and close every round
        ok = ok[ok.variant != BASELINE]
    if ok.empty:
        return "no configuration measured beside the baseline"
    r = pd.to_numeric(ok["rounds"], errors="coerce").dropna().astype(int) if "rounds" in ok else pd.Series([])
    if r.empty:
        return f"{len(ok)} configuration(s) beside the baseline; their rounds are not in the table drawn"
    span = str(r.min()) if r.min() == r.max() else f"{r.min()}-{r.max()}"
    reps = study.profile.repeats
    return (f"{span} rounds per configuration ({len(ok)} beside {BASELINE}), each round one fresh process per "
            f"configuration timing {reps} generation{'s' if reps != 1 else ''} after its first call")


def rounds_method(cmp: Comparison, table: pd.DataFrame | None = None) -> str:
    """The methods of the rows a figure draws, each stated once (methods_text), else the comparison's."""
    t = cmp.table if table is None else table
    return methods_text(t.get("method", pd.Series([], dtype=object))) or cmp.method


def methods_text(methods) -> str:
    """Distinct methods joined; one extending another (a loop-only stack's 'composed' suffix) adds its extension."""
    unique = list(dict.fromkeys(m for m in methods if isinstance(m, str) and m))
    out = []
    for m in unique:
        base = max((b for b in unique if b != m and m.startswith(b)), key=len, default="")
        out.append(m[len(base):].lstrip("; ") if base else m)
    return "; ".join(out)


def interpolated(baseline: str, batch_size: int = 1) -> str:
    """A comparison figure's baseline in words: `baseline` in processes of its own, interpolated per round."""
    return (f"{baseline} at batch {batch_size}, its own processes before and after each configuration's, "
            "interpolated to that configuration's time in each round")


def speedup_and_memory(study: Study, cmp: Comparison, title: str, name: str, what: str, baseline: str = BASELINE):
    """speedup_bars beside each configuration's peak memory; `what` opens the caption, `baseline` names fp32 eager's."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    speedup_bars(cmp.table, title, ax=left)
    ok = cmp.ok()
    right.bar(ok["variant"], ok["peak_memory_mib"], color=plt.cm.tab10.colors[:len(ok)])
    right.set(ylabel="peak memory (MiB)", title="each configuration's own process, timed calls")
    for ax in (left, right):  # long variant names: slanted and right-aligned under their bars
        plt.setp(ax.get_xticklabels(), rotation=35, ha="right", rotation_mode="anchor")
    study.save_figure(fig, name, what=f"{what}: speed-up per image at the profile's steps (left; bars: min-max over "
                      "rounds, label: PSNR vs fp32) and each configuration's peak RSS in its own process (right)",
                      baseline=interpolated(baseline) + " (memory: absolute MiB)", method=rounds_method(cmp),
                      n=rounds_n(study, cmp.table))
    return fig
