"""Each technique's stand-alone measurement, found in results.csv by its catalog key.

Rows are matched on `key`, `batch_size` and the owning notebook, never on a display label, and only rows of this
machine and commit are read (Recorder.current()).
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from sdperf.optimizations import catalog

# ratio column -> the metric comparison.record stores it under
RATIO_METRICS = {"speedup": "speedup_vs_fp32", "unet_step_speedup": "unet_step_speedup_vs_fp32",
                 "seed_speedup": "seed_speedup_vs_fp32"}
COLUMNS = ["key", "technique", "family", "notebook", "status", "scenario",
           *[c for r in RATIO_METRICS for c in (r, r + "_lo", r + "_hi", r + "_verdict")],
           "image_psnr_db", "changes_output", "method", "note"]


def rows_of(df: pd.DataFrame, tech: catalog.Technique, batch_size: int = 1) -> pd.DataFrame:
    """The rows of `tech` measured alone (its key, own notebook, this batch size), of its most recent scenario."""
    if df.empty or "key" not in df:
        return df.iloc[0:0]
    mine = df[(df["key"].astype(str) == tech.key) & (df["notebook"].astype(str) == tech.notebook)
              & (df["batch_size"] == batch_size)]
    if mine.empty:
        return mine
    latest = mine.sort_values("time_utc").scenario.iloc[-1]
    return mine[mine.scenario == latest]


def table(df: pd.DataFrame, keys: list[str] | None = None, batch_size: int = 1) -> pd.DataFrame:
    """One row per technique: status, each ratio over fp32 eager with its range and verdict, PSNR, method."""
    out = []
    for key in keys if keys is not None else catalog.keys():
        tech = _as_one(key)
        row = {"key": key, "technique": tech.label, "family": tech.family, "notebook": tech.notebook,
               "changes_output": tech.changes_output}
        mine = rows_of(df, tech, batch_size)
        if mine.empty:
            out.append({**row, "status": "not measured",
                        "note": f"no row of this machine and commit in {tech.notebook}"})
            continue
        ok = mine[mine.status == "ok"]
        row.update(scenario=mine.scenario.iloc[0], method=_first(mine["method"]) if "method" in mine else None)
        if ok.empty:
            out.append({**row, "status": mine.status.iloc[0], "note": mine.note.iloc[0]})
            continue
        by_metric = ok.set_index("metric")
        for col, metric in RATIO_METRICS.items():
            if metric in by_metric.index:
                m = by_metric.loc[metric]
                row.update({col: m.value, col + "_lo": m.lo, col + "_hi": m.hi, col + "_verdict": _verdict(m)})
        if "image_psnr_db" in by_metric.index:
            row["image_psnr_db"] = by_metric.loc["image_psnr_db"].value
        out.append({**row, "status": "ok", "note": ""})
    t = pd.DataFrame(out).reindex(columns=COLUMNS)
    for col in [c for c in COLUMNS if c.endswith(("speedup", "_lo", "_hi"))] + ["image_psnr_db"]:
        t[col] = pd.to_numeric(t[col], errors="coerce")
    return t


def _as_one(key: str) -> catalog.Technique:
    """A key's technique; a stack's as one record under its key, label and first part's notebook and family."""
    stack = catalog.Stack.of(key)
    if len(stack.techniques) == 1:
        return stack.techniques[0]
    return dataclasses.replace(stack.techniques[0], key=stack.key, label=stack.label, changes_output=stack.changes_output)


def _verdict(row) -> str | None:
    v = row.get("verdict")
    return v if isinstance(v, str) and v else None


def _first(values):
    v = values.dropna()
    return v.iloc[0] if len(v) else None


def standalone(study, keys: list[str] | None = None, batch_size: int = 1) -> pd.DataFrame:
    """Every catalog technique's stand-alone measurement here ("not measured" where its notebook has not run)."""
    return table(study.recorder.current(), keys, batch_size)


def keeps_picture(row) -> bool:
    """Lossless by declaration, or its quality cost on the trained reference model is within the budget (not PSNR)."""
    from sdperf.judge.techniques import WITHIN

    return (not bool(row["changes_output"])) or row.get("quality_verdict") == WITHIN
