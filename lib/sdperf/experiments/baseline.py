"""00_baseline: the fp32 eager pipeline every later rung is measured against."""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd
import torch

from sdperf.config import architectures, published
from sdperf.core import environment
from sdperf.measure import ledger as ledgers, rounds
from sdperf.store import figure_captions
from sdperf.measure.measurements import unet_flops
from sdperf.optimizations.catalog import BASELINE_KEY
from sdperf.core.paths import scratch_dir
from sdperf.model.pipelines import component_parameters
from sdperf.measure.roofline import ACHIEVED_METHOD, FLOP_METHOD, ROOF_METHOD, achieved, matmul_peak
from sdperf.measure.study import Study

LABEL = "fp32 eager"


def parameter_table(study: Study, pipe) -> pd.DataFrame:
    """Parameters per network, beside the published count when the profile builds a real architecture."""
    counts = component_parameters(pipe)
    ref = architectures.PUBLISHED_PARAMETERS.get(study.profile.arch, {}) if not study.profile.weights else {}
    rows = [{"network": k, "parameters": v, "published": ref.get(k),
             "matches_published": (ref.get(k) == v) if k in ref else None} for k, v in sorted(counts.items())]
    return pd.DataFrame(rows)


METRICS = (("latency", "latency_s", "s", "median generation at the profile's steps"),
           ("s_per_image", "s_per_image", "s", "latency / batch"),
           ("unet_step", "unet_step_s", "s", "median UNet call on the guidance batch"),
           ("s_per_image_seed", "s_per_image_seed", "s", "composed from the measured stages at 50 PLMS steps"),
           ("first_call", "first_call_s", "s", "first generation of each process (allocator and kernel warm-up)"),
           ("build", "build_s", "s", "fp32 pipeline built in each process"),
           ("peak_memory", "peak_memory_mib", "MiB", "the process's own peak RSS over its timed calls"),
           ("process_peak_memory", "process_peak_mib", "MiB",
            "each worker process's peak RSS, its pipeline's build included (lo/hi: the smallest and largest worker)"))


@dataclass
class BaselineRuns:
    """The fp32 eager pipeline at each batch size: every worker's result, the batch sweep, and batch 1's stages."""

    raw: pd.DataFrame
    sweep: pd.DataFrame
    stages: pd.DataFrame
    method: str


def _stages(ok: pd.DataFrame) -> pd.DataFrame:
    """Each stage's seconds per generation, median over the rounds' processes, and its share of their sum."""
    per = pd.DataFrame([r for recs in ok["stages"] for r in recs])
    df = per.groupby("stage", sort=False).agg(
        calls_per_generation=("calls_per_generation", "first"), median_call_s=("median_call_s", "median"),
        seconds_per_image_call=("seconds_per_image_call", "median"),
        lo=("seconds_per_image_call", "min"), hi=("seconds_per_image_call", "max")).reset_index()
    df["share_percent"] = 100 * df.seconds_per_image_call / df.seconds_per_image_call.sum()
    return df


def _run_baselines(study: Study, b: int) -> pd.DataFrame:
    """The fp32 eager processes at batch `b` this run's ledger already holds (baselines and twin of the rounds measured
    before the notebooks: the same worker), when there are at least the profile's rounds of them."""
    p = study.profile
    path = scratch_dir(p.name) / "rounds" / ledgers.name(ledgers.run_key(), p.name, p.rounds, None)
    book = ledgers.Ledger(path, sitting=environment.run_id())
    recs = [r for r in book.records(b) if r["stack"] == BASELINE_KEY and r.get("status") == "ok"
            and r["role"] in (ledgers.BASELINE_ROLE, ledgers.TWIN_ROLE)] if path.is_dir() else []
    if len(recs) < p.rounds:
        return pd.DataFrame()
    return pd.DataFrame([{"config": f"{LABEL}, batch {b}", **r} for r in recs])


def _record_not_run(study: Study, raw: pd.DataFrame) -> None:
    """A row per batch size none of whose workers ran (skipped for memory, failed, killed), with the first's reason."""
    if raw.empty or "status" not in raw:
        return
    ran = set(raw.loc[raw.status == "ok", "batch_size"])
    bad = raw[(raw.status != "ok") & ~raw.batch_size.isin(ran)].drop_duplicates("batch_size")
    study.recorder.add_many([dict(scenario=f"{LABEL}, batch {int(r.batch_size)}", metric="latency", value=None,
                                  unit="", status=r.status, note=r.note, key=BASELINE_KEY, batch_size=int(r.batch_size))
                             for r in bad.itertuples()])


def measure_batches(study: Study, say=print) -> BaselineRuns:
    """The baseline at every batch size of the profile (images per prompt, as in the NeMo table), a process each, in
    turn for the profile's rounds: the same worker and spread over rounds as every comparison of the study."""
    p = study.profile
    known = {b: _run_baselines(study, b) for b in p.batch_sizes}
    configs = [rounds.Config(f"{LABEL}, batch {b}", BASELINE_KEY, b) for b in p.batch_sizes if known[b].empty]
    raw = pd.concat([rounds.alone(p, configs, say=say) if configs else pd.DataFrame(), *known.values()],
                    ignore_index=True)
    ok = raw[raw.status == "ok"] if len(raw) else raw
    _record_not_run(study, raw)
    if ok.empty:
        raise RuntimeError(f"every baseline worker failed: {raw.note.dropna().unique().tolist()}")
    fresh = (f"fresh process per batch size, {p.rounds} rounds in turn; median [min-max] over the processes' "
             "medians")
    reused = ("the run's fp32 eager processes at this batch size (baselines and twin of the rounds measured up "
              "front, sdperf.run.prefetch: the same worker); median [min-max] over the processes' medians")
    methods = {b: reused if not known[b].empty else fresh for b in p.batch_sizes}
    method = "; ".join(f"batch {b}: {m}" for b, m in methods.items())
    rows, recs = [], []
    for b, g in ok.groupby("batch_size"):
        row = {"batch_size": int(b), "rounds": len(g), "iterations": int(g.iterations.iloc[0]),
               "it_per_s": float(g.it_per_s.median()), "method": methods[int(b)]}
        reached = rounds.reached_words(g)  # others' load over a process's timed calls: marked, as comparisons are
        for metric, col, unit, note in METRICS:
            row[col], row[col + "_lo"], row[col + "_hi"] = g[col].median(), g[col].min(), g[col].max()
            recs.append(dict(scenario=f"{LABEL}, batch {int(b)}", metric=metric, value=row[col], unit=unit,
                             lo=row[col + "_lo"], hi=row[col + "_hi"], n=len(g), method=methods[int(b)],
                             key=BASELINE_KEY, batch_size=int(b), note="; ".join(filter(None, [note, reached]))))
        rows.append(row)
    one = ok[ok.batch_size == min(ok.batch_size)]
    stages = _stages(one)
    recs += [dict(scenario=f"{LABEL}, batch {int(one.batch_size.iloc[0])}", metric=f"stage:{r.stage}",
                  value=r.seconds_per_image_call, unit="s", lo=r.lo, hi=r.hi, n=len(one),
                  method=methods[int(one.batch_size.iloc[0])], batch_size=int(one.batch_size.iloc[0]),
                  key=BASELINE_KEY, note=f"{r.calls_per_generation} call(s) per generation, "
                  f"{r.share_percent:.1f}% of the generation") for r in stages.itertuples()]
    study.recorder.add_many(recs)
    return BaselineRuns(raw, pd.DataFrame(rows), stages, method)


KERNEL_PEAK_METHOD = "ru_maxrss of the notebook's own kernel process, read once at its end"


def record_kernel_peak(study: Study) -> float:
    """This kernel's own peak RSS in MiB, recorded beside the workers' peaks (called last)."""
    import resource

    mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    study.recorder.add("00_baseline kernel", "process_peak_memory", mib, "MiB", n=1, method=KERNEL_PEAK_METHOD,
                       note="its one pipeline built after the workers finished")
    return mib


def roofline(study: Study, pipe, sweep: pd.DataFrame) -> pd.DataFrame:
    """UNet FLOPs per forward, this device's fp32 matmul roof, achieved FLOP/s and % of roof per batch size."""
    p = study.profile
    peak, peak_timing = matmul_peak(study.device, torch.float32, p.matmul_size)
    study.recorder.add(f"matmul {p.matmul_size}x{p.matmul_size} float32", "peak_gflops", peak / 1e9, "GFLOP/s",
                       n=len(peak_timing.times), method=ROOF_METHOD)
    rows = []
    for b, step in zip(sweep["batch_size"], sweep["unet_step_s"]):
        flops = unet_flops(pipe, study.workload(int(b)))
        a = achieved(flops, step, peak)
        rows.append({"batch_size": int(b), "unet_forward_gflop": flops / 1e9, "unet_step_s": step, **a})
        common = dict(scenario=f"{LABEL}, batch {int(b)}", batch_size=int(b))
        study.recorder.add_many([
            dict(common, metric="unet_forward_flops", value=flops, unit="FLOP", n=1, method=FLOP_METHOD,
                 note="one UNet forward on the CFG batch"),
            dict(common, metric="achieved_gflops", value=a["achieved_gflops"], unit="GFLOP/s", method=ACHIEVED_METHOD),
            dict(common, metric="percent_of_peak", value=a["percent_of_peak"], unit="%", method=ACHIEVED_METHOD,
                 note=f"of the measured float32 matmul roof {peak / 1e9:.1f} GFLOP/s")])
    return pd.DataFrame(rows)


def plot_breakdown(study: Study, runs: BaselineRuns):
    fig, ax = plt.subplots(figsize=(7, 3))
    df = runs.stages
    err = [df["seconds_per_image_call"] - df["lo"], df["hi"] - df["seconds_per_image_call"]]
    ax.barh(df["stage"], df["seconds_per_image_call"], xerr=err, capsize=3, color=plt.cm.tab10.colors[:len(df)])
    for y, (hi, share) in enumerate(zip(df["hi"], df["share_percent"])):  # beyond the range bar, not over it
        ax.text(hi, y, f"  {share:.1f}%", va="center")
    ax.invert_yaxis()
    ax.set_xlim(0, float(df["hi"].max()) * 1.18)
    ax.set_xlabel("seconds per generation (median over rounds, bars: min-max)")
    ax.set_title(f"fp32 eager, batch 1: where the time goes ({study.profile.name}, {study.profile.steps} steps)")
    b = int(runs.sweep.batch_size.min())
    n = int(runs.sweep.loc[runs.sweep.batch_size == b, "rounds"].iloc[0])
    study.save_figure(fig, "stage_breakdown",
                      what=f"Where one fp32 eager generation's time goes at batch {b}, {study.profile.steps} "
                      f"{study.profile.scheduler} steps, {study.profile.resolution}px: seconds per stage per "
                      "generation, with each stage's share of their sum",
                      baseline=figure_captions.NO_BASELINE + " (seconds)",
                      method=f"{runs.method}; stages timed inside each process's timed generations",
                      n=f"{n} fp32 eager processes at batch {b}")
    return fig


def nemo_scaling() -> pd.DataFrame:
    """NeMo's framework-fp16 SD latency at batch 1/2/4, relative to batch 1: the shape to compare with ours."""
    df = published.select("NeMo SD inference", model="SD 1.x", what="framework fp16 AMP")
    df = df[["batch_size", "value"]].astype({"batch_size": int}).rename(columns={"value": "latency_s"})
    df["relative_latency"] = df["latency_s"] / float(df.loc[df.batch_size == 1, "latency_s"].iloc[0])
    return df


def plot_batch_sweep(study: Study, sweep: pd.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for col, marker, label in (("latency_s", "o", "latency"), ("s_per_image", "s", "s / image")):
        err = [sweep[col] - sweep[col + "_lo"], sweep[col + "_hi"] - sweep[col]]
        axes[0].errorbar(sweep["batch_size"], sweep[col], yerr=err, marker=marker, capsize=4, label=label)
    axes[0].set(xlabel="batch size (images per prompt)", ylabel="seconds (median, bars: min-max)",
                title=f"measured here ({study.device})", ylim=(0, None))
    axes[0].legend()
    base = float(sweep.loc[sweep.batch_size == sweep.batch_size.min(), "latency_s"].iloc[0])
    axes[1].plot(sweep["batch_size"], sweep["latency_s"] / base, marker="o", label=f"measured here ({study.device})")
    nemo = nemo_scaling()
    axes[1].plot(nemo["batch_size"], nemo["relative_latency"], marker="^", ls="--", label="NeMo, A100 fp16 (published)")
    axes[1].plot(sweep["batch_size"], sweep["batch_size"] / sweep["batch_size"].min(), color="grey", ls=":",
                 label="linear (no batching gain)")
    axes[1].set(xlabel="batch size", ylabel="latency / latency at smallest batch", title="how latency scales")
    axes[1].legend(fontsize=8)
    r = sweep["rounds"].astype(int)
    study.save_figure(fig, "batch_sweep",
                      what="fp32 eager latency and seconds per image by batch size (left), and latency relative to "
                      "the smallest batch beside NeMo's published A100 fp16 table (right)",
                      baseline=f"left: {figure_captions.NO_BASELINE} (seconds); right: each curve's own latency at "
                      "its smallest batch (ratio of medians)",
                      method=(f"every batch size: {sweep['method'].iloc[0]}" if sweep["method"].nunique() == 1 else
                              "; ".join(f"batch {b}: {m}" for b, m in zip(sweep.batch_size, sweep["method"]))),
                      n=(f"{r.min()}" if r.min() == r.max() else f"{r.min()}-{r.max()}")
                      + f" fp32 eager processes per batch size (batch sizes {', '.join(map(str, sweep.batch_size))})")
    return fig


def published_vs_measured(study: Study, sweep: pd.DataFrame) -> pd.DataFrame:
    """The fp32 baseline claims of the seeds beside this run's figure, each with its hardware and conditions."""
    p = study.profile
    one = sweep[sweep.batch_size == 1].iloc[0] if (sweep.batch_size == 1).any() else sweep.iloc[0]
    here = f"{study.env['device_name']} ({study.device}, {study.env['threads']} threads)"
    rows = [
        {"claim": "fp32 baseline latency", "source": published.cite("Cerebrium SD ladder"), "hardware": "NVIDIA A10G",
         "conditions": "SD v1.x, 512px, steps not stated", "published": published.value(
             "Cerebrium SD ladder", what="fp32"), "measured_here": one["latency_s"], "unit": "s",
         "measured_conditions": f"{p.arch}, {p.resolution}px, {p.steps} {p.scheduler} steps, batch 1, {here}"},
    ]
    nemo = nemo_scaling().set_index("batch_size")
    base = float(one["latency_s"])
    for b in sweep["batch_size"]:
        if int(b) in nemo.index and int(b) != 1 and (sweep.batch_size == 1).any():
            rows.append({"claim": f"latency batch {int(b)} / batch 1", "source": published.cite("NeMo SD inference"),
                         "hardware": "A100 80GB",
                         "conditions": "SD 1.x, 512px, 50 PLMS, framework fp16 AMP",
                         "published": nemo.loc[int(b), "relative_latency"],
                         "measured_here": float(sweep.loc[sweep.batch_size == b, "latency_s"].iloc[0]) / base,
                         "unit": "ratio", "measured_conditions": f"{p.arch}, {p.resolution}px, fp32, {here}"})
    return pd.DataFrame(rows)
