"""07_engine_export: the UNet exported to inference engines (`engine:<name>`: ONNX Runtime, OpenVINO, TensorRT)
against fp32 eager by run_variants: set-up cost apart from steady-state latency, drift, and the NeMo table's batch
sweep; then the two stages around the loop run by OpenVINO (`stages:<engine>`), alone, with their own times.

NeMo's figures are whole generations at 50 PLMS steps, so the sweep compares `seed_speedup`: per image at 50
steps, composed from the stages each worker measured at the profile's few steps (said so wherever shown)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from sdperf.config import published
from sdperf.measure import rounds
from sdperf.select import engine_sweep
from sdperf.store import plots
from sdperf.measure.comparison import BASELINE, TWIN, Comparison, published_row, run_variants
from sdperf.experiments.common import interpolated, ratio_columns, rounds_method, rounds_n, with_skipped
from sdperf.optimizations import catalog, engine_export, openvino_engine
from sdperf.store.plots import speedup_bars

DTYPES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "f16": "float16", "fp16": "float16"}
STAGE_COLUMNS = ["variant", "key", "status", *ratio_columns("speedup", "seed_speedup"), "vae_decode_s",
                 "vae_decode_s_fp32", "vae_decode_speedup", "vae_decode_speedup_lo", "vae_decode_speedup_hi",
                 "text_encoder_s", "text_encoder_s_fp32", "text_encoder_speedup", "latent_rel_error", "image_psnr_db",
                 "verdict", "note"]
SETUP_COLUMNS = ["variant", "engine", "exporter", "export_s", "build_s", "setup_s", "setup_warm_s", "first_call_s",
                 "export_mib", "setup_peak_mib", "precision", "dynamic_batch"]


def openvino_default() -> str:
    """The precision OpenVINO's CPU plugin picks here when given no hint, or why it cannot be asked."""
    try:
        return openvino_engine.default_precision()
    except ImportError:
        return "unknown: the openvino package is not installed"


def name(key: str) -> str:
    """'engine:openvino-f32' -> 'openvino-f32', checked by the catalog (an unknown one names the valid ones)."""
    tech = catalog.get(key)
    if not tech.key.startswith("engine:"):
        raise ValueError(f"{key!r} is not an engine; give engine:<name>, names: "
                         f"{', '.join(engine_export.valid_names())}")
    return tech.key.split(":", 1)[1]


def plan(study, keys: list[str]) -> tuple[list, list[dict]]:
    """The items to time, and skipped rows: 'openvino-default' resolved to the precision the CPU plugin picks here is
    a skipped row when that engine is already in the list (not timed twice)."""
    items, skipped = [], []
    for k in keys:
        spec = engine_export.parse(name(k))
        if not (spec.engine == "openvino" and spec.precision == "default"
                and engine_export.availability(study.device, spec.name)[0]):
            items.append(k)
            continue
        used = openvino_engine.default_precision()
        twin = "engine:" + engine_export.EngineSpec("openvino", used, spec.static).name
        display = f"{k} ({used})"
        if twin not in keys:
            items.append((display, k))
            continue
        reason = (f"OpenVINO's default INFERENCE_PRECISION_HINT on this CPU is {used}: the same compiled "
                  f"configuration as the '{twin}' row, not timed twice")
        study.recorder.skipped(f"{display}, batch 1", reason, batch_size=1)
        skipped.append({"variant": display, "key": k, "status": "skipped", "note": f"skipped: {reason}"})
    return items, skipped


SETUP_METHOD = ("the last round's worker process: export, then engine build, each timed once (wall clock), apart from "
                "the steady-state rounds; peak RSS (or CUDA allocated) over both")


def _record_setup(study, cmp: Comparison) -> None:
    """Export and build time as their own rows (run_variants records their sum as 'setup')."""
    rows = []
    for label, f in cmp.facts.items():
        if "export_s" not in f:
            continue
        scenario, dtype = f"{label}, batch 1", DTYPES.get(f.get("precision"), "float32")
        key = cmp.row(label)["key"]
        common = dict(n=1, dtype=dtype, key=key, batch_size=1, method=SETUP_METHOD)
        rows += [dict(scenario=scenario, metric="export", value=f["export_s"], unit="s", **common,
                      note=f"{f['exporter']}; dynamic batch axis: {f['dynamic_batch']}"
                      + (f"; exported graph {f['export_mib']:.0f} MiB (deleted after loading)" if "export_mib" in f
                         else "")),
                 dict(scenario=scenario, metric="engine_build", value=f["build_s"], unit="s", **common,
                      note=f"{f['engine']}; precision actually used: {f['precision']}"),
                 dict(scenario=scenario, metric="setup_peak_memory", value=f["setup_peak_mib"], unit="MiB", **common,
                      note="the worker's fp32 pipeline included")]
    if rows:
        study.recorder.add_many(rows)


def compare_engines(study, keys: list[str], batch_size: int = 1) -> Comparison:
    items, skipped = plan(study, keys)
    cmp = run_variants(study, items, batch_size=batch_size)
    _record_setup(study, cmp)
    return with_skipped(cmp, skipped)


def stage_key(key: str) -> str:
    """A `stages:<engine>` key (the text encoder and VAE decoder run by an engine), checked by the catalog."""
    tech = catalog.get(key)
    if tech.family != catalog.STAGES:
        raise ValueError(f"{key!r} is not a stage engine; give one of: "
                         f"{', '.join(catalog.keys(family=catalog.STAGES))}")
    return tech.key


def compare_stages(study, keys: list[str]) -> Comparison:
    """Each stage engine alone against fp32 eager, timed as whole generations (not composed as a UNet engine's)."""
    cmp = run_variants(study, [stage_key(k) for k in keys])
    _record_setup(study, cmp)
    return cmp


def _stage_seconds(raw: pd.DataFrame, stage: str) -> pd.Series:
    """Each worker's seconds per image in `stage` (the per-call stage table every worker hands back)."""
    def one(records) -> float:
        if not isinstance(records, list):
            return float("nan")
        found = [r.get("seconds_per_image_call") for r in records if r.get("stage") == stage]
        return float(found[0]) if found else float("nan")
    return raw["stages"].map(one) if "stages" in raw else pd.Series(float("nan"), index=raw.index)


def _stage_ratio(raw: pd.DataFrame, config: str, stage: str) -> dict:
    """One stage's seconds for `config` and fp32 eager's interpolated to each of its rounds: medians, ratio min-max."""
    col = f"{stage}_s"
    raw = raw.assign(**{col: _stage_seconds(raw, stage)})
    mine = raw[(raw.config == config) & (raw.status == "ok") & raw[col].notna()]
    if mine.empty or not (raw.config == BASELINE).any():
        return {}
    ref = rounds.baseline_at(raw, col, (mine.t_start + mine.t_end) / 2)
    ratio = ref / mine[col].to_numpy(dtype=float)
    return {col: float(mine[col].median()), f"{col}_fp32": float(pd.Series(ref).median()),
            f"{stage}_speedup": float(pd.Series(ratio).median()), f"{stage}_speedup_lo": float(ratio.min()),
            f"{stage}_speedup_hi": float(ratio.max())}


def stage_summary(cmp: Comparison) -> pd.DataFrame:
    """Per stage engine: per image against fp32 eager at the profile's steps and at 50 (composed), the VAE decode's
    and the text encoder's seconds beside fp32 eager's at the same moments, and the drift."""
    rows = []
    for r in cmp.table[~cmp.table.variant.isin([BASELINE, TWIN])].to_dict("records"):
        row = {k: r.get(k) for k in ("variant", "key", "status", *ratio_columns("speedup", "seed_speedup"))}
        if r["status"] == "ok":
            for stage in ("vae_decode", "text_encoder"):
                row.update(_stage_ratio(cmp.measured.raw, r["variant"], stage))
        row.update({k: r.get(k) for k in ("latent_rel_error", "image_psnr_db", "verdict", "note")})
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=STAGE_COLUMNS)


def summary(cmp: Comparison) -> pd.DataFrame:
    cols = ["variant", "status", "setup_s", "setup_warm_s", "first_call_s", "latency_s", "unet_step_s",
            *ratio_columns("speedup", "unet_step_speedup"), "peak_memory_mib", "latent_rel_error", "image_psnr_db",
            "verdict", "note"]
    return cmp.table[cols]


def setup_table(cmp: Comparison) -> pd.DataFrame:
    """Each engine's export and build (last round) beside the set-up cold (round 0) and warm, and the first call."""
    t = cmp.table.set_index("variant")
    rows = [{"variant": label, "engine": f["engine"], "exporter": f["exporter"], "export_s": f["export_s"],
             "build_s": f["build_s"], "setup_s": t.loc[label, "setup_s"], "setup_warm_s": t.loc[label, "setup_warm_s"],
             "first_call_s": t.loc[label, "first_call_s"], "export_mib": f.get("export_mib"),
             "setup_peak_mib": f["setup_peak_mib"], "precision": f["precision"],
             "dynamic_batch": f["dynamic_batch"]} for label, f in cmp.facts.items() if "export_s" in f]
    return pd.DataFrame(rows, columns=SETUP_COLUMNS)


def best_engine(cmp: Comparison) -> str | None:
    """The latent-keeping engine with the fastest UNet step, by the rule `sdperf run` also applies (engine_sweep)."""
    return engine_sweep.best_engine(cmp)


def batch_sweep(study, cmp: Comparison, key: str, batch_sizes: list[int], budget_s: float) -> pd.DataFrame:
    """fp32 eager against the engine per batch size (batch 1 is `cmp`); one estimated over `budget_s` is skipped."""
    rows = []
    for b in batch_sizes:
        if b == 1:
            c = cmp
        else:
            est = engine_sweep.estimate_s(study.profile, cmp, key, b)
            if est > budget_s:
                reason = (f"estimated {est:.0f} s for batch {b} (scaled from batch 1) exceeds sweep_budget_s="
                          f"{budget_s:.0f}")
                study.recorder.skipped(f"{key}, batch {b}", reason, batch_size=b)
                rows.append({"batch_size": b, "status": "skipped", "note": reason})
                continue
            try:
                c = run_variants(study, [key], batch_size=b)
            except Exception as exc:  # recorded; the other batch sizes go on
                study.recorder.failed(f"{key}, batch {b}", exc, metric="latency", batch_size=b)
                rows.append({"batch_size": b, "status": "failed", "note": f"{type(exc).__name__}: {exc}"[:300]})
                continue
        r, base = c.row(key), c.row(BASELINE)
        if r is None or r["status"] != "ok":
            rows.append({"batch_size": b, "status": r["status"] if r else "failed", "note": r["note"] if r else ""})
            continue
        rows.append({"batch_size": b, "status": "ok", "framework_s_per_image_seed": base["s_per_image_seed"],
                     "engine_s_per_image_seed": r["s_per_image_seed"],
                     **{k: r[k] for k in ratio_columns("seed_speedup", "unet_step_speedup")}, "rounds": r["rounds"],
                     "method": c.method})
    return pd.DataFrame(rows)


def nemo_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """NeMo's framework fp16 AMP vs TensorRT fp16 latency (SD 1.x, A100, 50 PLMS steps) beside the sweep here."""
    nemo = published.select("NeMo SD inference", model="SD 1.x", metric="latency").astype({"batch_size": int})
    fw = nemo[nemo.what == "framework fp16 AMP"].set_index("batch_size")["value"]
    trt = nemo[nemo.what == "TensorRT fp16"].set_index("batch_size")["value"]
    out = sweep.reindex(columns=["batch_size", "status", "framework_s_per_image_seed", "engine_s_per_image_seed",
                                 "seed_speedup", "seed_speedup_lo", "seed_speedup_hi", "seed_speedup_verdict"])
    out["nemo_framework_s"] = out.batch_size.map(fw)
    out["nemo_tensorrt_s"] = out.batch_size.map(trt)
    out["nemo_speedup"] = out.nemo_framework_s / out.nemo_tensorrt_s
    return out


def _said(r: dict | pd.Series, ratio: str, method: str) -> str:
    return f"range {r[ratio + '_lo']:.2f}-{r[ratio + '_hi']:.2f}x over rounds, {r[ratio + '_verdict']}; {method}"


def published_vs_measured(study, cmp: Comparison, sweep: pd.DataFrame | None, best: str | None) -> pd.DataFrame:
    """NeMo's engine speed-up per batch beside the best engine's; the HF blog's OpenVINO rungs beside OpenVINO f32."""
    nemo = "NeMo SD inference", "NVIDIA A100 80GB", "SD 1.x, 512px, 50 PLMS steps; fp16 AMP -> TensorRT fp16 " \
                                                     "(text encoder, UNet and VAE)"
    rows = []
    for b in sorted(set(published.select(nemo[0], model="SD 1.x", metric="latency").batch_size.astype(int))):
        fw = published.value(nemo[0], model="SD 1.x", batch_size=b, what="framework fp16 AMP")
        trt = published.value(nemo[0], model="SD 1.x", batch_size=b, what="TensorRT fp16")
        got = sweep[(sweep.batch_size == b) & (sweep.status == "ok")] if sweep is not None else pd.DataFrame()
        measured = float(got.seed_speedup.iloc[0]) if len(got) else None
        how = _said(got.iloc[0], "seed_speedup", got.method.iloc[0]) if len(got) else "not measured"
        rows.append(published_row(
            f"framework -> engine speed-up, batch {b}", published.cite(nemo[0]), *nemo[1:], fw / trt, measured,
            study.conditions(b, scope="per image at 50 PLMS steps, composed from the measured stages")
            + f"; fp32 eager -> {best or 'no engine'} (UNet only; text encoder and VAE in PyTorch); {how}",
            detail=f"{fw} s -> {trt} s"))
    hf = "Hugging Face / Intel blog"
    fp32 = published.value(hf, what="fp32")
    ok = cmp.ok().set_index("key")
    for config, key in (("OpenVINO", "engine:openvino-f32"), ("OpenVINO static shapes", "engine:openvino-f32-static")):
        got = ok.loc[key] if key in ok.index else None
        rows.append(published_row(
            f"fp32 PyTorch -> {config}", published.cite(hf), "Intel Sapphire Rapids CPU", "SD, 512px",
            fp32 / published.value(hf, what=config), float(got["seed_speedup"]) if got is not None else None,
            study.conditions(1, scope="per image at 50 PLMS steps, composed from the measured stages")
            + f"; fp32 eager -> {key} (UNet only)" + (f"; {_said(got, 'seed_speedup', cmp.method)}"
                                                      if got is not None else ""),
            detail=f"{fp32} s -> {published.value(hf, what=config)} s"))
    return pd.DataFrame(rows)


def plot(study, cmp: Comparison, sweep: pd.DataFrame | None, best: str | None = None):
    """Left: each engine's speed-up at batch 1. Right: the best engine's per image at 50 steps per batch size."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    drawn = cmp.table[cmp.table.variant != TWIN]
    speedup_bars(drawn, f"engines vs fp32 eager, whole generation, batch 1 ({study.device})", ax=axes[0])
    ok = sweep[sweep.status == "ok"] if sweep is not None and len(sweep) else None
    if ok is not None and len(ok):
        err = [ok.seed_speedup - ok.seed_speedup_lo, ok.seed_speedup_hi - ok.seed_speedup]
        axes[1].bar([f"batch {b}" for b in ok.batch_size], ok.seed_speedup, yerr=err, capsize=4)
        axes[1].axhline(1.0, color="grey", ls=":")
        scale = plots.ratio_scale(axes[1], [1.0, *ok.seed_speedup, *ok.seed_speedup_lo, *ok.seed_speedup_hi])
        axes[1].set(ylabel="speed-up vs fp32 eager (x" + (", log)" if scale == "log" else ")"),
                    title=f"{best} per batch size, per image at 50 steps (composed)")
    n = rounds_n(study, drawn)
    method = rounds_method(cmp, drawn)
    if ok is not None and len(ok):
        r = ok["rounds"].astype(int) if "rounds" in ok else pd.Series([], dtype=int)
        n += (f"; right: {r.min() if r.min() == r.max() else f'{r.min()}-{r.max()}'} rounds per batch size"
              if len(r) else "")
        method += ("; right: each batch size a run of its own, per image at 50 PLMS steps composed from the "
                   "measured stages")
    study.save_figure(fig, "engine_speedup",
                      what="Exported engines (ONNX Runtime, OpenVINO, TensorRT where present) against fp32 eager: "
                      "speed-up per image at the profile's steps at batch 1 (left; median, bars: min-max over "
                      "rounds, label: PSNR vs fp32), and the fastest latent-keeping engine per batch size (right)",
                      baseline=interpolated(BASELINE) + "; right: fp32 eager at the same batch size",
                      method=method, n=n)
    return fig
