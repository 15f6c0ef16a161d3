"""09_fewer_steps: PLMS at 50 steps (the reference) against other schedulers at 20-25 steps, one pipeline,
the same initial latents, s/image, cost per step and drift from the 50-step image.

run_variants() times every variant at the profile's step count; here each variant has its own step count and
scheduler, so the pieces it is made of (timed_generation, record_run, timing.ratio, drift.compare,
record_comparison) are called directly. One pipeline serves every variant: a scheduler switch changes no
network, so the first call's warm-up is paid once, before anything is timed.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sdperf import drift, published
from sdperf.comparison import published_row, record_comparison, record_run, release
from sdperf.generation import generate, initial_latents
from sdperf.measurements import GenerationRun, timed_generation
from sdperf.optimizations import fewer_steps as opt
from sdperf.study import Study
from sdperf.timing import StageClock, ratio

COLUMNS = ["variant", "scheduler", "steps", "unet_calls", "repeats", "latency_s", "p10_s", "p90_s", "s_per_image",
           "s_per_iteration", "unet_step_s", "scheduler_share_percent", "speedup", "speedup_lo", "speedup_hi",
           "unet_step_speedup", "latent_rel_error", "image_psnr_db", "verdict"]
# With random weights the drift measures how far each solver's trajectory lands from the reference's, not quality.
DRIFT_MEANING = "trajectory difference from the reference; random weights: not a quality figure"


def label(scheduler: str, steps: int) -> str:
    return f"{scheduler} {steps} steps"


def parse(entries) -> list[tuple[str, int]]:
    """[[scheduler, steps], ...] from the notebook's parameters, checked before anything runs."""
    out = []
    for entry in entries:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise ValueError(f"each variant is [scheduler, steps], got {entry!r}")
        opt.check_scheduler(entry[0])
        opt.check_steps(entry[1])
        out.append((entry[0], entry[1]))
    return out


def plan(study: Study, pipe, configs: list[tuple[str, int]], budget_s: float) -> pd.DataFrame:
    """Warm the pipeline with one short generation (not recorded: it carries the first-call cost) and
    choose each variant's timed repeats: the profile's, cut (never below 1) so that one variant's first call,
    warm-up and repeats fit in `budget_s` at the per-call cost this warm-up measured."""
    p = study.profile
    scheduler, _ = configs[0]
    opt.apply(pipe, scheduler)
    workload = study.workload(1, steps=2)
    clock = StageClock(study.device)
    generate(pipe, workload, clock=clock)
    rec = clock.collect()
    calls = len(rec["unet"])
    per_call = (sum(rec["unet"]) + sum(rec["scheduler"])) / calls
    fixed = sum(rec["text_encoder"]) + sum(rec["vae_decode"])
    rows = []
    for scheduler, steps in configs:
        opt.apply(pipe, scheduler)
        n_calls = opt.unet_calls(pipe, steps)
        estimate = fixed + n_calls * per_call
        untimed = 1 + max(p.warmup - 1, 0)
        repeats = max(1, min(p.repeats, math.floor(budget_s / estimate) - untimed))
        rows.append({"variant": label(scheduler, steps), "scheduler": scheduler, "steps": steps,
                     "unet_calls": n_calls, "repeats": repeats, "generations": untimed + repeats})
    return pd.DataFrame(rows)


def _per_step(run: GenerationRun) -> dict:
    """What one denoising iteration costs: should not depend on the scheduler or the step count."""
    scheduler = float(run.stages.set_index("stage").loc["scheduler", "seconds_per_image_call"])
    loop = run.loop_seconds
    return {"unet_calls": run.iterations, "s_per_iteration": loop / run.iterations,
            "unet_step_s": run.unet_step_seconds, "scheduler_share_percent": 100.0 * scheduler / loop}


def _comparison(reference: GenerationRun, run: GenerationRun) -> dict:
    """What compare_runs gives, for runs whose step counts differ on purpose."""
    cmp = {"variant": run.label, "baseline": f"{reference.label} (fp32 eager, the reference)"}
    cmp.update(ratio(reference.timing, run.timing))
    cmp["unet_step_speedup"] = reference.unet_step_seconds / run.unet_step_seconds
    cmp.update(drift.compare(run.output, reference.output))
    cmp["verdict"] = f"{drift.verdict(cmp)}; {DRIFT_MEANING}"
    return cmp


def compare_schedulers(study: Study, reference: tuple[str, int], variants: list[tuple[str, int]],
                       budget_s: float) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, GenerationRun]]:
    """(table, plan, runs): the reference first, then each variant, all on one pipeline and the same latents."""
    p, rec = study.profile, study.recorder
    configs = [reference] + [v for v in variants if v != reference]
    pipe = study.pipeline("float32")
    schedule = plan(study, pipe, configs, budget_s)
    latents = initial_latents(pipe, study.workload(1))
    rows, runs = [], {}
    ref_run = None
    for (scheduler, steps), planned in zip(configs, schedule.itertuples()):
        name = label(scheduler, steps)
        opt.apply(pipe, scheduler)
        run = timed_generation(pipe, study.workload(1, steps=steps), device=study.device, warmup=p.warmup,
                               repeats=planned.repeats, label=name, latents=latents)
        runs[name] = run
        scenario = f"{name}, batch 1"
        record_run(rec, run, scenario)
        rec.add(scenario, "unet_calls", run.iterations, "calls", n=1,
                note=f"UNet calls per generation for {steps} {scheduler} steps")
        row = {"variant": name, "scheduler": scheduler, "steps": steps, "repeats": planned.repeats,
               **{k: v for k, v in run.summary().items() if k in COLUMNS}, **_per_step(run)}
        if ref_run is None:
            ref_run = run
            row.update(speedup=1.0, unet_step_speedup=1.0, verdict="the reference every ratio divides")
        else:
            cmp = _comparison(ref_run, run)
            record_comparison(rec, scenario, cmp, len(run.timing.times))
            row.update({k: cmp[k] for k in ("speedup", "speedup_lo", "speedup_hi", "unet_step_speedup",
                                           "latent_rel_error", "image_psnr_db", "verdict")})
        rows.append(row)
    pipe = None
    release()
    return pd.DataFrame(rows).reindex(columns=COLUMNS), schedule, runs


def cost_model(study: Study, table: pd.DataFrame) -> dict:
    """Least-squares fit s/image = fixed + per_call * UNet calls over the measured runs (OneDiff's split of
    fixed from per-step cost): if the per-step cost is constant, the fit's residuals are small."""
    x, y = table["unet_calls"].to_numpy(float), table["s_per_image"].to_numpy(float)
    per_call, fixed = np.polyfit(x, y, 1)
    residual = float(np.max(np.abs(y - (fixed + per_call * x)) / y))
    out = {"per_call_s": float(per_call), "fixed_s": float(fixed), "max_relative_residual": residual,
           "runs": len(table)}
    study.recorder.add_many([
        dict(scenario="s/image vs UNet calls, batch 1", metric="fit_per_call", value=out["per_call_s"], unit="s",
             n=len(table), note="least-squares slope of s/image over UNet calls across every scheduler run"),
        dict(scenario="s/image vs UNet calls, batch 1", metric="fit_fixed", value=out["fixed_s"], unit="s",
             n=len(table), note="intercept: text encoder + VAE decode + overhead"),
        dict(scenario="s/image vs UNet calls, batch 1", metric="fit_max_relative_residual", value=residual,
             unit="", n=len(table), note="largest |measured - fit| / measured: small means cost per step is "
                                         "constant across schedulers")])
    return out


def _conditions(study: Study, what: str) -> str:
    p, env = study.profile, study.env
    return (f"whole generation; {p.arch}, {p.resolution}px, {what}, batch 1, float32, "
            f"{env['device_name']} ({study.device}, {env['threads']} threads)")


def published_vs_measured(study: Study, table: pd.DataFrame) -> pd.DataFrame:
    """NeMo's 50-step PLMS latency beside this machine's; no source publishes the 50 -> 20 step ratio itself."""
    nemo = published.select("NeMo SD inference", model="SD 1.x", batch_size=1, config="framework fp16 AMP")
    ref = table.iloc[0]
    rows = [published_row("s/image at the reference protocol", "NeMo SD inference (seeds/nemo-sd-performance.txt)",
                          str(nemo.loc[0, "hardware"]), f"SD 1.x, 512px, PLMS {int(nemo.loc[0, 'steps'])} steps, "
                          "batch 1, framework fp16 AMP", float(nemo.loc[0, "value"]), float(ref["s_per_image"]),
                          _conditions(study, ref["variant"]), unit="s")]
    fewest = table.iloc[1:].sort_values("unet_calls").head(1)
    if len(fewest):
        f = fewest.iloc[0]
        rows.append(published_row(
            f"{ref['variant']} -> {f['variant']} speed-up", "none published (MLPerf's SDXL gate and the MI300X "
            "seed use 20 steps; NeMo uses PLMS 50)", "-", "-", None, float(f["speedup"]),
            _conditions(study, f"{int(ref['unet_calls'])} vs {int(f['unet_calls'])} UNet calls")))
    return pd.DataFrame(rows)


def plot(study: Study, table: pd.DataFrame, fit: dict):
    """s/image against UNet calls with the fitted line, and the drift each saving costs."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    x = table["unet_calls"]
    left.scatter(x, table["s_per_image"], zorder=3)
    for r in table.itertuples():
        left.annotate(r.variant, (r.unet_calls, r.s_per_image), fontsize=7, xytext=(3, 3),
                      textcoords="offset points")
    grid = np.linspace(0, x.max() * 1.05, 20)
    left.plot(grid, fit["fixed_s"] + fit["per_call_s"] * grid, color="grey", ls=":",
              label=f"fit: {fit['fixed_s']:.3g} s + {fit['per_call_s']:.3g} s x calls")
    left.set(xlabel="UNet calls per image", ylabel="s / image (median)", title=f"cost per image ({study.device})")
    left.legend(fontsize=8)
    rest = table.iloc[1:]
    right.scatter(rest["unet_calls"], rest["image_psnr_db"], zorder=3)
    for r in rest.itertuples():
        right.annotate(r.variant, (r.unet_calls, r.image_psnr_db), fontsize=7, xytext=(3, 3),
                       textcoords="offset points")
    right.axhline(40, color="grey", ls=":", label="40 dB: the study's 'visually identical' line")
    right.set(xlabel="UNet calls per image", ylabel=f"PSNR vs {table.iloc[0]['variant']} (dB)",
              title="drift from the reference image (random weights: trajectory, not quality)")
    right.legend(fontsize=8)
    study.save_figure(fig, "steps_cost_and_drift")
    return fig
