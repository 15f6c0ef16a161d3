"""The MLPerf SDXL quality gate: its bounds from the published table (sdperf.config.published), its verdict here.

MLPerf's closed division accepts an SDXL submission when FID and CLIP score (ViT-B/32, x100) of its 5,000 COCO2014
captions (Euler, 20 steps, guidance 8) lie within those bounds. The verdict is given only when the run matches those
conditions with real weights; otherwise it says "not applicable" and why, never a pass or fail of a random network.
"""
from __future__ import annotations

import pandas as pd

from sdperf.config import published
from sdperf.quality.quality_settings import QualitySettings
from sdperf.measure.study import Study

MLPERF = "MLPerf Inference SDXL"
MLPERF_N, MLPERF_GUIDANCE, MLPERF_STEPS, MLPERF_SCHEDULER = 5000, 8.0, 20, "euler"
RESIZE_CAVEAT = ("MLPerf's reference scores the 1024px images with pytorch-fid (bilinear resize to 299 without "
                 "antialiasing); this harness resizes with PIL bicubic to score_resolution, then torchmetrics' "
                 "antialiased bilinear: treat a result within a few tenths of a bound as indicative")


def bounds(metric: str) -> tuple[float, float]:
    t = published.select(MLPERF, metric=metric).sort_values("value")
    return float(t.value.iloc[0]), float(t.value.iloc[-1])


def why_not_applicable(study: Study, s: QualitySettings) -> list[str]:
    """Every way this run differs from the conditions the gate is defined for (empty: the gate applies)."""
    p, out = study.profile, []
    if p.arch != "sdxl":
        out.append(f"the profile's model is {p.arch}, the gate is defined for SDXL")
    out += list(dict.fromkeys(s.machinery_reasons("fid") + s.machinery_reasons("clip")))
    if not s.clip_arch.startswith("ViT-B-32"):
        out.append(f"CLIP model {s.clip_arch}, the gate's is ViT-B/32")
    if MLPERF_GUIDANCE not in s.guidance_scales:
        out.append(f"guidance {MLPERF_GUIDANCE:g} is not among the scales measured")
    if s.n_images != MLPERF_N:
        out.append(f"n_images={s.n_images}, the gate's bounds hold for exactly {MLPERF_N:,} captions")
    if (p.scheduler, s.steps) != (MLPERF_SCHEDULER, MLPERF_STEPS):
        out.append(f"{s.steps} {p.scheduler} steps, the gate's are {MLPERF_STEPS} {MLPERF_SCHEDULER}")
    return out


def verdict(study: Study, s: QualitySettings, curve_table: pd.DataFrame | None) -> dict:
    """{'verdict', 'fid', 'clip', bounds, 'note'}; recorded as one results row. `curve_table` None: the run left
    the curve out (12's sd_curve), which is one more reason the gate cannot be read."""
    fid_lo, fid_hi = bounds("fid")
    clip_lo, clip_hi = bounds("clip_score")
    out = {"fid_bounds": (fid_lo, fid_hi), "clip_bounds": (clip_lo, clip_hi), "fid": None, "clip": None}
    reasons = why_not_applicable(study, s) + (["this run did not measure the curve"] if curve_table is None else [])
    scenario = "MLPerf SDXL closed-division quality gate"
    if reasons:
        why = "; ".join(reasons)
        study.recorder.not_applicable(scenario, why, metric="mlperf_gate_pass")
        return {**out, "verdict": f"not applicable: {why}", "note": ""}
    row = curve_table[curve_table.guidance == MLPERF_GUIDANCE].iloc[0]
    f, c = float(row[s.label("fid")]), float(row[s.label("clip")])
    ok = fid_lo <= f <= fid_hi and clip_lo <= c <= clip_hi
    text = (f"{'pass' if ok else 'fail'}: FID {f:.4f} (bounds {fid_lo}-{fid_hi}), CLIP {c:.4f} "
            f"(bounds {clip_lo}-{clip_hi})")
    study.recorder.add(scenario, "mlperf_gate_pass", 1.0 if ok else 0.0, "bool", n=s.n_images,
                       method=f"this run's curve at guidance {MLPERF_GUIDANCE:g}: its FID and CLIP score, each "
                       "inside MLPerf SDXL's closed-division bounds", note=f"{text}; {RESIZE_CAVEAT}")
    return {**out, "fid": f, "clip": c, "verdict": text, "note": RESIZE_CAVEAT}
