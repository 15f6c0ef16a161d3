"""01_half_precision: fp16 and bf16 against fp32, each in processes of its own, in rounds (run_variants).

A half precision this device runs far slower than fp32 could spend the notebook's whole budget in its repeats, so
each is first compared with fp32 on one real UNet block (sdperf.measure.half_budget); when that ratio predicts its
generations would overrun variant_budget_s, it is recorded as skipped with the block-level ratio instead of run.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import torch

from sdperf.config import published
from sdperf.measure import half_budget
from sdperf.store import plots
from sdperf.measure.comparison import TWIN, Comparison, release, run_variants
from sdperf.core.environment import cpu_isa
from sdperf.experiments.common import interpolated, methods_text, rounds_n
from sdperf.measure.measurements import unet_flops
from sdperf.optimizations import catalog, half_precision
from sdperf.optimizations.catalog import Stack
from sdperf.measure.roofline import ACHIEVED_METHOD, ROOF_METHOD, achieved, fit_size, matmul_call, matmul_peak
from sdperf.measure.study import Study

VARIANTS = ("float16", "bfloat16")
BLOCK_ONLY = "skipped (one UNet block measured)"


def name(dtype: str) -> str:
    return f"{dtype} weights+activations"


def _block_only(study: Study, probe: half_budget.Probe, reason: str) -> dict:
    """Record the block-level comparison that stands in for the whole generations, and the skip with its reason."""
    dtype, block = probe.dtype, probe.block
    scenario = f"{dtype}, UNet {block} only (real shapes), batch 1"
    fp32_timing, half_timing = probe.timings()
    note = "one block in this process, in turn; ratio of medians, range from p10/p90 of both"
    study.recorder.timing(f"float32, UNet {block} only (real shapes), batch 1", fp32_timing, dtype="float32",
                          batch_size=1, method=half_budget.BLOCK_TIMING_METHOD)
    study.recorder.timing(scenario, half_timing, dtype=dtype, batch_size=1, method=half_budget.BLOCK_TIMING_METHOD)
    study.recorder.add_many([
        dict(scenario=scenario, metric="speedup_vs_fp32", value=probe.speedup, unit="x", lo=probe.speedup_lo,
             hi=probe.speedup_hi, n=len(probe.block_times), dtype=dtype, method=note, batch_size=1),
        dict(scenario=scenario, metric="block_rel_error", value=probe.block_rel_error, unit="", dtype=dtype,
             batch_size=1, method=half_budget.BLOCK_ERROR_METHOD)])
    reason = f"{reason}; the block-level ratio is recorded under '{scenario}'"
    study.recorder.skipped(f"{name(dtype)}, batch 1", reason, batch_size=1)
    return {"variant": name(dtype), "key": f"precision:{dtype}", "status": BLOCK_ONLY, "note": reason,
            "speedup": probe.speedup, "speedup_lo": probe.speedup_lo, "speedup_hi": probe.speedup_hi,
            "block_rel_error": probe.block_rel_error, "method": note, "block_calls": len(probe.block_times)}


def compare_precisions(study: Study) -> tuple[pd.DataFrame, Comparison]:
    """Each half precision of the profile against fp32, or its block-level stand-in; the table has a `dtype` column."""
    p = study.profile
    generations = p.warmup + p.repeats  # one round's worker process; the budget bounds each process
    items, skipped = [], []
    for key in catalog.among(p.techniques, half_precision.NOTEBOOK):
        dtype = Stack.of(key).dtype
        ok, _ = half_precision.availability(study.device, dtype)
        if ok:  # one that cannot run here is recorded as not applicable by run_variants, with its reason
            probe = half_budget.probe(study, dtype)
            why = probe.skip_reason(generations, p.variant_budget_s,
                                    f"the {generations} whole generations of each round's process")
            if why:
                skipped.append(_block_only(study, probe, why))
                continue
        items.append((name(dtype), key))
    cmp = run_variants(study, items)
    table = pd.concat([cmp.table, pd.DataFrame(skipped)], ignore_index=True)
    table.insert(2, "dtype", [Stack.of(k).dtype for k in table.key])
    return table, cmp


def matmul_roofs(study: Study, call_budget_s: float = 2.0) -> pd.DataFrame:
    """This device's matmul FLOP/s per precision, each at the largest size up to matmul_size whose one call fits
    `call_budget_s` (fp16 without AVX512-FP16/AMX runs a scalar loop, and a blocked timing of it takes minutes)."""
    size = study.profile.matmul_size
    rows = []
    for name in ("float32",) + VARIANTS:
        dtype = getattr(torch, name)
        n = fit_size(lambda k: matmul_call(study.device, dtype, k), size, call_budget_s, study.device)
        peak, t = matmul_peak(study.device, dtype, n)
        rows.append({"dtype": name, "size": n, "matmul_gflops": peak / 1e9, "n_blocks": len(t.times)})
        note = f"measured at {n} (not {size}): a {size} call would exceed {call_budget_s} s" if n != size else ""
        study.recorder.add(f"matmul {n}x{n} {name}", "peak_gflops", peak / 1e9, "GFLOP/s",
                           n=len(t.times), dtype=name, method=ROOF_METHOD, note=note)
    df = pd.DataFrame(rows)
    df["vs_float32"] = df["matmul_gflops"] / float(df.loc[df.dtype == "float32", "matmul_gflops"].iloc[0])
    return df


def roofline(study: Study, table: pd.DataFrame, roofs: pd.DataFrame) -> pd.DataFrame:
    """Achieved UNet FLOP/s of each whole-generation run, against its own precision's matmul roof and fp32's."""
    flops = unet_flops(study.pipeline("float32"), study.workload(1))
    release()
    roof = roofs.set_index("dtype")["matmul_gflops"]
    rows = []
    for r in table[(table.status == "ok") & (table.variant != TWIN)].itertuples():
        a = achieved(flops, r.unet_step_s, roof[r.dtype] * 1e9)
        rows.append({"variant": r.variant, "dtype": r.dtype, "unet_step_s": r.unet_step_s, **a,
                     "percent_of_fp32_roof": 100 * a["achieved_gflops"] / roof["float32"]})
        common = dict(scenario=f"{r.variant}, batch 1", dtype=r.dtype, batch_size=1)
        study.recorder.add_many([
            dict(common, metric="achieved_gflops", value=a["achieved_gflops"], unit="GFLOP/s", method=r.method,
                 note=f"UNet forward {flops:,} FLOPs / median UNet call over rounds"),
            dict(common, metric="percent_of_peak", value=a["percent_of_peak"], unit="%", method=ACHIEVED_METHOD,
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
    fp32 = published.value("Cerebrium SD ladder", what="fp32")
    fp16 = published.value("Cerebrium SD ladder", what="fp16")
    p = study.profile
    row = table[(table.dtype == "float16") & table.status.isin(["ok", BLOCK_ONLY])]
    measured, scope = None, "float16 not measured here"
    if len(row):
        r = row.iloc[0]
        measured = float(r.speedup)
        scope = (f"one UNet block, in one process, p10/p90 range {r.speedup_lo:.3f}-{r.speedup_hi:.3f}x "
                 "(whole generations over budget)" if r.status == BLOCK_ONLY else
                 f"whole generation, median [min-max] {r.speedup_lo:.3f}-{r.speedup_hi:.3f}x, {r.speedup_verdict}; "
                 f"{r.method}")
    return pd.DataFrame([{
        "claim": "fp32 -> fp16 speed-up", "source": published.cite("Cerebrium SD ladder"), "hardware": "NVIDIA A10G",
        "conditions": "SD v1.x, 512px", "published": fp32 / fp16, "published_detail": f"{fp32} s -> {fp16} s",
        "measured_here": measured,
        "measured_conditions": f"{scope}; {p.arch}, {p.resolution}px, {p.steps} {p.scheduler} steps, batch 1, "
                               f"{study.env['device_name']} ({study.device})",
    }])


def plot(study: Study, table: pd.DataFrame):
    """Speed-up over fp32 with its range (p10/p90 for a block-only stand-in), and each configuration's peak memory."""
    shown = table[table.status.isin(["ok", BLOCK_ONLY])].copy()
    shown["label"] = [v if s == "ok" else f"{v}\n(one UNet block)" for v, s in zip(shown.variant, shown.status)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    err = [shown.speedup - shown.speedup_lo, shown.speedup_hi - shown.speedup]
    axes[0].bar(shown.label, shown.speedup, yerr=err, capsize=5, color=plt.cm.tab10.colors[:len(shown)])
    axes[0].axhline(1.0, color="grey", ls=":")
    scale = plots.ratio_scale(axes[0], [1.0, *shown.speedup, *shown.speedup_lo, *shown.speedup_hi])
    axes[0].set(ylabel="speed-up vs fp32 (x" + (", log)" if scale == "log" else ")"),
                title=f"end to end, batch 1 ({study.device})")
    whole = shown[shown.status == "ok"]
    axes[1].bar(whole.label, whole.peak_memory_mib, color=plt.cm.tab10.colors[:len(whole)])
    axes[1].set(ylabel="peak memory (MiB)", title="peak memory, each configuration's own process")
    for ax in axes:
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")
    block = shown[shown.status == BLOCK_ONLY]
    n = rounds_n(study, shown)
    if len(block):
        n += (f"; {', '.join(block.variant)}: one UNet block, {int(block.block_calls.min())} timed calls in one "
              "process (its whole generations would overrun the budget)")
    study.save_figure(fig, "precision_speedup",
                      what="Half precision (weights and activations) against fp32: speed-up per image at the "
                      "profile's steps, median with min-max bars over rounds (p10/p90 for a one-UNet-block "
                      "stand-in), and each configuration's peak RSS in its own process",
                      baseline=interpolated("fp32 eager") + "; a block stand-in divides the same block in fp32, "
                      "timed in turn in its process (memory: absolute MiB)",
                      method=methods_text(shown.get("method", [])) or "not measured", n=n)
    return fig
