"""09_fewer_steps: other schedulers at 20-25 steps against PLMS at 50 (the NeMo protocol): time per image, cost
per step, and how far each one's image lands from the 50-step one.

Two questions, measured apart on purpose:
- timing (run_variants, keys `scheduler:<name>@<steps>`): workers run the profile's few steps, so `seed_speedup`
  is composed from the measured stages, the baseline's PLMS at 50 steps against the scheduler at its own count;
  `unet_step_speedup` should stay within noise (a scheduler changes the number of calls, not their cost);
- drift: one pipeline generates the reference (PLMS 50) and each scheduler from the same initial latents, untimed,
  and compares the final latents and images.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sdperf.config import published
from sdperf.measure import drift
from sdperf.store import figure_captions
from sdperf.measure.comparison import BASELINE, TWIN, Comparison, published_row, release, run_variants
from sdperf.experiments.common import baseline_runs, methods_text, ratio_columns, rounds_n
from sdperf.model.generation import generate, initial_latents
from sdperf.optimizations import catalog, fewer_steps as opt
from sdperf.measure.study import Study

DRIFT_MEANING = "trajectory difference from the reference; random weights: not a quality figure"
TIMING_COLUMNS = ["variant", "status", "unet_calls", "s_per_image_seed", "s_per_image_seed_lo", "s_per_image_seed_hi",
                  *ratio_columns("seed_speedup"), "unet_step_s", *ratio_columns("unet_step_speedup"), "rounds",
                  "method", "note"]


def parse(key: str) -> tuple[str, int]:
    """'scheduler:dpmpp-2m@20' -> ('dpmpp-2m', 20), 'scheduler:euler@6:trailing' -> ('euler:trailing', 6): the
    sampler and its steps, checked by the catalog before anything runs."""
    tech = catalog.get(key)
    if tech.family != catalog.SCHEDULER:
        raise ValueError(f"{key!r} is not a scheduler technique; give scheduler:<name>@<steps>[:<spacing>], "
                         f"schedulers: {', '.join(opt.SCHEDULERS)}; spacings: {', '.join(opt.SPACINGS)}")
    return tech.sampler, tech.steps


def check(keys: list[str]) -> list[str]:
    for k in keys:
        parse(k)
    return list(keys)


def compare(study: Study, keys: list[str]) -> Comparison:
    return run_variants(study, check(keys), batch_size=1)


def timing_table(cmp: Comparison) -> pd.DataFrame:
    """The baseline (composed at 50 steps) and each scheduler at its own, with the UNet calls each makes per image."""
    summary = cmp.measured.summary.set_index("config")
    t = cmp.table[cmp.table.variant != TWIN].copy()
    t["unet_calls"] = t.variant.map(summary["seed_unet_calls"])
    for end in ("_lo", "_hi"):  # the per-image seconds' own min-max over rounds, for the figure's bars
        col = "s_per_image_seed" + end
        t[col] = t.variant.map(summary[col]) if col in summary else None
    return t.reindex(columns=TIMING_COLUMNS).reset_index(drop=True)


DRIFT_COLUMNS = ["variant", "unet_calls", "latent_rel_error", "image_psnr_db", "verdict"]
NO_DRIFT = ("not measured: this profile sets scheduler_drift false (random weights: the drift is a trajectory "
            "difference, not quality, and its 50-step reference costs minutes here)")
DRIFT_METHOD = ("one untimed generation per schedule on one fp32 pipeline in this kernel, from the reference "
                "schedule's initial latents; final latents and decoded images compared (sdperf.measure.drift)")


def drift_from_reference(study: Study, reference: str, keys: list[str]) -> pd.DataFrame:
    """Drift from `reference` (the module's second question) per key; scheduler_drift false: no rows, the reason."""
    ref_name, ref_steps = parse(reference)
    if not study.profile.scheduler_drift:
        print(NO_DRIFT)
        return pd.DataFrame(columns=DRIFT_COLUMNS)
    pipe = study.pipeline("float32")
    latents = initial_latents(pipe, study.workload(1))
    opt.apply(pipe, ref_name)
    ref = generate(pipe, study.workload(1, steps=ref_steps), latents=latents)
    rows, rec = [], []
    for key in keys:
        name, steps = parse(key)
        opt.apply(pipe, name)
        out = generate(pipe, study.workload(1, steps=steps), latents=latents)
        d = drift.compare(out, ref)
        verdict = f"{drift.verdict(d)}; {DRIFT_MEANING}"
        rows.append({"variant": key, "unet_calls": opt.unet_calls(pipe, steps), "latent_rel_error":
                     d["latent_rel_error"], "image_psnr_db": d["image_psnr_db"], "verdict": verdict})
        scenario = f"{key}, drift from {reference}, batch 1"
        rec += [dict(scenario=scenario, metric=m, value=d[m], unit=u, n=1, key=key, batch_size=1,
                     method=DRIFT_METHOD, note=verdict) for m, u in (("latent_rel_error", ""), ("image_psnr_db", "dB"))]
    pipe = None
    release()
    study.recorder.add_many(rec)
    return pd.DataFrame(rows)


def _conditions(study: Study, what: str) -> str:
    p, env = study.profile, study.env
    return (f"{what}; {p.arch}, {p.resolution}px, batch 1, float32, {env['device_name']} ({study.device}, "
            f"{env['threads']} threads)")


def published_vs_measured(study: Study, cmp: Comparison, timing: pd.DataFrame) -> pd.DataFrame:
    """NeMo's 50-step PLMS latency beside this machine's; no source publishes the 50 -> 20 step ratio."""
    nemo = published.select("NeMo SD inference", model="SD 1.x", batch_size=1, what="framework fp16 AMP").iloc[0]
    base = timing[timing.variant == BASELINE].iloc[0]
    rows = [published_row("s/image at the reference protocol", published.cite("NeMo SD inference"),
                          nemo.hardware, f"{nemo.settings}; {nemo.what}", nemo.value, float(base["s_per_image_seed"]),
                          _conditions(study, f"fp32 eager, {study.profile.scheduler} at 50 steps composed from the "
                                      f"measured stages; {cmp.method}"), unit="s")]
    ok = timing[(timing.status == "ok") & (timing.variant != BASELINE)]
    fewest = ok.sort_values("unet_calls").head(1)
    if len(fewest):
        f = fewest.iloc[0]
        rows.append(published_row(
            f"{study.profile.scheduler} 50 steps -> {f['variant']} speed-up", "none published (MLPerf's SDXL gate "
            "and the MI300X seed use 20 steps; NeMo uses PLMS 50)", "-", "-", None, float(f["seed_speedup"]),
            _conditions(study, f"per image, composed from the measured stages, {int(base['unet_calls'])} vs "
                        f"{int(f['unet_calls'])} UNet calls; range {f['seed_speedup_lo']:.2f}-"
                        f"{f['seed_speedup_hi']:.2f}x, {f['seed_speedup_verdict']}; {cmp.method}")))
    return pd.DataFrame(rows)


def plot(study: Study, timing: pd.DataFrame, drifts: pd.DataFrame):
    """Per-image time (composed) against UNet calls, and the drift each saving costs; one marker per configuration."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4))
    ok = timing[timing.status == "ok"]
    markers = "osD^vP*Xh<>p"
    style = {v: (plt.cm.tab10.colors[i % 10], markers[i % len(markers)]) for i, v in enumerate(ok["variant"])}
    for r in ok.itertuples():
        y = float(r.s_per_image_seed)
        lo, hi = (getattr(r, "s_per_image_seed_lo", None), getattr(r, "s_per_image_seed_hi", None))
        err = [[y - float(lo)], [float(hi) - y]] if pd.notna(lo) and pd.notna(hi) else None
        color, marker = style[r.variant]
        left.errorbar([r.unet_calls], [y], yerr=err, fmt=marker, color=color, capsize=3, ms=7, label=r.variant,
                      zorder=3)
    left.set(xlabel="UNet calls per image", ylabel="s / image (composed; median, bars: min-max)",
             title=f"cost per image ({study.device})", xlim=(0, np.nanmax(ok["unet_calls"]) * 1.1), ylim=(0, None))
    right.set(xlabel="UNet calls per image", ylabel="PSNR vs the reference (dB)",
              title="drift from the reference image (random weights: trajectory, not quality)")
    if drifts.empty:  # nothing measured: the reason, and no axis furniture that suggests a measurement
        right.text(0.5, 0.5, NO_DRIFT.replace(" (", "\n("), ha="center", va="center", wrap=True, fontsize=8,
                   transform=right.transAxes)
        right.set_xticks([])
        right.set_yticks([])
    else:
        for r in drifts.itertuples():
            color, marker = style.get(r.variant, ("black", "o"))
            right.scatter([r.unet_calls], [r.image_psnr_db], color=color, marker=marker, s=45, zorder=3,
                          label=None if r.variant in style else r.variant)
        right.axhline(40, color="grey", ls=":", label="40 dB: the study's 'visually identical' line")
    handles, labels = left.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    fig.legend(handles + more[0], labels + more[1], loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8,
               frameon=False)
    study.save_figure(fig, "steps_cost_and_drift",
                      what="Schedulers at fewer steps: seconds per image at each scheduler's own step count, "
                      "composed from the stages the workers measured, against UNet calls per image (left), and "
                      "the PSNR of each scheduler's image against the reference scheduler's from the same initial "
                      "latents (right; random weights: trajectory difference, not quality)",
                      baseline=f"left: {figure_captions.NO_BASELINE} (seconds per image; fp32 eager is the "
                      f"50-step {study.profile.scheduler} point); right: the reference scheduler's image",
                      method=(methods_text(ok.get("method", [])) or "fresh process per configuration, rounds in turn")
                      + "; drift from untimed generations on one pipeline",
                      n=rounds_n(study, ok) + ("; drift: one image per scheduler" if len(drifts)
                                               else "; drift: not measured"))
    return fig


# --- schedulers at any step count, composed from the baseline's own workers ---------------------------------
SCHEDULE_METHOD = ("composed per round from the fp32 baseline worker's measured stages (text encoder + UNet calls at "
                   "the scheduler's count + PLMS's scheduler step per call + VAE decode) over the same worker at 50 "
                   "PLMS steps: a scheduler changes the number of UNet calls, not their cost (the timed scheduler "
                   "rows above check that)")


def schedules(study: Study, cmp: Comparison, keys: list[str]) -> pd.DataFrame:
    """Every scheduler of `keys` against PLMS-50, composed from the baseline workers of `cmp` (one per round): how
    10's search prices schedulers, without a process per step count."""
    from sdperf.select import stack_search

    check(keys)
    base = baseline_runs(cmp)
    rows = []
    for key in keys:
        ts = stack_search.timesteps(study.profile, key)
        ratios = [float(r["s_per_image_seed"]) / stack_search.composed_s(r, None, ts, None) for _, r in base.iterrows()]
        secs = [stack_search.composed_s(r, None, ts, None) for _, r in base.iterrows()]
        rows.append({"variant": key, "unet_calls": len(ts), "s_per_image": float(np.median(secs)),
                     "speedup_vs_plms50": float(np.median(ratios)), "lo": float(min(ratios)),
                     "hi": float(max(ratios)), "rounds": len(ratios)})
    t = pd.DataFrame(rows)
    study.recorder.add_many([dict(scenario=f"{r.variant} composed, batch 1", metric="seed_speedup_vs_fp32",
                                  value=r.speedup_vs_plms50, lo=r.lo, hi=r.hi, unit="x", n=r.rounds, key=r.variant,
                                  batch_size=1, method=SCHEDULE_METHOD, note=f"{r.unet_calls} UNet calls vs PLMS-50's 51")
                             for r in t.itertuples()])
    return t


# --- feature caching (DeepCache) ----------------------------------------------------------------------------
CACHING_COLUMNS = ["variant", "status", *ratio_columns("seed_speedup"), "full_call_s", "cached_call_s",
                   "full_calls_at_50", "unet_step_s", "note"]


def check_caching(keys: list[str]) -> list[str]:
    for k in keys:
        if catalog.get(k).family != catalog.CACHING:
            raise ValueError(f"{k!r} is not a feature-caching technique; valid: "
                             f"{', '.join(catalog.keys(family=catalog.CACHING))} (deepcache:<interval>)")
    return list(keys)


def _kinds(raw: pd.DataFrame, variant: str) -> tuple[float, float, float]:
    """(median full call, median cached call, full calls at 50 steps) of a caching configuration's workers."""
    mine = raw[(raw.config == variant) & (raw.status == "ok")]
    kinds = [d for d in mine.get("unet_kind_s", pd.Series(dtype=object)) if isinstance(d, dict)]
    counts = [d for d in mine.get("seed_call_kinds", pd.Series(dtype=object)) if isinstance(d, dict)]
    if not kinds:
        return np.nan, np.nan, np.nan
    return (float(np.median([d["full"] for d in kinds])), float(np.median([d["cached"] for d in kinds])),
            float(counts[0]["full"]) if counts else np.nan)


def caching(study: Study, keys: list[str]) -> pd.DataFrame:
    """DeepCache at each interval against fp32 eager, with the full and cached calls' medians timed apart."""
    cmp = run_variants(study, check_caching(keys), batch_size=1)
    t = cmp.table[~cmp.table.variant.isin([BASELINE, TWIN])].copy()
    got = [_kinds(cmp.measured.raw, v) for v in t.variant]
    t["full_call_s"], t["cached_call_s"], t["full_calls_at_50"] = zip(*got) if got else ([], [], [])
    return t.reindex(columns=CACHING_COLUMNS).reset_index(drop=True)
