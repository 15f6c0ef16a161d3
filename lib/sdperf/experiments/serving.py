"""13_serving: what the notebook calls. Single-request calibration, the LoadGen sweep of both designs, image
parity between them, the sync audit, and the GPU-sharing paper estimate."""
from __future__ import annotations

import collections
from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
import torch
from matplotlib.lines import Line2D

from sdperf.store import figure_captions
from sdperf.measure.measurements import GenerationRun, record_generation, timed_generation
from sdperf.core.paths import profile_reports
from sdperf.serving import loadgen_run, sharing, sync_audit
from sdperf.serving.serving_settings import ServingSettings
from sdperf.serving.stages import SDStages, build_design
from sdperf.measure.study import Study
from sdperf.measure.rounds import BASELINE
from sdperf.optimizations.catalog import BASELINE_KEY
from sdperf.measure.timing import interleaved, ratio

CUDA_ONLY = "torch.cuda.set_sync_debug_mode needs a CUDA device; the function-mode count stands alone here"


def describe(cfg: ServingSettings) -> str:
    return (f"designs {list(cfg.designs)} in LoadGen {list(cfg.scenarios)}; concurrency {list(cfg.concurrency)} "
            f"x batch {list(cfg.batch_sizes)}; queues of {cfg.queue_depth}; each run at least "
            f"{cfg.min_duration_ms} ms and {cfg.min_query_count} queries (Offline: samples, at least c x b); "
            f"Server offers {cfg.server_load:g} x the single-request rate, target latency "
            f"{cfg.server_latency_factor:g} x its latency; sync audit of {list(cfg.sync_schedulers)}")


# --- single request ---------------------------------------------------------------------------------------------
@dataclass
class Calibration:
    """generate() timed alone at batch 1 (and at the largest batch): the rates LoadGen's settings derive from."""

    runs: dict[int, GenerationRun]

    @property
    def single(self) -> GenerationRun:
        return self.runs[1]

    @property
    def latency_s(self) -> float:
        return self.single.timing.median

    @property
    def rate(self) -> float:
        return 1.0 / self.latency_s

    def stages(self) -> pd.DataFrame:
        """The three serving stages' share of one request, from the same timed calls."""
        s = self.single.stages.set_index("stage")["seconds_per_image_call"]
        parts = {"text_encoder": s.get("text_encoder", 0.0), "denoise": s.get("unet", 0.0) + s.get("scheduler", 0.0),
                 "vae_decode": s.get("vae_decode", 0.0)}
        total = sum(parts.values())
        return pd.DataFrame([{"stage": k, "seconds": v, "share_percent": 100 * v / total} for k, v in parts.items()])


def calibrate(study: Study, pipe, cfg: ServingSettings) -> Calibration:
    runs = {}
    for b in sorted({1, max(cfg.batch_sizes)}):
        run = timed_generation(pipe, study.workload(b), device=study.device, warmup=1, repeats=cfg.repeats,
                               label=f"one request, batch {b}")
        record_generation(study.recorder, run, f"one request (generate), batch {b}", dtype=study.profile.dtype)
        runs[b] = run
    return Calibration(runs)


# --- the LoadGen sweep ------------------------------------------------------------------------------------------
def summary_path(study: Study, design: str, scenario: str, c: int, b: int):
    return profile_reports(study.profile.name) / "loadgen" / f"{study.notebook}__{design}-{scenario}-c{c}-b{b}.txt"


def sweep(study: Study, pipe, cfg: ServingSettings, cal: Calibration) -> tuple[pd.DataFrame, dict]:
    """Every (scenario, batch, concurrency), the designs interleaved so drift hits them alike."""
    stages = SDStages(pipe, study.workload(1))
    rows, images = [], {}
    for scenario in cfg.scenarios:
        for b in cfg.batch_sizes:
            for c in cfg.concurrency:
                for design in cfg.designs:
                    row, served = _one_run(study, stages, cfg, cal, design, scenario, c, b)
                    rows.append(row)
                    images[(design, scenario, c, b)] = served
    return pd.DataFrame(rows), images


def _one_run(study, stages, cfg, cal, design, scenario, c, b):
    settings = loadgen_run.loadgen_settings(
        scenario, min_duration_ms=cfg.min_duration_ms, min_query_count=max(cfg.min_query_count, c * b),
        single_rate=cal.rate, single_latency_s=cal.latency_s, server_load=cfg.server_load,
        latency_factor=cfg.server_latency_factor)
    with build_design(design, stages, c, cfg.queue_depth) as server:
        figs, sut = loadgen_run.run(server, settings, batch_size=b, seed_base=study.profile.seed,
                                    performance_samples=cfg.performance_samples,
                                    summary_to=summary_path(study, design, scenario, c, b))
    row = {"design": design, "scenario": scenario, "concurrency": c, "batch_size": b, **figs,
           "threads": torch.get_num_threads(), "min_duration_ms": cfg.min_duration_ms,
           "min_query_count": max(cfg.min_query_count, c * b)}
    _record_run(study, row)
    return row, sut.images


def run_method(r: dict) -> str:
    return (f"one MLPerf LoadGen {r['scenario']} run (no rounds) in this notebook's process: the {r['design']} design "
            f"with {r['concurrency']} request(s) in flight, batch {r['batch_size']}; throughput and latency "
            "percentiles as LoadGen's summary reports them")


def _record_run(study: Study, r: dict) -> None:
    scen = f"{r['design']}, LoadGen {r['scenario']}, concurrency {r['concurrency']}, batch {r['batch_size']}"
    flags = (f"LoadGen's check against this run's test settings ({r['min_duration_ms']} ms, {r['min_query_count']} "
             f"queries): {r['validity']} (min duration met {r['min_duration_met']}, min queries met "
             f"{r['min_queries_met']}, early stopping met {r['early_stopping_met']}); MLPerf's rules ask at least "
             f"600 s and their own minimum query count, and a run below them is not an MLPerf-valid result; "
             f"{r['requests']} requests; {r['threads']} torch threads per worker")
    if r["failed_requests"]:
        study.recorder.failed(scen, f"{r['failed_requests']} of {r['requests']} requests failed", metric="throughput",
                              batch_size=int(r["batch_size"]))
        return
    figure = "samples per second" if r["scenario"] == "Offline" else "completed samples per second"
    method = run_method(r)
    rows = [dict(scenario=scen, metric="throughput", value=r["throughput_img_s"], unit="img/s", n=r["samples"],
                 batch_size=int(r["batch_size"]), method=method, note=f"LoadGen {figure}; {flags}")]
    if r["scenario"] == "Server":
        rows += [dict(scenario=scen, metric=f"latency_{p}", value=r[f"latency_{p}_s"], unit="s", n=r["queries"],
                      batch_size=int(r["batch_size"]), method=method,
                      note=f"LoadGen, scheduled arrival to completion, {r['target_qps']:.3g} queries/s offered")
                 for p in ("p50", "p95", "p99")]
    study.recorder.add_many(rows)


def throughput_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Images/s per design and concurrency, one column per (scenario, batch), and staged over stacked."""
    t = runs.pivot_table(index=["scenario", "batch_size", "concurrency"], columns="design", values="throughput_img_s")
    if {"stacked", "staged"} <= set(t.columns):
        t["staged_over_stacked"] = t["staged"] / t["stacked"]
    return t.reset_index()


def _parity_rows(images: dict) -> pd.DataFrame:
    """One row per served request: its run and whether it equals the stacked design's first image of its seeds."""
    by_seeds = collections.defaultdict(list)
    for (design, scenario, c, b), served in images.items():
        for seeds, img in served.items():
            by_seeds[seeds].append(((design, scenario, c, b), img))
    rows = []
    for seeds, served in by_seeds.items():
        ref = next((img for (d, *_), img in served if d == "stacked"), None)
        if ref is None:
            continue
        for (design, scenario, c, b), img in served:
            if img is ref:
                continue
            rows.append({"design": design, "scenario": scenario, "concurrency": c, "batch_size": b, "seeds": seeds,
                         "identical": torch.equal(img, ref), "max_abs_diff": float((img - ref).abs().max())})
    return pd.DataFrame(rows, columns=["design", "scenario", "concurrency", "batch_size", "seeds", "identical",
                                       "max_abs_diff"])


def image_parity(images: dict) -> pd.DataFrame:
    """Every request served (grouped by its seeds) against the stacked design's first image of the same seeds:
    for `staged` the claim under test, for `stacked` its reproducibility across runs and concurrency."""
    df = _parity_rows(images)
    if df.empty:
        return df
    return df.groupby("design").agg(requests=("identical", "size"), identical=("identical", "sum"),
                                    max_abs_diff=("max_abs_diff", "max")).reset_index()


def parity_failures(images: dict) -> pd.DataFrame:
    """The requests whose images differ from the stacked design's, with the run that served each."""
    df = _parity_rows(images)
    return df[~df.identical].reset_index(drop=True)


PARITY_METHOD = ("every request of this notebook's LoadGen runs: the design's decoded images against the stacked "
                 "design's for the same seeds, torch.equal per request")


def record_parity(study: Study, parity: pd.DataFrame) -> None:
    for r in parity.itertuples():
        study.recorder.add(f"{r.design} vs stacked, same seeds", "identical_images", r.identical / r.requests, "",
                           n=r.requests, method=PARITY_METHOD, note=f"max abs diff {r.max_abs_diff:g}")


def plot(study: Study, runs: pd.DataFrame):
    """Left: throughput against concurrency. Right: throughput (Offline) against latency under load (Server).
    Both value axes start at 0, so a few-percent gap between runs of a few requests does not look large."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    palette = dict(zip(("stacked", "staged"), sns.color_palette(n_colors=2)))
    cap = runs[runs.scenario == "Offline"] if (runs.scenario == "Offline").any() else runs
    sns.lineplot(cap, x="concurrency", y="throughput_img_s", hue="design", style="batch_size", markers=True,
                 palette=palette, ax=left)
    ticks = sorted(runs.concurrency.unique())
    left.set_xscale("log", base=2)
    left.set(xticks=ticks, xticklabels=[str(t) for t in ticks], ylabel="images/s (LoadGen)",
             xlabel="concurrency (requests in flight)", title=f"throughput, LoadGen {cap.scenario.iloc[0]}")
    left.minorticks_off()
    left.set_ylim(0, float(cap.throughput_img_s.max()) * 1.15)
    left.legend(fontsize=8, loc="lower right")
    lat = runs[runs.scenario == "Server"]
    if not lat.empty:
        pts = lat.merge(cap[["design", "concurrency", "batch_size", "throughput_img_s"]],
                        on=["design", "concurrency", "batch_size"], suffixes=("_server", ""))
        marks = dict(zip(ticks, "os^Dv<>pPX"))  # concurrency as the marker, not as text over the points
        for (design, b), g in pts.groupby(["design", "batch_size"]):
            g = g.sort_values("throughput_img_s")
            color = palette[design]
            right.errorbar(g.throughput_img_s, g.latency_p50_s, yerr=[g.latency_p50_s * 0,
                           g.latency_p99_s - g.latency_p50_s], capsize=3, color=color,
                           label=f"{design}, batch {b}", ls="-" if b == min(runs.batch_size) else "--")
            for c, gc in g.groupby("concurrency"):
                right.scatter(gc.throughput_img_s, gc.latency_p50_s, marker=marks.get(c, "o"), color=color, s=40,
                              zorder=3)
        handles, _ = right.get_legend_handles_labels()
        handles += [Line2D([], [], ls="", marker=marks.get(c, "o"), color="0.35", label=f"concurrency {c}")
                    for c in sorted(pts.concurrency.unique())]
        right.set(xlabel=f"images/s (LoadGen {cap.scenario.iloc[0]})", ylabel="latency p50, bar to p99 (s)",
                  title=f"latency under load (LoadGen Server, {lat.target_qps.iloc[0]:.3g} queries/s offered)")
        right.set_xlim(0, float(pts.throughput_img_s.max()) * 1.15)
        right.set_ylim(0, float(pts.latency_p99_s.max()) * 1.15)
        right.legend(handles=handles, fontsize=8, loc="lower right", ncol=2)
    study.save_figure(fig, "throughput_latency", **_caption(runs))
    return fig


def _caption(runs: pd.DataFrame) -> dict:
    """The throughput/latency figure's caption parts, with what its numbers are over read from the runs."""
    def span(col: str) -> str:
        v = pd.to_numeric(runs[col], errors="coerce").dropna().astype(int) if col in runs else pd.Series([])
        return "?" if v.empty else (str(v.min()) if v.min() == v.max() else f"{v.min()}-{v.max()}")
    scenarios = ", ".join(dict.fromkeys(runs.scenario))
    return dict(
        what="Serving Stable Diffusion under MLPerf LoadGen: images/s by concurrency for the one-request-at-a-time "
        "('stacked') and stage-pipelined ('staged') designs (left), and Server latency p50 with a bar to p99 "
        "against Offline throughput (right); both value axes start at 0",
        baseline=figure_captions.NO_BASELINE + " (images/s, seconds; staged over stacked is in the table)",
        method=f"LoadGen {scenarios}: one run per design, scenario, concurrency and batch size, the designs "
        "interleaved; Offline: LoadGen's samples per second; Server: Poisson arrivals at the offered rate, latency "
        "from scheduled arrival to completion",
        n=f"one LoadGen run per point: {span('samples')} samples, {span('queries')} queries per run "
        f"({len(runs)} runs)")


# --- sync audit -------------------------------------------------------------------------------------------------
COUNT_METHOD = ("one untimed denoising loop per scheduler and variant, each host read-back counted by a torch function "
                "mode (sdperf.serving.sync_audit); the most common count per step")
IN_TURN = "both loops in one process, timed in turn (sdperf.measure.timing.interleaved)"
SYNC_TIME_METHOD = f"{IN_TURN}; median with p10/p90 over the timed repeats, the first call timed apart"


def sync_counts(study: Study, pipe, cfg: ServingSettings) -> pd.DataFrame:
    """Read-backs per denoising step for each scheduler, in the study's loop and with host values."""
    inputs = sync_audit.LoopInputs.make(pipe, study.workload(1))
    rows = []
    for sched in cfg.sync_schedulers:
        for variant in sync_audit.VARIANTS:
            counter = sync_audit.count(pipe, inputs, variant, sched)
            rows.append(_count_row(study, sched, variant, counter))
    return pd.DataFrame(rows)


def _count_row(study: Study, sched: str, variant: str, counter: sync_audit.SyncCounter) -> dict:
    per_step = counter.per_step()
    ops = collections.Counter(f"{e.op} @ {e.site}" for e in counter.events if e.step >= 0)
    what = "; ".join(f"{k} x{v}" for k, v in ops.most_common()) or "none"
    typical = max(set(per_step), key=per_step.count) if per_step else 0
    scen = f"sync audit, {sched}, {variant}"
    note = f"counts over {len(per_step)} steps {per_step}; {what}"
    study.recorder.add(scen, "syncs_per_step", typical, "syncs", n=len(per_step), method=COUNT_METHOD, note=note[:500])
    cuda = None
    if counter.cuda_counts:
        cuda = counter.cuda_counts[(-1, "total")]
        study.recorder.add(scen, "cuda_sync_debug_warnings", cuda, "syncs", n=1, method=COUNT_METHOD,
                           note="torch.cuda.set_sync_debug_mode('warn') warnings over the whole loop")
    else:
        study.recorder.not_applicable(scen, CUDA_ONLY, metric="cuda_sync_debug_warnings")
    return {"scheduler": sched, "variant": variant, "steps": len(per_step), "syncs_per_step": per_step,
            "set_up_syncs": sum(e.step < 0 for e in counter.events), "total": len(counter.events),
            "cuda_debug_mode_total": cuda, "what": what}


def sync_time(study: Study, pipe, cfg: ServingSettings) -> pd.DataFrame:
    """The profile's scheduler: the loop as written vs with host values, timed in turn, and whether they agree."""
    inputs = sync_audit.LoopInputs.make(pipe, study.workload(1))
    sched, out = study.profile.scheduler, {}

    def loop(variant):
        def call():
            out[variant] = sync_audit.run_loop(pipe, inputs, variant, sched)
        return call

    timings = interleaved({v: loop(v) for v in sync_audit.VARIANTS}, device=study.device, repeats=cfg.repeats)
    for variant, t in timings.items():
        study.recorder.timing(f"sync audit, {sched}, {variant}", t, metric="loop_latency", method=SYNC_TIME_METHOD)
    before, after = (timings[v] for v in sync_audit.VARIANTS)
    r = ratio(before, after)
    verdict = ("within noise: the range straddles 1.0" if r["speedup_lo"] <= 1.0 <= r["speedup_hi"] else
               f"measurable: the whole range is {'above' if r['speedup_lo'] > 1 else 'below'} 1.0")
    same = torch.equal(*(out[v] for v in sync_audit.VARIANTS))
    study.recorder.add_many([
        dict(scenario=f"sync audit, {sched}", metric="speedup_host_values", value=r["speedup"], unit="x",
             p10=r["speedup_lo"], p90=r["speedup_hi"], n=len(after.times),
             method=f"{IN_TURN}; ratio of medians, range from the p10/p90 of each",
             note=f"denoising loop, {study.device}, timed in turn; latents identical: {same}; {verdict}"),
        dict(scenario=f"sync audit, {sched}", metric="time_saved_per_loop", value=before.median - after.median,
             unit="s", p10=before.p10 - after.p90, p90=before.p90 - after.p10, n=len(after.times),
             method=SYNC_TIME_METHOD, note="median difference; range from p10/p90 of both")])
    return pd.DataFrame([{"variant": v, "median_s": t.median, "p10_s": t.p10, "p90_s": t.p90, "n": len(t.times),
                          "first_call_s": t.first_call} for v, t in timings.items()]).assign(
        speedup=[1.0, r["speedup"]], speedup_lo=[1.0, r["speedup_lo"]], speedup_hi=[1.0, r["speedup_hi"]],
        latents_identical=same, verdict=["", verdict])


# --- GPU sharing ---------------------------------------------------------------------------------------------------
BASELINE_NOTEBOOK = "00_baseline"


def baseline_batches(rows: pd.DataFrame) -> tuple[float, float, int] | None:
    """(batch-1 latency, the largest batch's latency, that batch) from 00_baseline's fp32 eager rows, or None."""
    if rows.empty:
        return None
    mine = rows[(rows["notebook"] == BASELINE_NOTEBOOK) & (rows["metric"] == "latency") & (rows["status"] == "ok")
                & (rows["key"] == BASELINE_KEY) & rows["batch_size"].notna()]
    # the baseline's own rows at each batch, by their name (its twin shares the key)
    mine = mine[mine["scenario"] == [f"{BASELINE}, batch {b}" for b in mine["batch_size"]]]
    lat = {int(b): float(v) for b, v in zip(mine["batch_size"], mine["value"]) if pd.notna(v)}
    if 1 not in lat or max(lat) < 2:
        return None
    return lat[1], lat[max(lat)], max(lat)


def _busy(study: Study, cal: Calibration) -> tuple[float, str] | None:
    """How busy one request keeps the device, from a batch this notebook timed, else from 00's batch rows."""
    if max(cal.runs) > 1:
        return None  # sharing.estimate takes it from the calibration's own largest batch
    found = baseline_batches(study.recorder.current())
    if found is None:
        return None
    busy, how = sharing.busy_fraction(*found)
    return busy, how.replace("(measured)", f"(measured in {BASELINE_NOTEBOOK}: fp32 eager, fresh processes, this "
                                           "machine and commit)")


def sharing_estimate(study: Study, cal: Calibration) -> pd.DataFrame:
    """The paper estimate from the measured single-request figures; shown, never stored as a measurement."""
    for strategy in ("MIG", "GPU time-sharing", "MPS"):
        study.recorder.not_applicable(f"GPU sharing: {strategy}", _sharing_reason(study.device), metric="throughput")
    big = max(cal.runs)
    t = cal.single.timing
    device_mib = torch.cuda.get_device_properties(0).total_memory / 2**20 if study.device == "cuda" else None
    return sharing.estimate(cal.latency_s, batch_latency_s=cal.runs[big].timing.median if big > 1 else None,
                            batch_size=big, device_memory_mib=device_mib, measured_busy=_busy(study, cal),
                            peak_memory_mib=None if t.peak_memory_bytes is None or study.device != "cuda"
                            else t.peak_memory_bytes / 2**20)


def _sharing_reason(device: str) -> str:
    if device != "cuda":
        return "needs an NVIDIA GPU (MIG on A100/H100); this run has none; a paper estimate is shown instead"
    return ("needs the GPU partitioned by an administrator (MIG), an MPS control daemon or a time-sharing device "
            "plugin, none of which a notebook can set up; a paper estimate is shown instead")
