"""01_half_precision: fp16 and bf16 against fp32, side by side in one run, on the same weights and latents."""
from __future__ import annotations

import gc

import matplotlib.pyplot as plt
import pandas as pd
import torch

from sdperf import published
from sdperf.environment import cpu_isa
from sdperf.experiments.baseline import LABEL as FP32_LABEL
from sdperf.experiments.baseline import record_run
from sdperf.measurements import block_comparison, compare_runs, timed_generation, unet_flops
from sdperf.optimizations import half_precision
from sdperf.roofline import achieved, matmul_peak
from sdperf.study import Study

VARIANTS = ("float16", "bfloat16")
FP32_SCENARIO = f"{FP32_LABEL}, batch 1 (01 reference)"


def _free(pipe) -> None:
    del pipe
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _record_comparison(study: Study, scenario: str, dtype: str, cmp: dict, n: int, metrics) -> None:
    study.recorder.add_many(
        [dict(scenario=scenario, metric="speedup_vs_fp32", value=cmp["speedup"], unit="x", p10=cmp["speedup_lo"],
              p90=cmp["speedup_hi"], n=n, dtype=dtype, note="ratio of medians; range from p10/p90 of both")]
        + [dict(scenario=scenario, metric=m, value=cmp[m], unit=u, dtype=dtype, note=cmp.get("verdict", ""))
           for m, u in metrics])


def _block_only(study: Study, workload, dtype: str, block: dict) -> dict:
    """Record the block-level comparison that stands in for a whole generation too slow to time here."""
    p = study.profile
    scenario = f"{dtype}, UNet {block['block']} only (real shapes), batch {workload.batch_size}"
    study.recorder.timing(f"float32, UNet {block['block']} only (real shapes), batch {workload.batch_size}",
                          block["baseline_timing"], dtype="float32")
    study.recorder.timing(scenario, block["variant_timing"], dtype=dtype)
    _record_comparison(study, scenario, dtype, block, len(block["variant_timing"].times),
                       [("block_rel_error", "")])
    calls = p.warmup + p.repeats
    reason = (f"one UNet block runs {1 / block['speedup']:.1f}x slower than float32 here, so {calls} whole "
              f"generations would exceed variant_budget_s={p.variant_budget_s}; the block-level ratio is "
              f"recorded under '{scenario}'")
    study.recorder.skipped(f"{dtype} weights+activations, batch {workload.batch_size}", reason)
    return {"dtype": dtype, "status": "block only", "note": reason, "speedup": block["speedup"],
            "speedup_lo": block["speedup_lo"], "speedup_hi": block["speedup_hi"],
            "latency_s": block["variant_timing"].median, "p10_s": block["variant_timing"].p10,
            "p90_s": block["variant_timing"].p90, "block_rel_error": block["block_rel_error"],
            "peak_memory_mib": block["variant_timing"].peak_memory_bytes / 2**20
            if block["variant_timing"].peak_memory_bytes else None}


def compare_precisions(study: Study) -> tuple[pd.DataFrame, dict]:
    """fp32, then each half precision, at one batch size: speed ratio, memory and drift rows.

    Each variant is first compared on one real UNet block (cheap); when that ratio says whole generations
    would overrun the profile's variant_budget_s, the block-level figures are what gets recorded."""
    p = study.profile
    batch_size = 1
    workload = study.workload(batch_size)
    pipe32 = study.pipeline("float32")
    base = timed_generation(pipe32, workload, device=study.device, warmup=p.warmup, repeats=p.repeats,
                            label=FP32_LABEL)
    record_run(study, base, FP32_SCENARIO)
    rows, runs = [], {"float32": base}
    for dtype in VARIANTS:
        scenario = f"{dtype} weights+activations, batch {batch_size}"
        ok, reason = half_precision.availability(study.device, dtype)
        if not ok:
            study.recorder.not_applicable(scenario, reason)
            rows.append({"dtype": dtype, "status": "not applicable", "note": reason})
            continue
        try:
            block = block_comparison(pipe32, workload, half_precision.HALF[dtype], device=study.device,
                                     warmup=p.warmup, repeats=p.repeats)
            if base.timing.median / block["speedup"] * (p.warmup + p.repeats) > p.variant_budget_s:
                rows.append(_block_only(study, workload, dtype, block))
                continue
            pipe = half_precision.apply(study.pipeline("float32"), dtype)
            run = timed_generation(pipe, workload, device=study.device, warmup=p.warmup, repeats=p.repeats,
                                   label=dtype)
            _free(pipe)
        except Exception as exc:  # a dtype this stack cannot run: recorded, the notebook goes on
            study.recorder.failed(scenario, exc)
            rows.append({"dtype": dtype, "status": "failed", "note": f"{type(exc).__name__}: {exc}"})
            continue
        runs[dtype] = run
        record_run(study, run, scenario)
        cmp = compare_runs(base, run)
        _record_comparison(study, scenario, dtype, cmp, len(run.timing.times),
                           [("latent_rel_error", ""), ("latent_max_abs_error", ""), ("image_max_abs_error", ""),
                            ("image_psnr_db", "dB")])
        rows.append({"dtype": dtype, "status": "ok", "note": reason, **run.summary(), **cmp})
    _free(pipe32)
    return pd.DataFrame([{"dtype": "float32", "status": "ok", "note": "baseline", **base.summary()}] + rows), runs


def matmul_roofs(study: Study) -> pd.DataFrame:
    """This device's measured matmul FLOP/s per precision: the hardware half of the explanation."""
    size = study.profile.matmul_size
    rows = []
    for name in ("float32",) + VARIANTS:
        peak, t = matmul_peak(study.device, getattr(torch, name), size)
        rows.append({"dtype": name, "matmul_gflops": peak / 1e9, "n_blocks": len(t.times)})
        study.recorder.add(f"matmul {size}x{size} {name}", "peak_gflops", peak / 1e9, "GFLOP/s",
                           n=len(t.times), dtype=name, note="torch.mm, blocked_autorange median")
    df = pd.DataFrame(rows)
    df["vs_float32"] = df["matmul_gflops"] / float(df.loc[df.dtype == "float32", "matmul_gflops"].iloc[0])
    return df


def roofline(study: Study, table: pd.DataFrame, roofs: pd.DataFrame) -> pd.DataFrame:
    """Achieved UNet FLOP/s of each whole-generation run, against its own precision's matmul roof and fp32's."""
    flops = unet_flops(study.pipeline("float32"), study.workload(1))
    roof = roofs.set_index("dtype")["matmul_gflops"]
    rows = []
    for r in table[table.status == "ok"].itertuples():
        a = achieved(flops, r.unet_step_s, roof[r.dtype] * 1e9)
        rows.append({"dtype": r.dtype, "unet_step_s": r.unet_step_s, **a,
                     "percent_of_fp32_roof": 100 * a["achieved_gflops"] / roof["float32"]})
        scenario = FP32_SCENARIO if r.dtype == "float32" else f"{r.dtype} weights+activations, batch 1"
        study.recorder.add_many([
            dict(scenario=scenario, metric="achieved_gflops", value=a["achieved_gflops"], unit="GFLOP/s",
                 dtype=r.dtype, note=f"UNet forward {flops:,} FLOPs / median UNet call"),
            dict(scenario=scenario, metric="percent_of_peak", value=a["percent_of_peak"], unit="%", dtype=r.dtype,
                 note=f"of the measured {r.dtype} matmul roof {roof[r.dtype]:.1f} GFLOP/s")])
    return pd.DataFrame(rows)


def explain(study: Study, roofs: pd.DataFrame) -> str:
    """Why half precision is (or is not) faster here, from the ISA flags and the measured roofs."""
    if study.device == "cuda":
        return ("GPU: half precision uses tensor cores; the measured matmul roofs above give the ratio this GPU "
                "offers over float32.")
    isa = cpu_isa()
    have = [f for f, v in isa.items() if v]
    lines = [f"CPU: {study.env['cpu_model']}; relevant ISA flags present: {', '.join(have) or 'none'}."]
    for dtype in VARIANTS:
        native = [f for f in half_precision.NATIVE_CPU_PATHS[dtype] if isa.get(f)]
        rel = float(roofs.loc[roofs.dtype == dtype, "vs_float32"].iloc[0])
        path = (f"native instructions {', '.join(native)}" if native else
                f"no {' / '.join(half_precision.NATIVE_CPU_PATHS[dtype])}: values are converted to float32 "
                "around each kernel")
        lines.append(f"{dtype}: {path}; its matmul roof measured here is {rel:.2f}x float32's.")
    return "\n".join(lines)


def published_vs_measured(study: Study, table: pd.DataFrame) -> pd.DataFrame:
    fp32 = published.value("Cerebrium SD ladder", config="fp32")
    fp16 = published.value("Cerebrium SD ladder", config="fp16")
    p = study.profile
    row = table[(table.dtype == "float16") & table.status.isin(["ok", "block only"])]
    measured = float(row["speedup"].iloc[0]) if len(row) else None
    scope = "one UNet block" if len(row) and row["status"].iloc[0] == "block only" else "whole generation"
    return pd.DataFrame([{
        "claim": "fp32 -> fp16 speed-up", "source": "Cerebrium", "hardware": "NVIDIA A10G",
        "conditions": "SD v1.x, 512px", "published": fp32 / fp16, "published_detail": f"{fp32} s -> {fp16} s",
        "measured_here": measured,
        "measured_conditions": f"{scope}; {p.arch}, {p.resolution}px, {p.steps} {p.scheduler} steps, batch 1, "
                               f"{study.env['device_name']} ({study.device})",
    }])


def plot(study: Study, table: pd.DataFrame):
    ok = table[table.status.isin(["ok", "block only"])].copy()
    ok["dtype"] = [d if s == "ok" else f"{d}\n(one UNet block)" for d, s in zip(ok["dtype"], ok["status"])]
    ok["speedup"] = ok["speedup"].fillna(1.0)
    ok["speedup_lo"] = ok["speedup_lo"].fillna(1.0)
    ok["speedup_hi"] = ok["speedup_hi"].fillna(1.0)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    err = [ok["speedup"] - ok["speedup_lo"], ok["speedup_hi"] - ok["speedup"]]
    axes[0].bar(ok["dtype"], ok["speedup"], yerr=err, capsize=5, color=plt.cm.tab10.colors[:len(ok)])
    axes[0].axhline(1.0, color="grey", ls=":")
    axes[0].set(ylabel="speed-up vs fp32 (x)", title=f"end to end, batch 1 ({study.device})")
    whole = ok[table.loc[ok.index, "status"] == "ok"]
    axes[1].bar(whole["dtype"], whole["peak_memory_mib"], color=plt.cm.tab10.colors[:len(whole)])
    axes[1].set(ylabel="peak memory (MiB)", title="peak memory, whole generations (timed calls)")
    study.save_figure(fig, "precision_speedup")
    return fig
