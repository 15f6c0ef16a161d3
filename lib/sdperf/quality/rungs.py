"""Quality at each rung of the optimization ladder: the speed-quality frontier.

Each rung (a catalog stack key, sdperf.optimizations.catalog) is applied to a fresh fp32 pipeline in this process and
generates the fp32 eager baseline's captions from the same noise (generating images is no timing, so it needs no
process of its own). Against the baseline's images: FID (does the set of pictures move?), CLIP score (does it still
follow the captions?) and per-image PSNR (how far did each picture move?). Speed is each technique's stand-alone row
from its own notebook on this machine at this commit (sdperf.select.standalone); nothing is timed here. A
half-precision rung whose images would overrun `variant_budget_s` (by sdperf.measure.half_budget's one-block probe
against fp32) is skipped with the measured ratio.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from sdperf.measure import drift, half_budget
from sdperf.store import plots
from sdperf.measure.comparison import release
from sdperf.optimizations import catalog
from sdperf.optimizations.catalog import Context, Stack
from sdperf.imagegen import read_manifest
from sdperf.quality import fid, images, score
from sdperf.quality.curve import choose_captions, fresh_folder, images_root, metric_name
from sdperf.quality.quality_settings import QualitySettings
from sdperf.select.standalone import standalone
from sdperf.measure.study import Study

BASELINE = "fp32 eager"


@dataclass
class Rung:
    label: str
    key: str
    status: str  # ok / not_applicable / skipped / failed
    folder: Path | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


def check_keys(keys: list[str]) -> dict[str, Stack]:
    """Each rung's stack by key; an unknown key (or two techniques of one family) is a ConfigError naming why."""
    return {k: Stack.of(k) for k in keys}


def generate(study: Study, s: QualitySettings, keys: list[str], say: Callable[[str], None] = print) -> list[Rung]:
    """The fp32 eager images, then each rung's on the same captions and noise (first row: the baseline), every
    set through sdperf.imagegen.generate_folder (quality.images.generate_images) with the rung's pipeline."""
    stacks = check_keys(keys)
    if not stacks:  # nothing to set beside the baseline: its images would be scored against themselves
        say(f"no rungs asked (the notebook's rungs parameter, or the {study.profile.name} profile's notebooks: "
            "section): no rung images generated")
        return []
    p = study.profile
    captions = choose_captions(s, s.ladder_n_images, p.seed)
    root = images_root(study) / "rungs"
    base_pipe = study.pipeline("float32")
    try:
        start = time.perf_counter()
        images.generate_images(study, captions, [p.guidance_scale], fresh_folder(root / "fp32"), steps=s.steps,
                               pipe=base_pipe)
        per_image = (time.perf_counter() - start) / len(captions)  # wall time of the set, the first call's warm-up
    finally:                                                        # included: a budget estimate, no benchmark
        del base_pipe
        release()
    out = [Rung(BASELINE, "", "ok", root / "fp32")]
    for key, stack in stacks.items():
        out.append(_generate_rung(study, s, key, stack, captions, root, per_image, say))
    return out


def _generate_rung(study, s, key, stack, captions, root, per_image, say) -> Rung:
    p, ctx = study.profile, Context(study.profile, scratch=images_root(study) / ".scratch")
    label = stack.label
    ok, reason = stack.availability(ctx)
    if not ok:
        say(f"{key}: not applicable: {reason}")
        return Rung(label, key, "not_applicable", note=f"not applicable: {reason}")
    halves = {t.dtype for t in stack.techniques if t.family == catalog.PRECISION and t.availability(ctx)[0]}
    for half in sorted(halves):
        why = half_budget.probe(study, half).skip_reason(
            len(captions), p.variant_budget_s, f"{len(captions)} images (from the fp32 images' {per_image:.2f} s each)",
            fp32_generation_s=per_image)
        if why:
            say(f"{key}: skipped: {why}")
            return Rung(label, key, "skipped", note=f"skipped: {why}")
    folder = root / re.sub(r"[^\w.-]", "_", key)
    pipe = None
    try:
        pipe = stack.apply(study.pipeline("float32"), ctx)
        images.generate_images(study, captions, [p.guidance_scale], fresh_folder(folder), steps=stack.steps or s.steps,
                               pipe=pipe, grad_mode=stack.grad_mode, technique=key)
    except Exception as exc:  # recorded with its error; the other rungs still run
        msg = f"{type(exc).__name__}: {exc}"
        say(f"{key}: failed: {msg[:300]}")
        return Rung(label, key, "failed", note=msg[:300])
    finally:
        pipe = None
        release()
    return Rung(label, key, "ok", folder, note=f"{stack.dtype}, {stack.grad_mode}", extra=dict(ctx.facts))


def _pixels(manifest: pd.DataFrame) -> torch.Tensor:
    """The stored PNGs at their generated size as [0, 1] floats (8-bit, as every image here is stored)."""
    u8, _ = images.load_for_scoring(list(manifest["path"]), None)
    return u8.double() / 255


def score_rungs(study: Study, s: QualitySettings, scorers: score.Scorers, rungs: list[Rung]) -> pd.DataFrame:
    """One row per rung: FID and CLIP against the baseline's images, PSNR, stand-alone speed-up if measured."""
    if not rungs:
        return pd.DataFrame(columns=["rung", "key", "status", "n_images", "note"])
    base_m = read_manifest(rungs[0].folder)
    base = score.score_files(scorers, list(base_m["path"]), list(base_m["caption"]))
    base_px, speed = _pixels(base_m), _standalone_speed(study, [r.key for r in rungs[1:]])
    rows = [{"rung": BASELINE, "key": "", "status": "ok", "n_images": base.n, s.label("fid_vs_baseline"): 0.0,
             s.label("clip"): float(np.mean(base.clip)), "clip_change": 0.0, "psnr_db_median": math.inf,
             "speedup_vs_fp32": 1.0, "speedup_lo": 1.0, "speedup_hi": 1.0, "speed_from": "the reference",
             "note": ""}]
    for r in rungs[1:]:
        row = {"rung": r.label, "key": r.key, "status": r.status, "n_images": 0, "note": r.note}
        if r.status == "ok":
            m = read_manifest(r.folder)
            sc = score.score_files(scorers, list(m["path"]), list(m["caption"]))
            row.update({"n_images": sc.n, s.label("fid_vs_baseline"): fid.fid(sc.stats, base.stats),
                        s.label("clip"): float(np.mean(sc.clip)), "clip_change": float(np.mean(sc.clip - base.clip)),
                        "psnr_db_median": float(np.median([drift.psnr(a, b) for a, b in zip(_pixels(m), base_px)])),
                        **speed.get(r.key, {"speed_from": NOT_MEASURED})})
        rows.append(row)
    quality = [c for c in rows[0] if c not in ("speed_from", "note", *SPEED_COLUMNS)]
    cols = quality + SPEED_COLUMNS + ["speed_from", "note"]
    table = pd.DataFrame(rows).reindex(columns=cols)
    _record(study, s, table)
    return table


NOT_MEASURED = "not measured alone on this machine at this commit (run its notebook first)"
SPEED_COLUMNS = ["speedup_vs_fp32", "speedup_lo", "speedup_hi", "speed_verdict", "speed_method"]


def _standalone_speed(study: Study, keys: list[str]) -> dict[str, dict]:
    """Each single-key rung's stand-alone speed-up over fp32 eager, range over rounds, verdict and method, from the
    rows its own notebook stored on this machine at this commit (a stack of several keys was not measured alone)."""
    single = [k for k in keys if len(Stack.of(k).techniques) == 1]
    t = standalone(study, single)
    t = t[(t.status == "ok") & t.speedup.notna()]
    return {r.key: {"speedup_vs_fp32": float(r.speedup), "speedup_lo": r.speedup_lo, "speedup_hi": r.speedup_hi,
                    "speed_verdict": r.speedup_verdict, "speed_method": r.method,
                    "speed_from": f"{r.notebook}: {r.scenario}"} for r in t.itertuples()}


RUNG_METHOD = ("the rung's images of the ladder captions at the profile's guidance, scored against the fp32 eager "
               "images of the same captions and noise: FID between the two sets, CLIP score, per-image PSNR")


def _record(study: Study, s: QualitySettings, table: pd.DataFrame) -> None:
    rec, vs = study.recorder, "vs the fp32 eager images of the same captions and noise"
    metric, rows = metric_name(s, "clip"), []
    for r in table.to_dict("records"):
        scenario = f"rung: {r['rung']}, guidance {study.profile.guidance_scale:g}"
        if r["status"] != "ok":
            rows.append(dict(scenario=scenario, metric=metric, value=None, unit="", status=r["status"],
                             note=r["note"][:500], key=r["key"]))
        else:
            n, key = r["n_images"], r["key"] or catalog.BASELINE_KEY
            common = dict(n=n, key=key, method=RUNG_METHOD)
            rows += [dict(scenario=scenario, metric=metric_name(s, "fid_vs_baseline"),
                          value=r[s.label("fid_vs_baseline")], unit="",
                          note=f"{vs}; n={n}: FID at this N is noisy and biased", **common),
                     dict(scenario=scenario, metric=metric, value=r[s.label("clip")], unit="x100 cos",
                          note=f"mean over images; change vs fp32 {r['clip_change']:+.4f}", **common),
                     dict(scenario=scenario, metric="image_psnr_db_median", value=r["psnr_db_median"], unit="dB",
                          note=vs + " (8-bit PNGs; inf = identical)", **common)]
    rec.add_many(rows)


def plot(study: Study, s: QualitySettings, table: pd.DataFrame):
    """The frontier: stand-alone speed-up (x) against FID vs the fp32 images and CLIP score (y); each rung a
    marker of its own named in one legend beside the axes (no labels over the points)."""
    if table.empty:
        fig, ax = plt.subplots(figsize=(6, 1.6))
        ax.text(0.5, 0.5, "no rungs in this run: no speed-quality frontier", ha="center", va="center")
        ax.set_axis_off()
        return fig
    ok = table[table.status == "ok"].copy()
    ok["speedup_vs_fp32"] = pd.to_numeric(ok["speedup_vs_fp32"], errors="coerce")
    timed = ok[ok.speedup_vs_fp32.notna()]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    markers = "osD^vP*Xh<>p"
    for ax, col in zip(axes, (s.label("fid_vs_baseline"), s.label("clip"))):
        for i, (_, r) in enumerate(timed.iterrows()):
            x = float(r["speedup_vs_fp32"])
            xerr = [[x - float(r["speedup_lo"])], [float(r["speedup_hi"]) - x]]
            ax.errorbar([x], [r[col]], xerr=xerr, fmt=markers[i % len(markers)], color=plt.cm.tab10.colors[i % 10],
                        capsize=3, label=r["rung"])
        ax.axvline(1.0, color="grey", ls=":")
        scale = plots.ratio_scale(ax, [1.0, *timed.speedup_vs_fp32, *timed.speedup_lo, *timed.speedup_hi], "x")
        ax.set(xlabel="speed-up alone vs fp32 eager (x; median, min-max" + (", log)" if scale == "log" else ")"),
               ylabel=col)
    if len(timed):
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.9), fontsize=8, frameon=False)
    missing = sorted(set(ok.rung) - set(timed.rung))
    title = f"speed vs quality at each rung (n={int(ok.n_images.min()) if len(ok) else 0} images per rung)"
    if missing:
        title += f"\nnot timed alone on this machine at this commit: {', '.join(missing)}"
    methods = sorted(set(timed.speed_method.dropna()))
    if methods:
        title += f"\nspeed: {'; '.join(methods)}"
    fig.suptitle(title, fontsize=10)
    n_img = ok.n_images.astype(int)
    rungs_ = ok[ok.rung != BASELINE]
    study.save_figure(fig, "speed_quality_frontier",
                      what="Speed against quality at each ladder rung: each rung's stand-alone speed-up per image "
                      "(median, bars: min-max over rounds, from its own notebook's rows) against the FID and CLIP "
                      "score of its images"
                      + ("" if not s.machinery_reasons("fid") else " (machinery only: "
                         + "; ".join(s.machinery_reasons("fid")) + ")"),
                      baseline="speed: fp32 eager, interpolated per round; quality: the fp32 eager images of the same "
                      "captions and noise",
                      method=f"speed: {'; '.join(methods) or 'no rung timed alone'}; quality: FID and CLIP "
                      f"({s.clip_arch}) of each rung's images, generated in this notebook's process",
                      n=f"{n_img.min() if n_img.min() == n_img.max() else f'{n_img.min()}-{n_img.max()}'} images per "
                      f"rung; {len(timed[timed.rung != BASELINE])} of the {len(rungs_)} rungs beside {BASELINE} timed "
                      "alone on this machine at this commit")
    return fig
