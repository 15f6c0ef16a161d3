"""The speed-vs-quality table of 12: each technique's paired quality delta on the reference model beside its
stand-alone speed-up on SD 1.5 at random init (sdperf.select.standalone, as notebooks 01-09 measured it on this
machine) and the published quality cost where one exists. A technique not timed alone says so instead of a number.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sdperf.config import published
from sdperf.judge import techniques

QUALITY_MODEL = "reference model (trained here, sdref)"
NOT_TIMED = "not timed alone on this machine at this commit"
COLUMNS = ("n_images", "cached_images", "steps", "adherence", "adherence_delta", "adherence_delta_lo",
           "adherence_delta_hi", "soft_adherence_delta", "soft_adherence_delta_lo", "soft_adherence_delta_hi",
           "latent_mse", "ssim", "psnr_db_median", "fid_delta", "fid_delta_lo", "fid_delta_hi", "fid_verdict",
           "kid_delta", "kid_delta_lo", "kid_delta_hi", "kid_verdict", "quality_verdict", "verdict_by_guidance")


def table(study, quality: pd.DataFrame) -> pd.DataFrame:
    """One row per key: quality deltas with intervals and verdicts, the SD 1.5 speed-up, the published cost."""
    from sdperf.select.standalone import standalone

    keys = [k for k in quality.key if _technique(k)]
    speed = standalone(study, keys).set_index("key") if keys else pd.DataFrame()
    pub = published.technique_quality()
    rows = []
    for r in quality.to_dict("records"):
        row = {"key": r["key"], "technique": r.get("label"), "status": r["status"],
               **{c: r.get(c) for c in COLUMNS}, "why_judged": r.get("why_judged")}
        if r["status"] != "ok":
            row["quality_verdict"] = r.get("note")
        s = speed.loc[r["key"]] if r["key"] in speed.index else None
        if s is not None and s.status == "ok" and pd.notna(s.speedup):
            row.update(sd15_speedup=s.speedup, sd15_speedup_lo=s.speedup_lo, sd15_speedup_hi=s.speedup_hi,
                       sd15_speed_verdict=s.speedup_verdict, sd15_speed_method=s.method)
        elif _technique(r["key"]):
            row["sd15_speed_verdict"] = (NOT_TIMED if s is None or s.status in ("not measured", "ok")
                                         else f"{s.status}: {s.note}")
        if r["key"] in pub.index:
            p = pub.loc[r["key"]]
            row.update(published_cost=p.published_cost, published_where=p.published_where,
                       published_source=p.published_source)
        rows.append(row)
    return pd.DataFrame(rows)


def _technique(key: str) -> bool:
    """A catalog technique (not the converged reference, a control or the seeds' sampler)."""
    from sdperf.judge import controls

    return not (controls.is_control(key) or str(key).startswith(techniques.REFERENCE)
                or key == techniques.SEEDS_SAMPLER)


def plot(study, quality: pd.DataFrame):
    """Forest plot: each key's paired adherence and soft-adherence delta with its 95% interval, the budget dashed."""
    t = quality[(quality.status == "ok") & ~quality.key.astype(str).str.startswith(techniques.REFERENCE)].iloc[::-1]
    colors = {techniques.WITHIN: "tab:green", techniques.OVER: "tab:red", techniques.UNDECIDED: "tab:orange"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.32 * len(t) + 1.8), sharey=True)
    y = np.arange(len(t))
    for ax, col, what in ((axes[0], "adherence_delta", "adherence change (share of caption claims)"),
                          (axes[1], "soft_adherence_delta", "soft adherence change (evaluator's probability)")):
        x = t[col].astype(float).to_numpy()
        err = np.vstack([x - t[col + "_lo"].astype(float), t[col + "_hi"].astype(float) - x])
        for yi, xi, e, v in zip(y, x, err.T, t.quality_verdict):
            ax.errorbar(xi, yi, xerr=e[:, None], fmt="o", capsize=3, color=colors.get(v, "tab:gray"))
        ax.axvline(0, color="black", lw=0.8)
        ax.axvline(-techniques.ADHERENCE_BUDGET, color="tab:red", ls="--", lw=0.8)
        ax.set(xlabel=f"{what}\nred dashes: the budget (-1 point)")  # said under the axes: a legend box covered points
    axes[0].set_yticks(y, t.key)
    ns = sorted({int(v) for v in t.n_images.dropna()}) if "n_images" in t else []
    n = f"{ns[0]}-{ns[-1]}" if len(ns) > 1 else (str(ns[0]) if ns else "0")
    reference = quality.loc[quality.key.astype(str).str.startswith(techniques.REFERENCE), "key"]
    ref = reference.iloc[0] if len(reference) else "the converged solve"
    fig.suptitle(f"What each technique costs on the {QUALITY_MODEL}: paired deltas vs the converged fp32 solve "
                 f"({ref}; n={n} captions, same noise), 95% bootstrap intervals; green: within budget, orange: "
                 "undecided, red: over (verdict: worst over the judged guidances)", fontsize=9)
    fig.tight_layout()
    study.save_figure(fig, "reference_technique_quality",
                      what=f"What each technique alone, the seeds' fp32 PLMS-50 and the controls cost in quality on "
                      f"the {QUALITY_MODEL}: paired adherence change (left) and soft-adherence change (right) against "
                      "the converged fp32 solve, the budget dashed; green within budget, orange undecided, red over",
                      baseline=f"the reference model's converged fp32 solve ({ref}) of the same captions and noise",
                      method=techniques.METHOD + "; on the CPU",
                      n=f"{n} paired images per key (sequential: batches until the intervals settle), {len(t)} keys",
                      taken_in=dict(study.env, device="cpu"))  # the reference model runs on the CPU
    return fig
