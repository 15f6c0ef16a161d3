"""Quality at each rung of the optimization ladder: the speed-quality frontier.

Each rung is one technique of the ladder's registry (sdperf.experiments.ladder.techniques) applied alone to a
fresh fp32 pipeline, generating the same captions from the same noise as the fp32 eager baseline. Against the
baseline's images: FID (does the set of pictures move?), CLIP score against the captions (does it still follow
them?) and PSNR image by image (how far did each picture move?). Speed comes from what notebooks 02-09 measured
alone for this profile, so this notebook times nothing itself.

Rule (as in 10_ladder): a half-precision rung is first timed on one real UNet block against fp32; if its images
would overrun the profile's `variant_budget_s`, it is recorded as skipped with the measured ratio.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from sdperf import drift
from sdperf.comparison import release
from sdperf.errors import ConfigError
from sdperf.experiments import ladder
from sdperf.measurements import block_comparison
from sdperf.quality import fid, images, score
from sdperf.quality.curve import choose_captions, fresh_folder, images_root, metric_name
from sdperf.quality.settings import QualitySettings
from sdperf.study import Study

BASELINE = "fp32 eager"


@dataclass
class Rung:
    label: str
    key: str
    status: str  # ok / not_applicable / skipped / failed
    folder: Path | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


def check_keys(study: Study, keys: list[str]) -> dict:
    known = ladder.techniques(study)
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ConfigError(f"unknown ladder rung(s) {', '.join(map(repr, unknown))}; valid: {', '.join(known)}")
    return known


def generate(study: Study, s: QualitySettings, keys: list[str], say: Callable[[str], None] = print) -> list[Rung]:
    """The fp32 eager images, then each rung's on the same captions and noise (first row: the baseline)."""
    known = check_keys(study, keys)
    p = study.profile
    plan = images.plan(choose_captions(s, s.ladder_n_images, p.seed), [p.guidance_scale], p.seed)
    root = images_root(study) / "rungs"
    base_pipe = study.pipeline("float32")
    try:
        m = images.generate_with(base_pipe, plan, fresh_folder(root / "fp32"), steps=s.steps,
                                 resolution=p.resolution)
        ratios = _half_ratios(study, base_pipe, [known[k] for k in keys])
    finally:
        del base_pipe
        release()
    per_image = float(np.median(m["seconds"]))
    out = [Rung(BASELINE, "", "ok", root / "fp32")]
    for key in keys:
        out.append(_generate_rung(study, s, known[key], plan, root, per_image, ratios, say))
    return out


def _half_ratios(study: Study, pipe, techs) -> dict[str, float]:
    """float32 time / half time of one real UNet block, for each half precision among the rungs (measured now)."""
    p = study.profile
    halves = {t.half for t in techs if t.half and t.availability[0]}
    return {h: block_comparison(pipe, study.workload(1), getattr(torch, h), device=study.device, warmup=p.warmup,
                                repeats=p.repeats)["speedup"] for h in sorted(halves)}


def _generate_rung(study, s, tech, plan, root, per_image, ratios, say) -> Rung:
    p = study.profile
    ok, reason = tech.availability
    if not ok:
        say(f"{tech.label}: not applicable: {reason}")
        return Rung(tech.label, tech.key, "not_applicable", note=f"not applicable: {reason}")
    if tech.half in ratios:
        predicted = per_image / ratios[tech.half] * len(plan)
        if predicted > p.variant_budget_s:
            why = (f"one UNet block in {tech.half} takes {1 / ratios[tech.half]:.2f}x the float32 time here (measured "
                   f"now), so {len(plan)} images (predicted {predicted:.0f} s from the fp32 images' "
                   f"{per_image:.2f} s each) would exceed variant_budget_s={p.variant_budget_s} s")
            say(f"{tech.label}: skipped: {why}")
            return Rung(tech.label, tech.key, "skipped", note=f"skipped: {why}")
    folder = root / images.safe_name(tech.key)
    try:
        pipe = tech.apply(study.pipeline("float32"))
        images.generate_with(pipe, plan, fresh_folder(folder), steps=s.steps, resolution=p.resolution,
                             grad_mode=tech.grad_mode or "inference_mode")
    except Exception as exc:  # recorded with its error; the other rungs still run
        msg = f"{type(exc).__name__}: {exc}"
        say(f"{tech.label}: failed: {msg[:300]}")
        return Rung(tech.label, tech.key, "failed", note=msg[:300])
    finally:
        pipe = None
        release()
    return Rung(tech.label, tech.key, "ok", folder, note=f"{tech.dtype}, {tech.grad_mode or 'inference_mode'}")


def _pixels(manifest: pd.DataFrame) -> torch.Tensor:
    """The stored PNGs at their generated size as [0, 1] floats (8-bit, as every image here is stored)."""
    u8, _ = images.load_for_scoring(list(manifest["path"]), None)
    return u8.double() / 255


def score_rungs(study: Study, s: QualitySettings, scorers: score.Scorers, rungs: list[Rung]) -> pd.DataFrame:
    """One row per rung: FID and CLIP against the baseline's images, PSNR, stand-alone speed-up if measured."""
    base_m = images.read_manifest(rungs[0].folder)
    base = score.score_files(scorers, list(base_m["path"]), list(base_m["caption"]))
    base_px, speed = _pixels(base_m), _standalone_speed(study)
    rows = [{"rung": BASELINE, "key": "", "status": "ok", "n_images": base.n, s.label("fid_vs_baseline"): 0.0,
             s.label("clip"): float(np.mean(base.clip)), "clip_change": 0.0, "psnr_db_median": math.inf,
             "speedup_vs_fp32": 1.0, "speed_from": "the reference", "note": ""}]
    for r in rungs[1:]:
        row = {"rung": r.label, "key": r.key, "status": r.status, "n_images": 0, "note": r.note}
        if r.status == "ok":
            m = images.read_manifest(r.folder)
            sc = score.score_files(scorers, list(m["path"]), list(m["caption"]))
            fast, where = speed.get(r.key, (None, "not measured alone for this profile (run notebooks 02-09 first)"))
            row.update({"n_images": sc.n, s.label("fid_vs_baseline"): fid.fid(sc.stats, base.stats),
                        s.label("clip"): float(np.mean(sc.clip)), "clip_change": float(np.mean(sc.clip - base.clip)),
                        "psnr_db_median": float(np.median([drift.psnr(a, b) for a, b in zip(_pixels(m), base_px)])),
                        "speedup_vs_fp32": fast, "speed_from": where})
        rows.append(row)
    table = pd.DataFrame(rows)
    _record(study, s, table)
    return table


def _standalone_speed(study: Study) -> dict[str, tuple[float, str]]:
    """Each technique's stand-alone speed-up over fp32 eager, as its own notebook stored it for this profile."""
    t = ladder.standalone(study)
    t = t[(t.status == "ok") & t.speedup.notna()]
    return {r.key: (float(r.speedup), f"{r.notebook}, batch 1") for r in t.itertuples()}


def _record(study: Study, s: QualitySettings, table: pd.DataFrame) -> None:
    rec, vs = study.recorder, "vs the fp32 eager images of the same captions and noise"
    metric, rows = metric_name(s, "clip"), []
    for r in table.to_dict("records"):
        scenario = f"rung: {r['rung']}, guidance {study.profile.guidance_scale:g}"
        if r["status"] == "not_applicable":
            rec.not_applicable(scenario, r["note"].removeprefix("not applicable: "), metric=metric)
        elif r["status"] == "skipped":
            rec.skipped(scenario, r["note"].removeprefix("skipped: "), metric=metric)
        elif r["status"] == "failed":
            rec.failed(scenario, r["note"], metric=metric)
        else:
            n = r["n_images"]
            rows += [dict(scenario=scenario, metric=metric_name(s, "fid_vs_baseline"),
                          value=r[s.label("fid_vs_baseline")], unit="", n=n,
                          note=f"{vs}; n={n}: FID at this N is noisy and biased"),
                     dict(scenario=scenario, metric=metric, value=r[s.label("clip")], unit="x100 cos", n=n,
                          note=f"mean over images; change vs fp32 {r['clip_change']:+.4f}"),
                     dict(scenario=scenario, metric="image_psnr_db_median", value=r["psnr_db_median"], unit="dB",
                          n=n, note=vs + " (8-bit PNGs; inf = identical)")]
    rec.add_many(rows)


def plot(study: Study, s: QualitySettings, table: pd.DataFrame):
    """The frontier: stand-alone speed-up (x) against FID vs the fp32 images and CLIP score (y)."""
    ok = table[table.status == "ok"].copy()
    ok["speedup_vs_fp32"] = pd.to_numeric(ok["speedup_vs_fp32"], errors="coerce")
    timed = ok[ok.speedup_vs_fp32.notna()]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, col in zip(axes, (s.label("fid_vs_baseline"), s.label("clip"))):
        ax.scatter(timed.speedup_vs_fp32, timed[col])
        for rung, x, y in zip(timed.rung, timed.speedup_vs_fp32, timed[col]):
            ax.annotate(rung, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.axvline(1.0, color="grey", ls=":")
        ax.set(xlabel="stand-alone speed-up vs fp32 eager (x, notebooks 02-09)", ylabel=col)
    missing = sorted(set(ok.rung) - set(timed.rung))
    title = f"speed vs quality at each rung (n={int(ok.n_images.min()) if len(ok) else 0} images per rung)"
    if missing:
        title += f"\nnot timed alone for this profile: {', '.join(missing)}"
    fig.suptitle(title, fontsize=10)
    study.save_figure(fig, "speed_quality_frontier")
    return fig
