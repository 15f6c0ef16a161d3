"""The speed-vs-quality table of 12: each technique's paired quality delta on the reference model beside its
stand-alone speed-up on SD 1.5 (random init) and the published quality cost where one exists.

Two models, said in every column title: quality on the study's trained reference model (sdperf.reference), speed
on the profile's SD architecture at random init, as notebooks 01-09 measured it in fresh processes on this machine
at this commit (sdperf.standalone, by catalog key). A technique not timed alone here says so instead of a number.
"""
from __future__ import annotations

from importlib import resources

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sdperf.reference import techniques

QUALITY_MODEL = "reference model (trained here, sdref)"
NOT_TIMED = "not timed alone on this machine at this commit"


def published() -> pd.DataFrame:
    """The published quality cost of a technique, with its source, settings and hardware (by catalog key)."""
    with resources.files("sdperf.data").joinpath("published_technique_quality.csv").open() as fh:
        return pd.read_csv(fh)


def table(study, quality: pd.DataFrame) -> pd.DataFrame:
    """One row per technique: quality deltas with intervals and verdict, speed-up with its range, published cost."""
    from sdperf.standalone import standalone

    keys = [k for k in quality.key if k != techniques.BASELINE]
    speed = standalone(study, keys).set_index("key") if keys else pd.DataFrame()
    pub = published().set_index("key")
    rows = []
    for r in quality.to_dict("records"):
        row = {"key": r["key"], "technique": r.get("label"), "status": r["status"],
               "adherence": r.get("adherence"), "adherence_delta": r.get("adherence_delta"),
               "adherence_delta_lo": r.get("adherence_delta_lo"), "adherence_delta_hi": r.get("adherence_delta_hi"),
               "domain_fid": r.get("domain_fid"), "fid_delta": r.get("fid_delta"), "fid_delta_lo": r.get("fid_delta_lo"),
               "fid_delta_hi": r.get("fid_delta_hi"), "psnr_db_median": r.get("psnr_db_median"),
               "quality_verdict": r.get("quality_verdict") if r["status"] == "ok" else r.get("note")}
        s = speed.loc[r["key"]] if r["key"] in speed.index else None
        if s is not None and s.status == "ok" and pd.notna(s.speedup):
            row.update(sd15_speedup=s.speedup, sd15_speedup_lo=s.speedup_lo, sd15_speedup_hi=s.speedup_hi,
                       sd15_speed_verdict=s.speedup_verdict, sd15_speed_method=s.method)
        elif r["key"] != techniques.BASELINE:
            row["sd15_speed_verdict"] = (NOT_TIMED if s is None or s.status in ("not measured", "ok")
                                         else f"{s.status}: {s.note}")
        if r["key"] in pub.index:
            p = pub.loc[r["key"]]
            row.update(published_cost=p.published_cost, published_where=f"{p.model_hardware}, {p.settings}",
                       published_source=f"{p.source} ({p.source_url})")
        rows.append(row)
    return pd.DataFrame(rows)


def plot(study, quality: pd.DataFrame):
    """Forest plot: each technique's paired adherence and domain-FID delta with its 95% interval, the budget
    shaded; grey where a technique did not run here."""
    t = quality[(quality.status == "ok") & (quality.key != techniques.BASELINE)].iloc[::-1]
    base_fid = float(quality.loc[quality.key == techniques.BASELINE, "domain_fid"].iloc[0])
    colors = {techniques.WITHIN: "tab:green", techniques.OVER: "tab:red", techniques.UNDECIDED: "tab:orange"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.32 * len(t) + 1.8), sharey=True)
    y = np.arange(len(t))
    for ax, col, budget, what in ((axes[0], "adherence_delta", -techniques.ADHERENCE_BUDGET,
                                   "adherence change (share of caption claims)"),
                                  (axes[1], "fid_delta", techniques.FID_BUDGET_REL * base_fid,
                                   "domain FID change (lower is better)")):
        x = t[col].astype(float).to_numpy()
        err = np.vstack([x - t[col + "_lo"].astype(float), t[col + "_hi"].astype(float) - x])
        for yi, xi, e, v in zip(y, x, err.T, t.quality_verdict):
            ax.errorbar(xi, yi, xerr=e[:, None], fmt="o", capsize=3, color=colors.get(v, "tab:gray"))
        ax.axvline(0, color="black", lw=0.8)
        ax.axvline(budget, color="tab:red", ls="--", lw=0.8)
        ax.set(xlabel=f"{what}\nred dashes: the budget")  # said under the axes: a legend box covered points
    axes[0].set_yticks(y, t.key)
    n = int(t.n_images.iloc[0]) if "n_images" in t and len(t) else 0
    fig.suptitle(f"What each technique costs on the {QUALITY_MODEL}: paired deltas vs its fp32 images "
                 f"(n={n} captions, same latents), 95% bootstrap intervals; green: within budget, orange: "
                 "undecided, red: over", fontsize=9)
    fig.tight_layout()
    steps = sorted({int(v) for v in quality.get("steps", pd.Series([], dtype=float)).dropna()})
    study.save_figure(fig, "reference_technique_quality",
                      what=f"What each technique costs in quality on the {QUALITY_MODEL}: its paired adherence "
                      "change (left) and domain-FID change (right) against its own fp32 images, the budget dashed; "
                      "green within budget, orange undecided, red over",
                      baseline="the reference model's fp32 PLMS images of the same captions and initial latents",
                      method=techniques.METHOD + ("; " + ", ".join(map(str, steps)) + " PLMS steps" if steps else "")
                      + "; on the CPU",
                      n=f"{n} paired images per technique, {len(t)} techniques",
                      taken_in=dict(study.env, device="cpu"))  # the reference model runs on the CPU
    return fig
