"""11_training_scaling: what the notebook calls, in order. All computation lives in sdperf.training."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sdperf.store import figure_captions
from sdperf.config import published
from sdperf.config.architectures import vae_scale_factor
from sdperf.measure.comparison import published_row
from sdperf.measure.study import Study
from sdperf.training import collect, dataset, figures, launch, scaling, training_settings
from sdperf.training.model import unet_config
from sdperf.training.training_settings import TrainingSettings

UNIT = "samples/s"


@dataclass
class Prepared:
    settings: TrainingSettings
    configs: list[launch.Config]


def prepare(study: Study, world_sizes: list | None = None, batch_sizes: list | None = None) -> Prepared:
    """Validate the profile's training section and every launch setting before anything is built or spawned."""
    s = training_settings.from_profile(study.profile)
    return Prepared(s, launch.plan(study.profile, s, world_sizes, batch_sizes))


def unet_parameters(arch: str, width: float) -> int:
    """Parameter count of the UNet a run trains, built on the meta device (no memory, no time)."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**unet_config(arch, width))
    return sum(p.numel() for p in unet.parameters())


def what_is_trained(study: Study, prep: Prepared) -> str:
    """The model, data and step of every configuration, in words (deterministic for a profile)."""
    p, s = study.profile, prep.settings
    n = unet_parameters(p.arch, s.unet_width)
    channels = unet_config(p.arch, s.unet_width)["block_out_channels"]
    model = f"the real {p.arch} UNet" if s.unet_width == 1.0 else f"{p.arch}'s UNet at {s.unet_width:g}x width"
    side = s.resolution // vae_scale_factor(p.arch)
    state_gib = n * 16 / 2**30  # fp32 weights + gradients + two AdamW moments
    engines = ["DDP"] + [f"DeepSpeed ZeRO-{k}" for k in s.deepspeed_zero_stages]
    src = "synthetic latents/embeddings" if s.data == "synthetic" else (
        f"latents from {p.arch}'s VAE, embeddings from its text encoder, on "
        + (f"images in {s.images_dir}" if s.images_dir else "seeded generated test patterns"))
    return "\n".join([
        f"model: {model}, channels {channels}, {n / 1e6:.1f}M parameters "
        f"({state_gib:.2f} GiB of fp32 weights + gradients + AdamW moments per rank under DDP)",
        f"data: {s.samples} samples at {s.resolution}px ({side}x{side} latents): {src}",
        f"step: DDPM noise-prediction MSE, AdamW (lr {s.learning_rate:g}, weight decay {s.weight_decay:g}), "
        f"gradient clipping at {s.max_grad_norm:g}, autocast {s.autocast}",
        f"engines: {', '.join(engines)}; backend {s.backend}; {s.warmup_steps} warm-up + {s.steps} timed steps "
        "per configuration, each in a fresh torchrun process group"])


def plan_table(study: Study, prep: Prepared) -> pd.DataFrame:
    budget = launch.thread_budget() if study.device == "cpu" else None
    rows = []
    for c in prep.configs:
        total = c.threads_per_rank * c.world_size
        rows.append({**launch.as_dict(c), "global_batch": c.per_rank_batch * c.world_size,
                     "total_threads": total if study.device == "cpu" else None,
                     "oversubscribed": bool(budget and total > budget)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- running
def run(study: Study, prep: Prepared, progress=print) -> pd.DataFrame:
    """Make the dataset once, run every configuration in its own process group, record every row."""
    with tempfile.TemporaryDirectory(prefix="sdperf-train-data-") as tmp:
        tensors, what = dataset.make(study.profile, prep.settings)
        path = dataset.save(Path(tmp) / "latents.pt", tensors)
        progress(f"dataset: {what}")
        measured = launch.sweep(study.profile, prep.settings, prep.configs, path, progress=progress)
    record(study, measured, prep.settings)
    return measured


def add_hand_runs(study: Study, measured: pd.DataFrame, folders: list[str], s: TrainingSettings) -> pd.DataFrame:
    """Rows of configurations launched by hand (e.g. torchrun across machines), read from their rank records."""
    if not folders:
        return measured
    extra = pd.DataFrame([dict(collect.read_run(Path(f)), control=False) for f in folders])
    record(study, extra, s)
    return pd.concat([measured, extra], ignore_index=True)


def _dtype(s: TrainingSettings) -> str:
    return "float32" if s.autocast == "none" else f"{s.autocast} autocast"


# how every figure is taken: per configuration, and the ratios of two
LAUNCH = "one torchrun launch per configuration (its ranks fresh processes)"
LAUNCH_METHOD = (f"{LAUNCH}, once (no rounds): step times of the slowest rank, median and p10/p90 over the timed "
                 "steps after warm-up; the first step timed apart; memory as each rank reads its own peak")
SCALING_METHOD = (f"{LAUNCH}, samples/s from the median step time over its timed steps after warm-up; ratio of two "
                  "launches' samples/s, once each (no rounds)")


def record(study: Study, measured: pd.DataFrame, s: TrainingSettings) -> None:
    """samples/s, step time, first step and per-rank peak memory per configuration; failures with their reason."""
    rec, rows = study.recorder, []
    for r in measured.itertuples():
        if r.status == "not_applicable":
            rec.not_applicable(r.label, r.note.removeprefix("not applicable: "), metric="samples_per_s")
            continue
        if r.status == "failed":
            rec.failed(r.label, r.note, metric="samples_per_s")
            continue
        base = dict(scenario=r.label, n=r.timed_steps, dtype=_dtype(s), method=LAUNCH_METHOD)
        where = f"{r.world_size} rank(s) x {r.threads_per_rank} thread(s), {r.backend}, {r.unet}"
        rows += [
            dict(base, metric="samples_per_s", value=r.samples_per_s, unit=UNIT, p10=r.samples_per_s_p10,
                 p90=r.samples_per_s_p90, note=f"global batch {r.global_batch} / median step time; {where}"),
            dict(base, metric="step_time", value=r.step_time_s, unit="s", p10=r.step_time_p10_s,
                 p90=r.step_time_p90_s, note="slowest rank per step, after warm-up"),
            dict(base, metric="first_step", value=r.first_step_s, unit="s", n=1,
                 note="first step, timed apart (allocator, DDP buckets, DeepSpeed partitions)"),
            dict(base, metric="peak_memory_per_rank", value=r.peak_memory_mib, unit="MiB", n=r.world_size,
                 note=f"largest rank; per rank: {r.peak_memory_mib_per_rank} MiB; {r.memory_kind}"),
            dict(base, metric="training_memory_per_rank", value=r.training_memory_mib, unit="MiB", n=r.world_size,
                 note="peak minus what the rank held before building the UNet (runtime, libraries, dataset)"),
            dict(base, metric="params_identical_across_ranks", value=float(r.params_identical), unit="bool", n=1,
                 note="sha256 of every parameter after the last step, compared across ranks")]
    if rows:
        rec.add_many(rows)


def scaling_tables(study: Study, measured: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Weak, strong and equal-threads efficiency of the measured sweep, each recorded."""
    out = {"weak": scaling.weak(measured), "strong": scaling.strong(measured),
           "equal_threads": scaling.equal_threads(measured)}
    rows = []
    for kind in ("weak", "strong"):
        for r in out[kind][out[kind]["scale"] > 1].itertuples():
            held = f"batch {r.per_rank_batch}/rank" if kind == "weak" else f"global batch {r.global_batch}"
            scenario = f"{kind} scaling, {r.engine}, {held}, world {r.base_size} -> {r.world_size}"
            rows += [dict(scenario=scenario, metric="speedup", value=r.speedup, unit="x", n=1, method=SCALING_METHOD,
                          note="samples/s over the smallest world size's"),
                     dict(scenario=scenario, metric="scaling_efficiency", value=r.efficiency, unit="x", n=1,
                          method=SCALING_METHOD, note="speed-up / (world size ratio); 1.0 is perfect linear")]
    for r in out["equal_threads"].itertuples():
        rows.append(dict(scenario=f"ddp, world {r.world_size}, batch {r.per_rank_batch}/rank vs one rank with "
                                  f"{r.threads_per_rank} thread(s)", metric="equal_threads_efficiency",
                         value=r.efficiency, unit="x", n=1, method=SCALING_METHOD,
                         note="samples/s / (world size x one rank's at the same threads): DDP's own overhead"))
    if rows:
        study.recorder.add_many(rows)
    return out


def engines(measured: pd.DataFrame) -> pd.DataFrame:
    """Each ZeRO run beside DDP at the same world size and per-rank batch: throughput and per-rank memory."""
    ok = measured[measured["status"] == "ok"]
    ddp = ok[(ok.engine == "ddp") & ~ok["control"].astype(bool)].set_index(["world_size", "per_rank_batch"])
    rows = []
    for r in measured[measured.engine != "ddp"].itertuples():
        key = (r.world_size, r.per_rank_batch)
        row = {"engine": r.engine, "world_size": r.world_size, "per_rank_batch": r.per_rank_batch,
               "status": r.status, "note": r.note}
        if r.status == "ok" and key in ddp.index:
            d = ddp.loc[key]
            row.update(samples_per_s=r.samples_per_s, ddp_samples_per_s=d.samples_per_s,
                       throughput_vs_ddp=r.samples_per_s / d.samples_per_s, peak_memory_mib=r.peak_memory_mib,
                       ddp_peak_memory_mib=d.peak_memory_mib, training_memory_mib=r.training_memory_mib,
                       ddp_training_memory_mib=d.training_memory_mib,
                       training_memory_vs_ddp=r.training_memory_mib / d.training_memory_mib,
                       same_loss_as_ddp=bool(abs(r.loss_last - d.loss_last) <= 1e-4 * max(1.0, abs(d.loss_last))))
        rows.append(row)
    return pd.DataFrame(rows)


def correctness(measured: pd.DataFrame) -> pd.DataFrame:
    """Did every rank end with bit-identical parameters, did training change them, and the loss it saw."""
    cols = ["label", "status", "params_identical", "params_changed", "loss_first", "loss_last"]
    return measured[[c for c in cols if c in measured]]


# ---------------------------------------------------------------- published
def published_tables() -> dict[str, pd.DataFrame]:
    """The transcribed tables as published: samples/s by size, one row per curve."""
    t = published.throughput()
    nemo = t[t.source == published.NEMO].pivot_table(index="curve", columns="nodes", values="value", sort=False)
    nemo.columns = [f"{c:g} node{'s' if c > 1 else ''}" for c in nemo.columns]
    mosaic = t[t.source == published.MOSAIC].pivot_table(index="curve", columns="gpus", values="value", sort=False)
    mosaic.columns = [f"{c} GPUs" for c in mosaic.columns]
    names = [published.NEMO, published.NEMO_AB, published.MOSAIC]
    sources = published.load().set_index("source").loc[names].groupby("source", sort=False).agg(
        url=("url", "first"), hardware=("hardware", lambda h: "; ".join(h.unique())))
    return {"NeMo (samples/s)": nemo, "MosaicML (images/s)": mosaic, "sources": sources.reset_index()}


def published_scaling() -> pd.DataFrame:
    c = scaling.published_curves()
    return c[["curve", "nodes", "gpus", "value", "perfect_linear", "speedup", "efficiency"]]


# ---------------------------------------------------------------- figures and the side-by-side table
def _where(study: Study) -> str:
    if study.device == "cuda":
        return "here"
    return f"here ({launch.usable_cores()} CPU cores, {launch.thread_budget()} thread(s) split between the ranks)"


def scope_note(study: Study, measured: pd.DataFrame) -> str | None:
    """On a CPU, what ranks sharing this machine's cores can show beside GPU-cluster curves; None on a GPU."""
    if study.device == "cuda":
        return None
    ok = measured[measured["status"] == "ok"]
    worlds = sorted({int(w) for w in ok["world_size"]}) if len(ok) else []
    ranks = f"{' and '.join(map(str, worlds))} rank(s)" if worlds else "the ranks"
    return (f"Measured here: {ranks} as processes of one machine, sharing its {launch.usable_cores()} CPU cores "
            f"({launch.thread_budget()} thread(s) split between the ranks). That can show DDP's own overhead on one "
            "machine (gradient all-reduce, threads divided), not how training scales across GPUs or nodes: the "
            "published curves are GPU clusters.")


def _published_hardware(sources: list[str]) -> str:
    """The hardware of the published sources a figure draws, from the transcribed table."""
    t = published.load()
    return "; ".join(t[t.source.isin(sources)]["hardware"].drop_duplicates())


def save_figures(study: Study, measured: pd.DataFrame, tables: dict[str, pd.DataFrame]) -> dict:
    curves = scaling.published_curves()
    mine = figures.measured_curves(tables["weak"], tables["strong"], "here")
    note = scope_note(study, measured)
    title = f"Speed-up against perfect linear scaling: published GPUs and {_where(study)}"
    ok = measured[measured["status"] == "ok"]
    steps = sorted({int(v) for v in ok["timed_steps"]}) if len(ok) and "timed_steps" in ok else []
    n_here = (f"here: {len(ok)} configuration(s), one torchrun process group each, "
              f"{'/'.join(map(str, steps)) or 'no'} timed steps each")
    method = ("here: each configuration a fresh torchrun process group, timed steps after warm-up, samples/s = "
              "global batch / median step time of the slowest rank; published: transcribed from the sources "
              "(sdperf.config.published)")
    hardware = _published_hardware(list(curves.source.unique()))
    pub = f"published: {len(curves)} points on {curves['curve'].nunique()} curves ({hardware})"
    caption = dict(baseline="each curve's own samples/s at its smallest size (here: the smallest world size of the "
                   "same engine and batch), ratio of medians", method=method, n=f"{n_here}; {pub}")
    ratios = scaling.a100_to_h100()
    out = {"speedup": study.save_figure(
               figures.speedup_figure(curves, mine, title, note), "speedup",
               what="Training speed-up over each curve's smallest size against devices / smallest size (log2 axes): "
               "the published GPU sweeps beside the DDP/ZeRO sweep measured here, and perfect linear scaling",
               **caption),
           "efficiency": study.save_figure(
               figures.efficiency_figure(curves, mine, "Scaling efficiency", note), "efficiency",
               what="Scaling efficiency (speed-up / scale; 1.0 is perfect linear) of the published GPU sweeps and "
               "of the sweep measured here", **caption),
           "a100_h100": study.save_figure(
               figures.ratio_figure(ratios), "a100_to_h100",
               what="NeMo's published DGX H100 over DGX A100 training throughput, SD at 512px, per node count and in "
               "its 4-node comparison table, with the speed-up NeMo states",
               baseline="DGX A100 at the same node count (published)",
               method="ratio of the published throughputs (sdperf.config.published); nothing measured here",
               n=f"{len(ratios)} published pairs",
               taken_in={"published_hardware": _published_hardware(["NeMo SD training A100 vs H100"])}),
           "per_device": study.save_figure(
               figures.per_device_figure(published.throughput(), measured, "here", note), "per_device",
               what="Training samples/s per device (GPU, or rank here) against the number of devices, log-log: the "
               "published GPU sweeps beside this machine's ranks (bars: p10-p90 over timed steps)",
               baseline=figure_captions.NO_BASELINE + " (samples/s per device)", method=method, n=f"{n_here}; {pub}"),
           "memory": study.save_figure(
               figures.memory_figure(measured, _where(study)), "memory",
               what="Per-rank peak memory of every training configuration that ran (largest rank), the part held "
               "before the UNet was built hatched, training's own part written above each bar",
               baseline=figure_captions.NO_BASELINE + " (MiB)",
               method="each rank's peak memory over its run (" + (str(ok["memory_kind"].iloc[0]) if len(ok) and
                                                                  "memory_kind" in ok else "not measured") + ")",
               n=f"{len(ok)} configuration(s), the largest of each one's ranks")}
    return out


def published_vs_measured(study: Study, measured: pd.DataFrame, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Doubling the devices: each published curve's first step beside this machine's, and per-device samples/s."""
    curves = scaling.published_curves()
    weak = tables["weak"]
    doubled = weak[(weak.engine == "ddp") & (weak.scale == 2)]
    measured_2x = float(doubled.speedup.max()) if len(doubled) else None
    best = doubled.loc[doubled.speedup.idxmax()] if len(doubled) else None
    cond = (f"DDP weak scaling, batch {best.per_rank_batch}/rank, world {best.base_size} -> {best.world_size}, "
            f"{best.threads_per_rank} thread(s) per rank, {best.unet}; {study.env['device_name']}"
            if best is not None else "no world size 2 ran here")
    rows = []
    for curve, g in curves.groupby("curve", sort=False):
        first = g[g.scale == 2]
        src = g.iloc[0]
        rows.append(published_row(
            "speed-up from doubling the devices", f"{src.source} ({src.url})", src.hardware,
            f"{curve}: {int(first.gpus.iloc[0] // 2)} -> {int(first.gpus.iloc[0])} GPUs", float(first.speedup.iloc[0]),
            measured_2x, cond, detail=f"{src.value:g} -> {first.value.iloc[0]:g} samples/s"))
    ok = measured[(measured.status == "ok") & ~measured["control"].astype(bool)]
    one = ok[ok.world_size == ok.world_size.min()].sort_values("samples_per_s").tail(1)
    for curve, g in curves.groupby("curve", sort=False):
        src = g.iloc[0]
        rows.append(published_row(
            "samples/s per device at the smallest size", f"{src.source} ({src.url})", src.hardware,
            f"{curve}, {int(src.gpus)} GPUs", float(src.value / src.gpus),
            float(one.samples_per_s_per_rank.iloc[0]) if len(one) else None,
            (f"{one.unet.iloc[0]} at {one.resolution.iloc[0]}px, batch {one.per_rank_batch.iloc[0]}/rank, "
             f"{one.world_size.iloc[0]} rank(s); {study.env['device_name']}") if len(one) else "nothing ran here",
            unit=UNIT, detail="different model size, resolution and hardware: context, not a like-for-like ratio"))
    return pd.DataFrame(rows)


def limits(study: Study, prep: Prepared) -> str:
    """What this machine's sweep can and cannot show, from its device, sizes and thread budget."""
    worlds = sorted({c.world_size for c in prep.configs})
    if study.device == "cuda":
        return (f"One machine, world sizes {worlds} on {launch.available_devices('cuda')} GPU(s) with NCCL: this "
                "shows intra-node scaling (NVLink/PCIe all-reduce). Inter-node scaling (the NeMo and MosaicML "
                "curves beyond 8 GPUs) needs torchrun on several machines (README) and `extra_runs`.")
    cores, budget, top = launch.usable_cores(), launch.thread_budget(), max(worlds)
    one, most = launch.threads_per_rank("cpu", 1), top * launch.threads_per_rank("cpu", top)
    if most <= one:
        setting = (f"CPU only: world sizes {worlds} share a budget of {budget} thread(s) on {cores} core(s), each "
                   "rank getting budget // world size threads, so a larger world size adds no cores: perfect "
                   "linear scaling is out of reach by construction, and the reference point is speed-up 1.0, the "
                   "ideal for ranks that split the cores one rank already had. It is not a ceiling: a measured "
                   "speed-up above 1.0 means one rank with every thread left the cores partly idle (intra-op "
                   "threading does not scale perfectly over small ops and synchronizations) and ranks of fewer "
                   "threads fill them; the equal-threads efficiency below separates DDP's own cost from that. ")
    else:
        setting = (f"CPU only, thread budget {budget} ($OMP_NUM_THREADS) on {cores} core(s): one rank runs "
                   f"{one} thread(s) and {top} ranks run {most} in all, so the larger world size does bring more "
                   "cores, as each GPU does in the published sweeps; but the ranks share one memory bus, caches "
                   "and the all-reduce goes through shared memory, not a network. ")
    return setting + ("What the sweep does show: that the DDP/ZeRO code path is right (ranks end bit-identical), "
                      "what gradient all-reduce over gloo and a process per rank cost, how threads within a rank "
                      "compare with ranks across cores, and per-rank memory of DDP vs ZeRO. What it cannot show: "
                      "GPU kernels, NVLink/InfiniBand all-reduce, multi-node behaviour, or why the published "
                      "curves bend where they do.")
