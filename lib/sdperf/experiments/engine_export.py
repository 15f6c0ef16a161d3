"""07_engine_export: the UNet exported to inference engines (ONNX Runtime, OpenVINO, TensorRT) against fp32 eager:
set-up cost (export, build) apart from steady-state latency, drift, and the NeMo table's batch 1/2/4 sweep."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import torch

from sdperf import drift, published
from sdperf.comparison import BASELINE, Comparison, Variant, published_row, release, run_variants
from sdperf.generation import encode, initial_latents
from sdperf.optimizations import engine_export, openvino_engine
from sdperf.optimizations.unet_graph import EngineUNet
from sdperf.paths import profile_reports
from sdperf.plots import speedup_bars
from sdperf.timing import Timing, measure, peak_memory, ratio, reset_peak_memory

DTYPES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "f16": "float16", "fp16": "float16"}
LOSSLESS_REL_ERROR = 1e-3  # an engine whose latents move more than this is not a drop-in for the sweep
SETUP_COLUMNS = ["variant", "engine", "exporter", "export_s", "build_s", "setup_s", "first_call_s", "export_mib",
                 "setup_peak_mib", "precision", "dynamic_batch"]


def unet_batch(study, batch_size: int) -> int:
    """Images per prompt -> UNet batch: classifier-free guidance runs the uncond and cond halves together."""
    return batch_size * (2 if study.profile.guidance_scale > 1.0 else 1)


def openvino_default() -> str:
    """The precision OpenVINO's CPU plugin picks here when given no hint, or why it cannot be asked."""
    try:
        return openvino_engine.default_precision()
    except ImportError:
        return "unknown: the openvino package is not installed"


def _build_kwargs(study, batch_size: int, exporter: str) -> dict:
    sizes = study.profile.batch_sizes
    return dict(batch=unet_batch(study, batch_size), latent_size=study.profile.latent_size, exporter=exporter,
                scratch_root=profile_reports(study.profile.name),
                batch_range=(unet_batch(study, min(sizes)), unet_batch(study, max(sizes))))


def _apply(study, name: str, batch_size: int, exporter: str):
    """engine_export.apply, with the peak memory of the export and build (the heaviest moment) in its facts."""
    def apply(pipe):
        reset_peak_memory(study.device)
        pipe = engine_export.apply(pipe, name, **_build_kwargs(study, batch_size, exporter))
        pipe.unet.facts["setup_peak_mib"] = peak_memory(study.device)[0] / 2**20
        return pipe
    return apply


def _variant(study, spec: engine_export.EngineSpec, exporter: str, label: str | None = None) -> Variant:
    """Every engine is handed the fp32 PyTorch pipeline (dtype float32): the engine applies its own precision,
    which its label names and its export/build rows record as the precision actually used."""
    ok, reason = engine_export.availability(study.device, spec.name)
    return Variant(label=label or spec.label, apply=_apply(study, spec.name, 1, exporter), availability=(ok, reason),
                   dtype="float32", note=reason, facts=lambda pipe: dict(pipe.unet.facts))


def _openvino_default(study, spec, specs, exporter: str) -> Variant | dict:
    """'openvino-default' resolved to the precision the CPU plugin picks here; when that configuration is
    already in the list it is recorded as skipped (a row saying so), not timed twice."""
    used = openvino_engine.default_precision()
    label = spec.label.replace("default", f"default ({used})")
    twin = engine_export.EngineSpec("openvino", used, spec.static)
    if twin not in specs:
        return _variant(study, spec, exporter, label)
    reason = (f"OpenVINO's default INFERENCE_PRECISION_HINT on this CPU is {used}: the same compiled configuration "
              f"as the '{twin.label}' row, not timed twice")
    study.recorder.skipped(f"{label}, batch 1", reason)
    return {"variant": label, "status": "skipped", "note": f"skipped: {reason}"}


def plan(study, names: list[str], exporter: str) -> tuple[list[Variant], list[dict]]:
    """The variants to time, and the rows of those not timed because another row already covers them."""
    specs = [engine_export.parse(n) for n in names]
    resolve = [s.engine == "openvino" and s.precision == "default" and
               engine_export.availability(study.device, s.name)[0] for s in specs]
    out = [_openvino_default(study, s, specs, exporter) if r else _variant(study, s, exporter)
           for s, r in zip(specs, resolve)]
    return [v for v in out if isinstance(v, Variant)], [v for v in out if isinstance(v, dict)]


def _record_setup(study, cmp: Comparison) -> None:
    """Export and build time as their own rows (run_variants records their sum as 'setup')."""
    rows = []
    for label, f in cmp.facts.items():
        scenario, dtype = f"{label}, batch 1", DTYPES.get(f.get("precision"), "float32")
        rows += [dict(scenario=scenario, metric="export", value=f["export_s"], unit="s", n=1, dtype=dtype,
                      note=f"{f['exporter']}; dynamic batch axis: {f['dynamic_batch']}"
                      + (f"; exported graph {f['export_mib']:.0f} MiB (deleted after loading)" if "export_mib" in f
                         else "")),
                 dict(scenario=scenario, metric="build", value=f["build_s"], unit="s", n=1, dtype=dtype,
                      note=f"{f['engine']}; precision actually used: {f['precision']}"),
                 dict(scenario=scenario, metric="setup_peak_memory", value=f["setup_peak_mib"], unit="MiB", n=1,
                      dtype=dtype, note="peak RSS (or CUDA allocated) while exporting and building, baseline "
                      "pipeline included")]
    if rows:
        study.recorder.add_many(rows)


def compare_engines(study, names: list[str], exporter: str = "dynamo") -> Comparison:
    """fp32 eager, then each engine on a fresh copy of the same network, batch 1; the baseline re-timed last."""
    variants, skipped = plan(study, names, exporter)
    cmp = run_variants(study, variants, batch_size=1)
    _record_setup(study, cmp)
    if skipped:
        cmp.table = pd.concat([cmp.table, pd.DataFrame(skipped)], ignore_index=True).reindex(
            columns=cmp.table.columns)
    return cmp


def setup_table(cmp: Comparison) -> pd.DataFrame:
    """What getting each engine ready cost, split into export and build, beside its first call."""
    t = cmp.table.set_index("variant")
    rows = [{"variant": label, "engine": f["engine"], "exporter": f["exporter"], "export_s": f["export_s"],
             "build_s": f["build_s"], "setup_s": t.loc[label, "setup_s"], "first_call_s": t.loc[label, "first_call_s"],
             "export_mib": f.get("export_mib"), "setup_peak_mib": f["setup_peak_mib"], "precision": f["precision"],
             "dynamic_batch": f["dynamic_batch"]} for label, f in cmp.facts.items()]
    return pd.DataFrame(rows, columns=SETUP_COLUMNS)


def best_engine(cmp: Comparison) -> str | None:
    """The engine name with the fastest UNet step among those that keep the latents (rel. error <= 1e-3)."""
    ok = cmp.ok()
    ok = ok[ok.variant.isin(list(cmp.facts)) & (ok.latent_rel_error <= LOSSLESS_REL_ERROR)]
    if ok.empty:
        return None
    return cmp.facts[ok.loc[ok.unet_step_speedup.idxmax(), "variant"]]["name"]


def cmp_label(cmp: Comparison, name: str | None) -> str | None:
    """The comparison's row label of the engine called `name`."""
    return next((k for k, f in cmp.facts.items() if f["name"] == name), None)


def unet_inputs(study, pipe, batch_size: int) -> tuple:
    """What the loop feeds the UNet at the first step for `batch_size` images: scaled noise on the guidance
    batch, the first timestep, the text context (computed by the pipeline's own text encoder)."""
    w = study.workload(batch_size)
    sched = pipe.scheduler
    sched.set_timesteps(w.steps, device=study.device)
    with torch.inference_mode():
        embeds, _ = encode(pipe, w, study.device)
        x = initial_latents(pipe, w).to(study.device) * sched.init_noise_sigma
        x = torch.cat([x] * 2) if w.guidance_scale > 1.0 else x
        return sched.scale_model_input(x, sched.timesteps[0]), sched.timesteps[0], embeds


def time_unet(study, unet, inputs: tuple) -> tuple[Timing, torch.Tensor]:
    """One UNet call timed like a generation (first call apart, then the profile's repeats); its output."""
    x, t, ctx = inputs
    out = []

    def call():
        with torch.inference_mode():
            out[:] = [unet(x, t, encoder_hidden_states=ctx, return_dict=False)[0]]

    p = study.profile
    timing = measure(call, device=study.device, warmup=p.warmup, repeats=p.repeats)
    return timing, out[0].float().cpu()


def batch_sweep(study, cmp: Comparison, name: str, batch_sizes: list[int], exporter: str = "dynamo") -> pd.DataFrame:
    """The NeMo table's shape on the part that is exported: one UNet call, fp32 eager vs the engine, at each
    batch size, on the same inputs. The eager calls go first; then the same pipeline's UNet is swapped for the
    engine once (the ONNX batch axis is dynamic; OpenVINO with static shapes recompiles on a new batch, which
    lands in that batch's first call). A static ONNX graph (dynamic export failed) is exported again per batch."""
    rec, label = study.recorder, cmp_label(cmp, name)
    dtype = DTYPES.get(cmp.facts[label]["precision"], "float32")
    pipe = study.pipeline("float32")
    inputs = {b: unet_inputs(study, pipe, b) for b in batch_sizes}
    eager = {b: time_unet(study, pipe.unet, inputs[b]) for b in batch_sizes}
    rows = []
    for b in batch_sizes:
        scenario = f"{label}, UNet call, batch {b}"
        try:
            if not isinstance(pipe.unet, EngineUNet) or not _serves_any_batch(pipe.unet):
                pipe = _apply(study, name, b, exporter)(pipe if not isinstance(pipe.unet, EngineUNet)
                                                         else study.pipeline("float32"))
                rec.add(scenario, "setup", pipe.unet.facts["export_s"] + pipe.unet.facts["build_s"], "s", n=1,
                        dtype=dtype, note="export + build for the sweep")
            engine = time_unet(study, pipe.unet, inputs[b])
        except Exception as exc:  # e.g. a batch outside a TensorRT profile: recorded, the other batches go on
            rec.failed(scenario, exc, metric="unet_call")
            rows.append({"batch_size": b, "status": "failed", "note": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        rows.append(_record_sweep(study, label, dtype, b, eager[b], engine))
    pipe = None
    release()
    return pd.DataFrame(rows)


def _serves_any_batch(engine) -> bool:
    return engine.facts["dynamic_batch"] or engine.facts.get("static_shapes", False)


def _record_sweep(study, label: str, dtype: str, b: int, eager: tuple, engine: tuple) -> dict:
    """Rows for one batch size: both timings, the speed-up with its p10/p90 range, the output drift."""
    rec, (te, oe), (tg, og) = study.recorder, eager, engine
    rec.timing(f"{BASELINE}, UNet call, batch {b}", te, metric="unet_call", dtype="float32")
    scenario = f"{label}, UNet call, batch {b}"
    rec.timing(scenario, tg, metric="unet_call", dtype=dtype)
    r, err = ratio(te, tg), drift.relative_error(og, oe)
    rec.add_many([dict(scenario=scenario, metric="unet_call_speedup_vs_fp32", value=r["speedup"], unit="x",
                       p10=r["speedup_lo"], p90=r["speedup_hi"], n=len(tg.times), dtype=dtype,
                       note="ratio of medians; range from the p10/p90 of both"),
                  dict(scenario=scenario, metric="unet_rel_error", value=err, unit="", dtype=dtype,
                       note="||engine - eager|| / ||eager|| on the same UNet inputs")])
    return {"batch_size": b, "status": "ok", "unet_batch": int(oe.shape[0]), "framework_unet_s": te.median,
            "engine_unet_s": tg.median, "engine_first_call_s": tg.first_call, "speedup": r["speedup"],
            "speedup_lo": r["speedup_lo"], "speedup_hi": r["speedup_hi"], "unet_rel_error": err}


def nemo_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """NeMo's framework fp16 AMP vs TensorRT fp16 latency (SD 1.x, A100) beside the sweep measured here."""
    nemo = published.select("NeMo SD inference", model="SD 1.x")
    fw = nemo[nemo.config == "framework fp16 AMP"].set_index("batch_size")["value"]
    trt = nemo[nemo.config == "TensorRT fp16"].set_index("batch_size")["value"]
    out = sweep.reindex(columns=["batch_size", "status", "unet_batch", "framework_unet_s", "engine_unet_s",
                                 "speedup", "speedup_lo", "speedup_hi"])
    out["nemo_framework_s"] = out.batch_size.map(fw)
    out["nemo_tensorrt_s"] = out.batch_size.map(trt)
    out["nemo_speedup"] = out.nemo_framework_s / out.nemo_tensorrt_s
    return out


def published_vs_measured(study, cmp: Comparison, sweep: pd.DataFrame | None, best: str | None) -> pd.DataFrame:
    """NeMo's engine speed-up per batch against the best engine's here; the HF blog's OpenVINO rungs against
    this machine's OpenVINO f32 (dynamic and static shapes)."""
    label = cmp_label(cmp, best)
    nemo = "NeMo SD inference", "NVIDIA A100 80GB", "SD 1.x, 512px, 50 PLMS steps; fp16 AMP -> TensorRT fp16 " \
                                                     "(text encoder, UNet and VAE)"
    rows = []
    for b in sorted(set(published.select(nemo[0], model="SD 1.x").batch_size)):
        fw = published.value(nemo[0], model="SD 1.x", batch_size=b, config="framework fp16 AMP")
        trt = published.value(nemo[0], model="SD 1.x", batch_size=b, config="TensorRT fp16")
        got = sweep[(sweep.batch_size == b) & (sweep.status == "ok")] if sweep is not None else pd.DataFrame()
        measured = float(got.speedup.iloc[0]) if len(got) else None
        rows.append(published_row(
            f"framework -> engine speed-up, batch {b}", *nemo, fw / trt, measured,
            study.conditions(b, scope=f"one UNet call on the guidance batch ({unet_batch(study, b)})")
            + f"; fp32 eager -> {label or 'no engine'}", detail=f"{fw} s -> {trt} s"))
        if b == 1 and label in cmp.runs:
            rows.append(published_row(
                "framework -> engine speed-up, batch 1", *nemo, fw / trt,
                float(cmp.table.set_index("variant").loc[label, "speedup"]),
                study.conditions(1) + f"; fp32 eager -> {label}, UNet only (text encoder and VAE in PyTorch)",
                detail=f"{fw} s -> {trt} s"))
    hf = "HF blog stable-diffusion-inference-intel"
    fp32 = published.value(hf, config="fp32")
    ok = cmp.ok().set_index("variant")
    for config, spec in (("OpenVINO", "openvino-f32"), ("OpenVINO static shapes", "openvino-f32-static")):
        lab = engine_export.parse(spec).label
        got = float(ok.loc[lab, "speedup"]) if lab in ok.index else None
        rows.append(published_row(
            f"fp32 PyTorch -> {config}", hf, "Intel Sapphire Rapids CPU", "SD, 512px", fp32 / published.value(
                hf, config=config), got, study.conditions(1) + f"; fp32 eager -> {lab} (UNet only)",
            detail=f"{fp32} s -> {published.value(hf, config=config)} s"))
    return pd.DataFrame(rows)


def plot(study, cmp: Comparison, sweep: pd.DataFrame | None, best: str | None = None):
    """Left: speed-up of each engine at batch 1. Right: the NeMo table's shape, eager vs engine per batch."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    speedup_bars(cmp.table[cmp.table.variant.isin(list(cmp.facts))], f"engines vs fp32 eager, whole generation, "
                 f"batch 1 ({study.device})", ax=axes[0])
    if sweep is not None:
        x = range(len(sweep))
        axes[1].bar([i - 0.2 for i in x], sweep.framework_unet_s, width=0.4, label="fp32 eager")
        axes[1].bar([i + 0.2 for i in x], sweep.engine_unet_s, width=0.4, label=cmp_label(cmp, best))
        axes[1].set_xticks(list(x), [f"batch {b}" for b in sweep.batch_size])
        axes[1].set(ylabel="one UNet call (s)", title="framework vs engine per batch size (NeMo's table shape)")
        axes[1].legend()
    study.save_figure(fig, "engine_speedup")
    return fig
