"""The FID-vs-CLIP curve over guidance scales (NeMo's protocol) for this profile, beside stored curves of others.

Each point: `n_images` captions drawn at random (seeded) from the captions file, one image each at that guidance
scale, the same caption and noise at every scale; FID against the reference statistics, CLIP score against the
image's own caption, both on images resized to `score_resolution`.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.lines import Line2D
import pandas as pd

from sdperf.model import prompts
from sdperf.store import figure_captions
from sdperf.imagegen import read_manifest
from sdperf.quality import sharded
from sdperf.core.paths import profile_reports
from sdperf.quality import images, score
from sdperf.quality.quality_settings import QualitySettings
from sdperf.store.results import read_results
from sdperf.measure.study import Study

NOTEBOOK = "12_fid_clip"
SMALL_N = 2048  # below the Inception feature count the covariance is rank-deficient: FID is biased and noisy


def images_root(study: Study) -> Path:
    """Where 12_fid_clip writes its images: under the profile's reports, one folder per image set."""
    return profile_reports(study.profile.name) / "images" / study.notebook


def fresh_folder(path: Path) -> Path:
    """Each run regenerates its images: a folder left by an older run (other code, other weights) is removed."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def choose_captions(s: QualitySettings, n: int, seed: int) -> list[prompts.Caption]:
    """NeMo's draw: `n` captions at random from the file (or the repo's smoke set when none is given)."""
    pool = prompts.load_captions(s.captions) if s.captions else prompts.smoke_captions()
    return prompts.select(pool, n, seed)


def captions_source(s: QualitySettings) -> str:
    return str(s.captions) if s.captions else "the repo's smoke captions (lib/sdperf/data/captions_smoke.txt)"


def protocol(study: Study, s: QualitySettings) -> pd.DataFrame:
    """NeMo's and MLPerf's evaluation settings beside this run's, row by row."""
    p = study.profile
    here_ref = str(s.reference) if s.reference else f"{s.n_images} seeded stand-in images (machinery only)"
    rows = [
        ("captions", "COCO2014 val, drawn at random", "COCO2014 val, 5,000 (one per image)", captions_source(s)),
        ("images per guidance scale", "30,000", "5,000", str(s.n_images)),
        ("guidance scales", "1.5, 2, 3, 4, 5, 6, 7, 8", "8", ", ".join(f"{g:g}" for g in s.guidance_scales)),
        ("sampler, steps", "PLMS, 50", "Euler, 20", f"{p.scheduler}, {s.steps}"),
        ("model, generated size", "SD 1.x / 2.0, 512", "SDXL, 1024", f"{p.arch}, {p.resolution}"),
        ("scored at", "256x256", "1024 (Inception resizes)", f"{s.score_resolution or p.resolution} (PIL bicubic)"),
        ("FID reference", "COCO2014 val images", "val2014.npz (mu, sigma)", here_ref),
        ("FID features", "Inception-v3 pool, 2048", "Inception-v3 pool, 2048", f"Inception-v3, {s.fid_features}"),
        ("CLIP model", "ViT-L/14", "ViT-B/32 (x100)", s.clip_arch),
        ("weights", "trained", "trained", _weights(s)),
    ]
    return pd.DataFrame(rows, columns=["setting", "NeMo (seed)", "MLPerf SDXL", "this run"])


def _weights(s: QualitySettings) -> str:
    return "; ".join(f"{name} {'random init' if path is None else path}" for name, path in
                     (("SD", s.pipeline_weights), ("Inception", s.inception_weights), ("CLIP", s.clip_weights)))


@dataclass
class Curve:
    table: pd.DataFrame
    folder: Path
    reference: score.Reference


def generate(study: Study, s: QualitySettings, say: Callable[[str], None] = print) -> Path:
    """The images of every guidance scale, in the profile's precision (NeMo evaluated its fp16 framework)."""
    p = study.profile
    caps = choose_captions(s, s.n_images, p.seed)
    folder = fresh_folder(images_root(study) / "guidance")
    say(f"generating {len(caps)} images x {len(s.guidance_scales)} guidance scales ({p.dtype}, {s.steps} steps, "
        f"captions from {captions_source(s)})")
    images.generate_images(study, caps, s.guidance_scales, folder, steps=s.steps, dtype=p.dtype, say=say)
    return folder


def skip_reason(study: Study, s: QualitySettings) -> str:
    """Why a run leaves the curve out (12's `sd_curve` parameter off): what it would have scored, and where the
    curve that means something is."""
    machinery = list(dict.fromkeys(s.machinery_reasons("fid") + s.machinery_reasons("clip")))
    what = f"machinery only here ({'; '.join(machinery)})" if machinery else "turned off for this run"
    return (f"{study.profile.arch}'s FID-vs-CLIP curve is {what}; the notebook's sd_curve parameter is off for the "
            f"{study.profile.name} profile. The curve that means something is the reference model's (next section); "
            "the smoke profile's nbval run still draws this one, proving its code path")


def skip(study: Study, s: QualitySettings, say: Callable[[str], None] = print) -> None:
    """The curve left out: one skipped row per metric saying why, so the report shows it was not measured."""
    why = skip_reason(study, s)
    scenario = f"FID-vs-CLIP curve, {study.profile.arch}, guidance {', '.join(f'{g:g}' for g in s.guidance_scales)}"
    for metric in ("fid", "clip"):
        study.recorder.skipped(scenario, why, metric=metric_name(s, metric))
    say(f"no curve images: {why}")


def score_curve(study: Study, s: QualitySettings, scorers: score.Scorers, folder: Path) -> Curve:
    """One point per guidance scale: FID against the reference, mean CLIP score; stored as results rows. Scored
    through sdperf.quality.sharded (one shard in the notebook, N under torchrun)."""
    p = study.profile
    ref = score.reference(scorers, s, n_standin=s.n_images, seed=p.seed + 10_000)
    scored = sharded.score_folder(folder, scorers, name="guidance")  # per-shard statistics, merged
    table = pd.DataFrame([_row(s, g, sc, ref) for g, sc in scored.items()])
    _record(study, s, table, ref)
    return Curve(table, folder, ref)


def _row(s: QualitySettings, guidance: float, sc: score.SetScore, ref: score.Reference) -> dict:
    return {"guidance": guidance, "n_images": sc.n, s.label("fid"): score.fid_against(ref, sc),
            s.label("clip"): float(np.mean(sc.clip)), "clip_p10": float(np.percentile(sc.clip, 10)),
            "clip_p90": float(np.percentile(sc.clip, 90))}


def metric_name(s: QualitySettings, metric: str) -> str:
    """The results.csv metric: machinery-only numbers carry it in their name, never only in a note."""
    base = {"fid": "fid", "fid_vs_baseline": "fid_vs_fp32_images", "clip": "clip_score"}[metric]
    return f"{base} [machinery only]" if s.machinery_reasons(metric) else base


# NeMo's protocol, as 12 runs it: how each curve row was taken
FID_METHOD = ("one image per caption at each guidance scale, same noise seeds; Frechet distance of Inception pool "
              "features (torchmetrics) against the reference set")
CLIP_METHOD = ("the same images: mean of max(100 cos, 0) between CLIP image and caption embeddings, p10/p90 across "
               "images")


def _record(study: Study, s: QualitySettings, table: pd.DataFrame, ref: score.Reference) -> None:
    p, n = study.profile, int(table["n_images"].min())
    small = f"; n={n} < {SMALL_N}: FID is biased upward and noisy at this N" if n < SMALL_N else ""
    why_fid = "; ".join(s.machinery_reasons("fid")) or "real weights and real reference"
    why_clip = "; ".join(s.machinery_reasons("clip")) or f"real {s.clip_arch} weights"
    rows = []
    for vals in table.to_dict("records"):
        scenario = f"guidance {vals['guidance']:g}, {s.steps} {p.scheduler} steps, {p.resolution}px, {p.dtype}"
        rows += [
            dict(scenario=scenario, metric=metric_name(s, "fid"), value=vals[s.label("fid")], unit="", n=n,
                 dtype=p.dtype, method=FID_METHOD, note=f"vs {ref.what}; Inception pool {s.fid_features}, scored at "
                 f"{s.score_resolution or p.resolution}px; {why_fid}{small}"),
            dict(scenario=scenario, metric=metric_name(s, "clip"), value=vals[s.label("clip")], unit="x100 cos",
                 p10=vals["clip_p10"], p90=vals["clip_p90"], n=n, dtype=p.dtype, method=CLIP_METHOD,
                 note=f"{s.clip_arch}; {why_clip}"),
        ]
    study.recorder.add_many(rows)


def stored_curves(profiles: list[str]) -> pd.DataFrame:
    """Curves other profiles stored (one line per profile or checkpoint), from their results.csv."""
    rows = []
    for name in profiles:
        df = read_results(name)
        df = df[(df.notebook == NOTEBOOK) & df.scenario.astype(str).str.startswith("guidance ") & (df.status == "ok")]
        for scenario, g in df.groupby("scenario"):
            vals = dict(zip(g.metric, g.value))
            fid_key = next((k for k in vals if str(k).startswith("fid") and "fp32" not in str(k)), None)
            clip_key = next((k for k in vals if str(k).startswith("clip_score")), None)
            if fid_key and clip_key:
                rows.append({"model": name, "guidance": float(str(scenario).split()[1].rstrip(",")),
                             "fid": float(vals[fid_key]), "clip": float(vals[clip_key]),
                             "machinery": "machinery" in fid_key or "machinery" in clip_key})
    return pd.DataFrame(rows, columns=["model", "guidance", "fid", "clip", "machinery"])


def plot(study: Study, s: QualitySettings, curve: Curve, others: pd.DataFrame | None = None):
    """FID (x) against CLIP score (y), one line per profile (its own marker and line style), each point coloured
    by its guidance scale on one colour bar: no labels over the points, however close they fall."""
    fig, ax = plt.subplots(figsize=(8.5, 5))
    t = curve.table.sort_values("guidance")
    fx, cy = s.label("fid"), s.label("clip")
    lines = [(f"{study.profile.name} (this run, n={int(t.n_images.min())})", t[fx], t[cy], t.guidance)]
    if others is not None and len(others):
        for model, g in others[others.model != study.profile.name].groupby("model"):
            g = g.sort_values("guidance")
            tag = " [machinery only]" if g.machinery.any() else ""
            lines.append((f"{model} (stored){tag}", g.fid, g.clip, g.guidance))
    scales = sorted({float(g) for *_, gs in lines for g in gs})
    norm = Normalize(vmin=min(scales), vmax=max(scales) if max(scales) > min(scales) else min(scales) + 1)
    markers, styles, handles = "osD^vP", ("-", "--", "-.", ":"), []
    for i, (label, x, y, gs) in enumerate(lines):
        marker, ls = markers[i % len(markers)], styles[i % len(styles)]
        ax.plot(x, y, color="0.45", ls=ls, lw=1.2, zorder=1)
        ax.scatter(x, y, c=list(gs), cmap="viridis", norm=norm, marker=marker, s=55, edgecolors="black",
                   linewidths=0.6, zorder=3)
        handles.append(Line2D([], [], color="0.45", ls=ls, marker=marker, markerfacecolor="white",
                              markeredgecolor="black", label=label))
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap="viridis"), ax=ax, label="guidance scale")
    bar.set_ticks(scales, labels=[f"{g:g}" for g in scales])
    ax.set(xlabel=f"{fx} (lower is better)", ylabel=f"{cy} (higher is better)",
           title=f"FID vs CLIP over guidance scales ({s.clip_arch}, scored at {s.score_resolution or 'native'} px)")
    ax.set_xlim(left=0)  # FID from 0: a small gap between guidance scales does not look large
    ax.legend(handles=handles, fontsize=8, loc="best")
    p, n = study.profile, t.n_images.astype(int)
    machinery = list(dict.fromkeys(s.machinery_reasons("fid") + s.machinery_reasons("clip")))
    study.save_figure(fig, "fid_vs_clip",
                      what=f"FID against CLIP score over guidance scales (NeMo's protocol) for {p.name}"
                      + (f" beside the curves {len(lines) - 1} other profile(s) stored" if len(lines) > 1 else "")
                      + (f"; machinery only ({'; '.join(machinery)}): not image quality" if machinery else ""),
                      baseline=f"FID: {curve.reference.what}; CLIP: each image's own caption (no ratio)",
                      method=f"one image per caption at each guidance scale, the same caption and noise at every "
                      f"scale, {s.steps} {p.scheduler} steps, {p.resolution}px, {p.dtype}; FID from Inception-v3 "
                      f"pool features ({s.fid_features}), CLIP score {s.clip_arch} mean of max(100 cos, 0), both on "
                      f"images resized to {s.score_resolution or p.resolution}px",
                      n=f"{n.min() if n.min() == n.max() else f'{n.min()}-{n.max()}'} images per guidance scale "
                      f"here, {len(t)} scales" + ("; stored curves: as their profiles recorded them"
                                                  if len(lines) > 1 else ""))
    return fig


def sample_grid(study: Study, folder: Path, n_captions: int = 4):
    """The first captions' images at every guidance scale, to look at what was scored."""
    m = read_manifest(folder)
    ids = list(dict.fromkeys(m.prompt_id))[:n_captions]
    scales = sorted(m.guidance.unique())
    fig, axes = plt.subplots(len(ids), len(scales), figsize=(1.9 * len(scales), 1.9 * len(ids)), squeeze=False)
    for i, pid in enumerate(ids):
        for j, g in enumerate(scales):
            row = m[(m.prompt_id == pid) & (m.guidance == g)].iloc[0]
            ax = axes[i][j]
            ax.imshow(plt.imread(row.path))
            ax.set_xticks([]), ax.set_yticks([])
            if i == 0:
                ax.set_title(f"guidance {g:g}", fontsize=9)
            if j == 0:
                ax.set_ylabel(row.caption[:28], fontsize=7)
    p = study.profile
    study.save_figure(fig, "samples",
                      what=f"The first {len(ids)} captions' images at every guidance scale (rows: captions, columns: "
                      "guidance scales; the same caption and noise across a row): what the FID and CLIP points "
                      "score", baseline=figure_captions.NO_BASELINE + " (images)",
                      method=f"the curve's images: {p.arch}, {p.dtype}, {p.resolution}px, {p.scheduler} sampler; "
                      f"weights: {p.weights or 'random init (pictures of the machinery, not of a trained model)'}",
                      n=f"{len(ids)} captions x {len(scales)} guidance scales, of the {m.prompt_id.nunique()} "
                      "captions generated")
    return fig
