"""NeMo's FID-vs-CLIP protocol in miniature, on the reference model: adherence and domain FID over guidance.

NeMo makes one image per COCO caption at each guidance 1.5-8 with 50 PLMS steps and plots FID against CLIP score.
Here `n` domain captions, caption i with noise seed i at every scale, adherence standing in for CLIP score.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sdperf.store import figure_captions
from sdperf.refmodel import domain, domain_quality, evaluator

NEMO_GUIDANCE = (1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
MODEL = "the study's reference model (sdperf.refmodel, trained here; not SD 1.5)"
SAMPLER = "plms"  # the curve's sampler, as the solves' cache names it (sdperf.judge.converged.Solver)


def run(pipe, net: evaluator.Evaluator, real: domain_quality.Real, guidance_scales, n: int, steps: int,
        keep: int = 4, cache: Path | None = None, model_hash: str = "") -> tuple[pd.DataFrame, dict[float, np.ndarray]]:
    """(a row per guidance scale, its first `keep` images); images read back from `cache` have no time (NaN)."""
    from sdperf.judge import converged

    items = domain_quality.prompts(n)
    captions, truth = [s.caption for s in items], domain.labels_many(items)
    rows, kept = [], {}
    for g in guidance_scales:
        start = time.perf_counter()

        def render(sampler, k, caps, sds, g=g):
            return converged.Solve(*domain_quality.generate_with_latents(pipe, caps, sds, g, k, pad=False))

        solver = converged.Solver(render, model_hash, g, cache)
        images = solver.solve(captions, list(range(n)), steps, sampler=SAMPLER).images
        seconds = time.perf_counter() - start
        scores = evaluator.adherence_checks(evaluator.predict(net, images), truth)
        feats = evaluator.features(net, images)
        mean, lo, hi = domain_quality.mean_interval(scores)
        fid_lo, fid_hi = domain_quality.fid_interval(feats, real)
        rows.append({"guidance": float(g), "n_images": n, "steps": steps, "adherence": mean, "adherence_lo": lo,
                     "adherence_hi": hi, "domain_fid": domain_quality.domain_fid(feats, real), "fid_lo": fid_lo,
                     "fid_hi": fid_hi, "s_per_image": seconds / n if not solver.hits else float("nan"),
                     "from_cache": solver.hits})
        kept[float(g)] = images[:keep]
    return pd.DataFrame(rows), kept


def plot(table: pd.DataFrame, title: str):
    """FID against adherence (NeMo's axes, CLIP -> adherence), and each against guidance, with 95% intervals."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    ax = axes[0]
    xerr = np.vstack([table.adherence - table.adherence_lo, table.adherence_hi - table.adherence])
    yerr = np.vstack([table.domain_fid - table.fid_lo, table.fid_hi - table.domain_fid])
    ax.errorbar(table.adherence, table.domain_fid, xerr=xerr, yerr=yerr, fmt="-", color="0.55", capsize=3, zorder=1)
    colors = plt.cm.viridis(np.linspace(0, 1, len(table)))
    for g, x, y, c in zip(table.guidance, table.adherence, table.domain_fid, colors):
        ax.scatter([x], [y], color=c, s=45, edgecolors="black", linewidths=0.6, zorder=3, label=f"{g:g}")
    ax.set(xlabel="prompt adherence (share of caption claims found)", ylabel="domain FID (lower is better)",
           title="FID vs adherence (colour: guidance scale)")
    axes[1].errorbar(table.guidance, table.adherence, yerr=xerr, fmt="o-", capsize=3)
    axes[1].set(xlabel="guidance scale", ylabel="prompt adherence", ylim=(0, 1), title="adherence vs guidance")
    axes[2].errorbar(table.guidance, table.domain_fid, yerr=yerr, fmt="o-", capsize=3)
    axes[2].set(xlabel="guidance scale", ylabel="domain FID", ylim=(0, None), title="domain FID vs guidance")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.legend(*ax.get_legend_handles_labels(), title="guidance", loc="center left", bbox_to_anchor=(1.0, 0.5),
               fontsize=8, frameon=False)
    return fig


def grid(kept: dict[float, np.ndarray], captions: list[str]):
    """Rows: captions; columns: guidance scales (the same noise across a row)."""
    scales = sorted(kept)
    rows = min(len(v) for v in kept.values())
    fig, axes = plt.subplots(rows, len(scales), figsize=(1.3 * len(scales), 1.45 * rows), squeeze=False)
    for j, g in enumerate(scales):
        for i in range(rows):
            ax = axes[i][j]
            ax.imshow(kept[g][i], interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
            if i == 0:
                ax.set_title(f"g={g:g}", fontsize=8)
    fig.suptitle("samples per guidance scale (same caption and noise across a row):\n" +
                 "\n".join(f"row {i + 1}: {c}" for i, c in enumerate(captions[:rows])), fontsize=7)
    fig.tight_layout()
    return fig


def training_plot(folder, manifest: dict):
    """The stages' training losses (mean per logged window) from the stored training.json, with their times."""
    curves = _curves(folder)
    times = manifest.get("times_s", {})
    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.2), squeeze=False)
    for ax, (stage, curve) in zip(axes[0], curves.items()):
        steps = [c["step"] for c in curve]
        ax.plot(steps, [c["loss"] for c in curve])
        ax.set_yscale("log")
        took = times.get(stage)
        ax.set(xlabel="optimizer step", ylabel="training loss (log)",
               title=f"{stage}" + (f" ({float(took) / 60:.1f} min)" if took else ""))
    fig.suptitle(f"{MODEL}: training curves of `sdperf train-reference` (commit {manifest.get('commit')}, "
                 f"{manifest.get('machine', {}).get('cpu_model', 'the machine in its manifest')})", fontsize=9)
    fig.tight_layout()
    return fig


METHOD = ("n captions of the reference domain, caption i with noise seed i at every scale, PLMS; adherence: mean "
          "over images [BCa bootstrap 95%]; domain FID: evaluator features vs held-out renders [percentile "
          "bootstrap 95% over generated images, recentred on the estimate]")
RENDER_TIME_METHOD = ("wall time of this scale's generation and decoding in batches of 100 prompts, in the "
                      "notebook's kernel, / images (a cost of the curve, not a timing comparison)")


def for_study(study, s, folder=None):
    """The curve of the committed model at the profile's quality.reference_* settings, on the CPU, stored."""
    from sdperf.core.paths import scratch_dir
    from sdperf.judge import converged
    from sdperf.refmodel import storage

    guidance_scales, n, steps = s.reference_guidance_scales, s.reference_n_images, s.reference_steps
    pipe, net, manifest = storage.load(folder)
    real = domain_quality.Real.of(net, manifest["recipe"]["evaluator_held_out"])
    table, kept = run(pipe, net, real, guidance_scales, n, steps, cache=converged.cache_dir(scratch_dir(
        study.profile.name)), model_hash=converged.model_hash(manifest))
    _record(study, table, manifest)
    captions = [s.caption for s in domain_quality.prompts(min(len(v) for v in kept.values()))]
    model = f"reference model at commit {manifest.get('commit')}"
    study.save_figure(plot(table, f"{MODEL}: {n} images per guidance scale, {steps} PLMS steps, "
                                  f"{study.env['device_name']}; bars: 95% bootstrap intervals"), "reference_curve",
                      what=f"{MODEL}: domain FID against prompt adherence over guidance scales "
                      f"{', '.join(f'{g:g}' for g in table.guidance)} (NeMo's FID-vs-CLIP protocol with the study's "
                      "evaluator in CLIP's place), and each against guidance",
                      baseline="domain FID: the evaluator's features of held-out renders of the domain; adherence: "
                      "each image's own caption claims (no ratio)",
                      method=f"{METHOD}; {steps} PLMS steps, on the CPU; {model}",
                      n=f"{n} images per guidance scale, {len(table)} scales",
                      taken_in=dict(study.env, device="cpu"))  # the reference model runs on the CPU
    rows = min(len(v) for v in kept.values())
    study.save_figure(grid(kept, captions), "reference_samples",
                      what=f"{MODEL}: the first {rows} captions' images at every guidance scale (rows: captions, "
                      "columns: guidance scales, the same noise across a row): what the curve scores",
                      baseline=figure_captions.NO_BASELINE + " (images)",
                      method=f"caption i with noise seed i at every scale, {steps} PLMS steps; {model}",
                      n=f"{rows} captions x {len(kept)} guidance scales, of the {n} per scale scored")
    training = folder or storage.default_dir()
    study.save_figure(training_plot(training, manifest), "reference_training",
                      what=f"{MODEL}: the training loss of each stage of `sdperf train-reference` (log axis), as the "
                      "committed model's training.json stored it, with each stage's training time",
                      baseline=figure_captions.NO_BASELINE + " (loss)",
                      method=f"mean training loss per logged window of optimizer steps; {model}, trained on the "
                      "machine its manifest names (the device here), not in this run",
                      n=_training_n(training), taken_in=manifest.get("machine") or {})
    return table, manifest


def _curves(folder) -> dict:
    return json.loads((Path(folder) / "training.json").read_text())


def _training_n(folder) -> str:
    """What the training figure's points are: logged windows per stage."""
    return "; ".join(f"{stage}: {len(c)} logged windows up to step {c[-1]['step'] if c else 0}"
                     for stage, c in _curves(folder).items())


def _record(study, table: pd.DataFrame, manifest: dict) -> None:
    model = f"reference model (commit {manifest['commit']}, files verified against models/reference/manifest.json)"
    rows = []
    for r in table.to_dict("records"):
        scenario = f"reference model, guidance {r['guidance']:g}, {r['steps']} PLMS steps"
        cached = int(r.get("from_cache") or 0)
        images = model + (f"; {cached} of {r['n_images']} images read back from the solves cache of an earlier run "
                          "(same model files, captions, noise, guidance, sampler and steps)" if cached else "")
        rows += [dict(scenario=scenario, metric="reference_adherence", value=r["adherence"], unit="share",
                      lo=r["adherence_lo"], hi=r["adherence_hi"], n=r["n_images"], method=METHOD, note=images),
                 dict(scenario=scenario, metric="reference_domain_fid", value=r["domain_fid"], unit="",
                      lo=r["fid_lo"], hi=r["fid_hi"], n=r["n_images"], method=METHOD, note=images)]
        if not cached:  # a time per image is stated only where the images were made in this run
            rows.append(dict(scenario=scenario, metric="reference_s_per_image", value=r["s_per_image"], unit="s",
                             n=r["n_images"], method=RENDER_TIME_METHOD, note=model))
    study.recorder.add_many(rows)


def verdict(table: pd.DataFrame) -> str:
    """The curve's shape in words: where adherence goes, where FID is lowest, what the intervals resolve."""
    t = table.sort_values("guidance").reset_index(drop=True)
    first, last = t.iloc[0], t.iloc[-1]
    best_a = t.loc[t.adherence.idxmax()]
    best_f = t.loc[t.domain_fid.idxmin()]
    apart = first.adherence_hi < last.adherence_lo or last.adherence_hi < first.adherence_lo
    return (f"adherence goes from {first.adherence:.3f} [{first.adherence_lo:.3f}-{first.adherence_hi:.3f}] at "
            f"guidance {first.guidance:g} to {last.adherence:.3f} [{last.adherence_lo:.3f}-{last.adherence_hi:.3f}] "
            f"at {last.guidance:g} ({'intervals apart' if apart else 'intervals overlap'}); highest at "
            f"{best_a.guidance:g} ({best_a.adherence:.3f}). Domain FID is lowest at guidance {best_f.guidance:g}: "
            f"{best_f.domain_fid:.2f} [{best_f.fid_lo:.2f}-{best_f.fid_hi:.2f}] (at {first.guidance:g}: "
            f"{first.domain_fid:.2f}, at {last.guidance:g}: {last.domain_fid:.2f}).")
