"""10_ladder: the optimizations stacked one on another, in the seed's order and in the order that is best here.

Stand-alone speed-ups do not multiply: two techniques that attack the same overhead share one gain, and an
engine that replaces the UNet makes every UNet-level trick before it moot. So every rung is measured as the
whole stack up to it, on a fresh copy of the same network and the same latents, timed in turn with the fp32
eager baseline (comparison.Bench), and against the rung below through the two rungs' speed-ups.

Rules (stated in the notebook too):
- A rung that cannot run here (not applicable), that fails, or whose whole generations would overrun the
  profile's time budget (measured on one UNet block first) is recorded with its reason and left out of the
  stack; the next rung builds on the last configuration that ran.
- The best order is chosen from the stand-alone measurements of notebooks 02-09 in this profile's results: the
  candidates are the techniques that were faster than fp32 there without changing the picture (PSNR >= the
  threshold, unless lossy rungs are allowed); at most one UNet executor (compiled, exported or quantized UNet),
  stacked last because it compiles or exports what the rungs below set up; the others fastest first; a rung is
  kept only when the stack with it is faster than the stack without it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import matplotlib.pyplot as plt
import pandas as pd

from sdperf import published
from sdperf.comparison import BASELINE, Bench, Variant, published_row
from sdperf.measurements import block_comparison
from sdperf.results import read_results
from sdperf.study import Study

PSNR_THRESHOLD_DB = 40.0
EXECUTOR = "executor"  # the family of techniques that replace how the UNet runs; only one can be stacked


@dataclass(frozen=True)
class Technique:
    """One optimization as the ladder stacks it, and where its stand-alone measurement lives."""

    key: str
    label: str
    family: str
    notebook: str  # the notebook that measures it alone
    scenario: str  # its scenario there (without the ", batch N" suffix)
    availability: tuple[bool, str]
    apply: Callable[[Any], Any] = lambda pipe: pipe
    dtype: str = "float32"
    grad_mode: str | None = None  # None: keep the stack's
    half: str | None = None  # a half precision whose whole-generation cost is checked on one block first


def techniques(study: Study) -> dict[str, Technique]:
    """Every technique the ladder knows, by key, with its availability on this study's device."""
    from sdperf.optimizations import cuda_graphs, deepspeed_inference, half_precision

    device, arch = study.device, study.profile.arch
    runs = (True, "runs everywhere")
    items = [
        Technique("no_grad", "fp32, no_grad (diffusers' pipeline call)", "autograd", "02_inference_mode",
                  "no_grad", runs, grad_mode="no_grad"),
        Technique("inference_mode", "+ inference_mode", "autograd", "02_inference_mode", "inference_mode", runs,
                  grad_mode="inference_mode"),
        Technique("deepspeed", "+ DeepSpeed kernel injection", "injection", "06_deepspeed",
                  "DeepSpeed kernel injection", deepspeed_inference.availability(device, arch),
                  lambda pipe: deepspeed_inference.apply(pipe, "float16"), dtype="float16"),
        Technique("cuda_graphs", "+ CUDA graphs", "graphs", "05_cuda_graphs", "CUDA graphs",
                  cuda_graphs.availability(device), cuda_graphs.apply),
    ]
    for dtype, short in (("float16", "fp16"), ("bfloat16", "bf16")):
        items.append(Technique(short, f"+ {short}", "precision", "01_half_precision", f"{dtype} weights+activations",
                               half_precision.availability(device, dtype),
                               lambda pipe, d=dtype: half_precision.apply(pipe, d), dtype=dtype, half=dtype))
    items += _registered(study)
    return {t.key: t for t in items}


def from_variant(key: str, family: str, notebook: str, v: Variant) -> Technique:
    """A technique built from the very Variant its own notebook measures, so labels and scenarios match."""
    return Technique(key, f"+ {v.label}", family, notebook, v.label, v.availability, v.apply, dtype=v.dtype)


# What notebooks 03-09 measure that the best-order ladder may stack (their spec strings).
ATTENTION_SPECS = ("sdpa:flash", "sdpa:math")
COMPILE_SPECS = ("default", "freezing", "max-autotune-no-cudagraphs", "channels_last+freezing", "regional")
ENGINE_NAMES = ("onnxruntime-fp32", "openvino-f32", "openvino-f32-static", "openvino-bf16", "tensorrt-fp16")
INT8_SCHEMES = ("torch-ao-dynamic", "torchao-int8-dynamic", "openvino-nncf-weights", "openvino-nncf-ptq")


def _registered(study: Study) -> list[Technique]:
    """The techniques of notebooks 03-09, built by those notebooks' own variant builders."""
    from sdperf.experiments import attention, engine_export, quantization, torch_compile
    from sdperf.optimizations import engine_export as engines

    skeleton = attention.skeleton(study)
    out = [from_variant(f"attention {spec}", "attention", "03_attention", attention.variant(study, spec, skeleton))
           for spec in ATTENTION_SPECS]
    # each compiled rung starts from an empty inductor cache, so its first call is a cold compile
    compiled = torch_compile.make_variants(study, list(COMPILE_SPECS), cold_compile_each=True, records={})
    out += [from_variant(f"compile {v.label}", EXECUTOR, "04_torch_compile", v) for v in compiled]
    out += [from_variant(name, EXECUTOR, "07_engine_export",
                         engine_export._variant(study, engines.parse(name), "dynamo"))
            for name in ENGINE_NAMES]
    out += [from_variant(f"int8 {scheme}", EXECUTOR, "08_quantization", quantization.variant(study, scheme))
            for scheme in INT8_SCHEMES]
    return out


CEREBRIUM_ORDER = ("no_grad", "fp16", "inference_mode", "deepspeed", "cuda_graphs")


def stack_variant(stack: list[Technique], label: str) -> Variant:
    """The whole stack as one variant: applies in order, the last precision and grad mode set win."""
    applies = [t.apply for t in stack]

    def apply(pipe):
        for f in applies:
            pipe = f(pipe)
        return pipe

    grad = next((t.grad_mode for t in reversed(stack) if t.grad_mode), "inference_mode")
    dtype = next((t.dtype for t in reversed(stack) if t.dtype != "float32"), "float32")
    return Variant(label=label, apply=apply, dtype=dtype, grad_mode=grad)


def _over_budget(study: Study, bench: Bench, tech: Technique) -> str | None:
    """For a half precision: time one real UNet block in it; if whole generations would overrun the profile's
    budget, say why (with the measured block ratio) instead of running them."""
    if tech.half is None:
        return None
    p = study.profile
    import torch

    block = block_comparison(bench._base_pipe, bench.workload, getattr(torch, tech.half), device=study.device,
                             warmup=p.warmup, repeats=p.repeats)
    predicted = bench.baseline.timing.median / block["speedup"] * (p.warmup + p.repeats)
    if predicted <= p.variant_budget_s:
        return None
    return (f"one UNet block in {tech.half} takes {1 / block['speedup']:.2f}x the float32 time here (measured now), "
            f"so {p.warmup + p.repeats} whole generations (predicted {predicted:.0f} s) would exceed "
            f"variant_budget_s={p.variant_budget_s} s")


@dataclass
class Ladder:
    name: str
    table: pd.DataFrame


def climb(study: Study, bench: Bench, name: str, keys: list[str], *, keep_only_faster: bool,
          say: Callable[[str], None] = print) -> Ladder:
    """Measure the stack rung by rung. Each row: the rung, whether it is in the stack, its speed-up over fp32
    eager and over the rung below (both measured in this run), drift, and why a rung was left out."""
    known = techniques(study)
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"unknown ladder rung(s) {', '.join(unknown)}; valid: {', '.join(known)}")
    rec = study.recorder
    stack: list[Technique] = []
    below = {"label": BASELINE, "speedup": 1.0, "speedup_lo": 1.0, "speedup_hi": 1.0}
    rows = [{"ladder": name, "rung": 0, "technique": BASELINE, "in_stack": True, "status": "ok",
             **_numbers(bench.baseline_row()), "vs_rung_below": 1.0, "vs_lo": None, "vs_hi": None, "note": ""}]
    for i, key in enumerate(keys, start=1):
        tech = known[key]
        ok, reason = tech.availability
        variant = stack_variant(stack + [tech], f"{name} {i}: {tech.label}")
        scenario = variant.label + bench.suffix
        base = {"ladder": name, "rung": i, "technique": tech.label, "in_stack": False}
        if not ok:
            rec.not_applicable(scenario, reason)
            rows.append({**base, "status": "not_applicable", "note": f"not applicable: {reason}"})
            say(f"{variant.label}: not applicable: {reason}")
            continue
        why = _over_budget(study, bench, tech)
        if why:
            rec.skipped(scenario, why)
            rows.append({**base, "status": "skipped", "note": f"skipped: {why}"})
            say(f"{variant.label}: skipped: {why}")
            continue
        row, run, _ = bench.measure(variant)
        if run is None:
            rows.append({**base, "status": row["status"], "note": row["note"]})
            continue
        step = over_rung_below(row, below)
        rec.add(scenario, "speedup_vs_rung_below", step["speedup"], "x", p10=step["speedup_lo"],
                p90=step["speedup_hi"], n=len(run.timing.times), dtype=variant.dtype,
                note=f"vs {below['label']}: ratio of the two rungs' speed-ups over {BASELINE}, each timed in turn "
                     "with it; range from both ranges")
        lossy = not (row["image_psnr_db"] >= PSNR_THRESHOLD_DB)
        keep = True
        note = ""
        if keep_only_faster and step["speedup"] <= 1.0:
            keep, note = False, "not kept: the stack with it was not faster than without it"
        elif keep_only_faster and lossy:
            keep, note = False, f"not kept: changes the picture ({row['verdict']})"
        rows.append({**base, "in_stack": keep, "status": "ok", **_numbers(row), "vs_rung_below": step["speedup"],
                     "vs_lo": step["speedup_lo"], "vs_hi": step["speedup_hi"], "note": note or row.get("verdict", "")})
        if keep:
            stack.append(tech)
            below = {"label": variant.label, **{k: row[k] for k in ("speedup", "speedup_lo", "speedup_hi")}}
    return Ladder(name, pd.DataFrame(rows))


def over_rung_below(row: dict, below: dict) -> dict:
    """A rung's speed-up over the rung below, from both rungs' speed-ups over fp32 eager: each of those was timed
    in turn with the baseline, so the machine's drift between the two rungs cancels (their latencies would not)."""
    return {"speedup": row["speedup"] / below["speedup"], "speedup_lo": row["speedup_lo"] / below["speedup_hi"],
            "speedup_hi": row["speedup_hi"] / below["speedup_lo"]}


def _numbers(row: dict) -> dict:
    keys = ("latency_s", "p10_s", "p90_s", "s_per_image", "it_per_s", "unet_step_s", "first_call_s", "setup_s",
            "speedup", "speedup_lo", "speedup_hi", "unet_step_speedup", "peak_memory_mib", "latent_rel_error",
            "image_psnr_db")
    return {k: row.get(k) for k in keys}


# ---------------------------------------------------------------- choosing the best order from 02-09

def standalone(study: Study) -> pd.DataFrame:
    """Each known technique's stand-alone speed-up and PSNR, as notebooks 02-09 stored them for this profile."""
    df = read_results(study.profile.name)
    rows = []
    for tech in techniques(study).values():
        mine = df[(df.notebook == tech.notebook) & df.scenario.astype(str).str.startswith(tech.scenario + ", batch 1")]
        if mine.empty:
            rows.append({"key": tech.key, "technique": tech.label, "family": tech.family, "notebook": tech.notebook,
                         "status": "not measured", "speedup": None, "image_psnr_db": None})
            continue
        status = mine["status"].iloc[0] if (mine.status != "ok").all() else "ok"
        val = dict(zip(mine.metric, mine.value))
        rows.append({"key": tech.key, "technique": tech.label, "family": tech.family, "notebook": tech.notebook,
                     "status": status, "speedup": val.get("speedup_vs_fp32"),
                     "image_psnr_db": val.get("image_psnr_db")})
    return pd.DataFrame(rows)


def best_order(table: pd.DataFrame, allow_lossy: bool = False) -> tuple[list[str], pd.DataFrame]:
    """Candidates faster than fp32 alone (and picture-preserving unless allowed), one executor, fastest first."""
    t = table.copy()
    t["speedup"] = pd.to_numeric(t["speedup"], errors="coerce")
    t["image_psnr_db"] = pd.to_numeric(t["image_psnr_db"], errors="coerce")
    faster = (t.status == "ok") & (t.speedup > 1.0)
    keeps = t.image_psnr_db.isna() | (t.image_psnr_db >= PSNR_THRESHOLD_DB) | allow_lossy
    cand = t[faster & keeps].sort_values("speedup", ascending=False)
    executor = cand[cand.family == EXECUTOR].head(1)
    # the executor compiles or exports whatever the rungs below it set up, so it goes last
    chosen = pd.concat([cand[cand.family != EXECUTOR], executor])
    t["candidate"] = t.key.isin(chosen.key)
    t["why"] = [_why(r, allow_lossy, chosen) for r in t.itertuples()]
    return chosen.key.tolist(), t


def _why(r, allow_lossy: bool, chosen: pd.DataFrame) -> str:
    if r.status != "ok":
        return f"{r.status} in {r.notebook}"
    if not (r.speedup > 1.0):
        return f"not faster than fp32 alone ({r.speedup:.3f}x)"
    if not allow_lossy and r.image_psnr_db == r.image_psnr_db and r.image_psnr_db < PSNR_THRESHOLD_DB:
        return f"changes the picture (PSNR {r.image_psnr_db:.1f} dB)"
    if r.key not in set(chosen.key):
        return "another executor was faster (only one UNet executor can be stacked)"
    return "candidate"


def run(study: Study, *, allow_lossy: bool = False, say: Callable[[str], None] = print) -> dict:
    """Both ladders against one fp32 baseline (batch 1), then the baseline again."""
    bench = Bench(study, batch_size=1, say=say)
    try:
        cerebrium = climb(study, bench, "Cerebrium order", list(CEREBRIUM_ORDER), keep_only_faster=False, say=say)
        alone = standalone(study)
        order, choice = best_order(alone, allow_lossy=allow_lossy)
        best = climb(study, bench, "best order here", order, keep_only_faster=True, say=say)
        retimed = bench.retime()
    finally:
        bench.close()
    return {"cerebrium": cerebrium, "best": best, "choice": choice, "order": order, "retimed": retimed}


# ---------------------------------------------------------------- presenting

def plot(study: Study, ladders: list[Ladder]):
    fig, axes = plt.subplots(len(ladders), 2, figsize=(12, 3.3 * len(ladders)), squeeze=False)
    for (ax_s, ax_i), lad in zip(axes, ladders):
        t = lad.table[lad.table.status == "ok"]
        labels = [f"{r.rung}: {r.technique}" + ("" if r.in_stack else "\n(not kept)") for r in t.itertuples()]
        err = [t.latency_s - t.p10_s, t.p90_s - t.latency_s]
        colors = ["tab:blue" if k else "tab:gray" for k in t.in_stack]
        ax_s.bar(labels, t.latency_s, yerr=err, capsize=4, color=colors)
        ax_s.set(ylabel="s / image, batch 1 (median, p10-p90)", title=f"{lad.name}: seconds per image")
        ax_i.bar(labels, t.it_per_s, color=colors)
        ax_i.set(ylabel="it/s", title=f"{lad.name}: denoising iterations per second")
        for ax in (ax_s, ax_i):
            ax.tick_params(axis="x", labelrotation=25, labelsize=8)
    study.save_figure(fig, "ladder")
    return fig


def drift_table(ladders: list[Ladder]) -> pd.DataFrame:
    cols = ["ladder", "rung", "technique", "in_stack", "status", "speedup", "vs_rung_below", "unet_step_speedup",
            "latent_rel_error", "image_psnr_db", "note"]
    return pd.concat([lad.table for lad in ladders], ignore_index=True).reindex(columns=cols)


def best_recipe(ladder: Ladder) -> dict:
    """The top of the kept stack: its speed-ups over fp32 eager per UNet step and per image."""
    t = ladder.table[(ladder.table.status == "ok") & ladder.table.in_stack]
    top = t.iloc[-1]
    return {"recipe": " ".join(t.technique.iloc[1:]) or "fp32 eager (nothing beat it)",
            "per_image_speedup": top.speedup, "per_image_lo": top.speedup_lo, "per_image_hi": top.speedup_hi,
            "per_unet_step_speedup": top.unet_step_speedup, "s_per_image": top.s_per_image,
            "image_psnr_db": top.image_psnr_db}


def _measured(ladder: Ladder, key_label: str) -> float | None:
    t = ladder.table
    row = t[(t.technique == key_label) & (t.status == "ok")]
    return float(row.vs_rung_below.iloc[0]) if len(row) else None


def published_vs_measured(study: Study, cerebrium: Ladder, best: Ladder) -> pd.DataFrame:
    """Every speed claim of the seeds beside the ratio measured here, with the hardware and conditions of each."""
    here = study.conditions()
    lad = published.select("Cerebrium SD ladder").set_index("config")["value"]
    nemo = published.select("NeMo SD inference", model="SD 1.x", batch_size=1).set_index("config")["value"]
    paiton = published.select("Paiton SDXL").set_index("config")["value"]
    known = techniques(study)
    recipe = best_recipe(best)
    rows = [
        published_row("fp32 -> fp16", "Cerebrium", "NVIDIA A10G", "SD v1.x 512px", lad["fp32"] / lad["fp16"],
                      _measured(cerebrium, known["fp16"].label), here, detail=f"{lad['fp32']} -> {lad['fp16']} s"),
        published_row("+ inference_mode", "Cerebrium", "NVIDIA A10G", "SD v1.x 512px, on fp16",
                      lad["fp16"] / lad["inference_mode"], _measured(cerebrium, known["inference_mode"].label), here,
                      detail=f"{lad['fp16']} -> {lad['inference_mode']} s"),
        published_row("+ DeepSpeed inference", "Cerebrium", "NVIDIA A10G", "SD v1.x 512px, on fp16",
                      lad["inference_mode"] / lad["deepspeed"], _measured(cerebrium, _label(known, "deepspeed")),
                      here, detail=f"{lad['inference_mode']} -> {lad['deepspeed']} s"),
        published_row("whole ladder (fp32 -> DeepSpeed)", "Cerebrium", "NVIDIA A10G", "SD v1.x 512px",
                      lad["fp32"] / lad["deepspeed"], _top(cerebrium), here + " (Cerebrium order, rungs that ran)",
                      detail=f"{lad['fp32']} -> {lad['deepspeed']} s"),
        published_row("framework -> TensorRT, batch 1", "NeMo", "NVIDIA A100 80GB", "SD 1.x 512px, 50 PLMS",
                      nemo["framework fp16 AMP"] / nemo["TensorRT fp16"], recipe["per_image_speedup"],
                      here + f" (best recipe here: {recipe['recipe']})",
                      detail=f"{nemo['framework fp16 AMP']} -> {nemo['TensorRT fp16']} s"),
        published_row("PyTorch + diffusers -> custom kernels (it/s)", "Paiton", "AMD MI300X", "SDXL 1024px, 20 steps",
                      paiton["Paiton custom kernels fp16"] / paiton["PyTorch + diffusers fp16"],
                      recipe["per_unet_step_speedup"], here + " (best recipe here, per UNet step)",
                      detail=f"~{paiton['PyTorch + diffusers fp16']:g} -> ~{paiton['Paiton custom kernels fp16']:g} it/s"),
    ]
    return pd.DataFrame(rows)


def _label(known: dict, key: str) -> str:
    return known[key].label if key in known else key


def _top(ladder: Ladder) -> float | None:
    t = ladder.table[(ladder.table.status == "ok") & ladder.table.in_stack]
    val = t.speedup.iloc[-1] if len(t) else None
    return None if val is None or (isinstance(val, float) and math.isnan(val)) else float(val)


def record_best(study: Study, best: dict) -> None:
    """The headline: the best recipe's speed-ups over fp32 eager, per image and per UNet step."""
    scenario = f"best recipe: {best['recipe']}"
    study.recorder.add_many([
        dict(scenario=scenario, metric="speedup_vs_fp32", value=best["per_image_speedup"], unit="x",
             p10=best["per_image_lo"], p90=best["per_image_hi"], note="per image (whole generation, batch 1)"),
        dict(scenario=scenario, metric="unet_step_speedup_vs_fp32", value=best["per_unet_step_speedup"], unit="x",
             note="per UNet step (median UNet call)"),
    ])


# ---------------------------------------------------------------- the allocator, in fresh processes

def allocator_rung(study: Study, settings: list[str], say: Callable[[str], None] = print) -> pd.DataFrame:
    """fp32 eager in a fresh process per allocator setting: the baseline every in-process rung above stands on,
    and the same headline repeated outside this notebook's process. Ratios and drift are against the fresh
    process with the default allocator."""
    from sdperf import drift, fresh_process
    from sdperf.optimizations import allocator

    for s in settings:
        allocator.availability(s)  # a bad name fails before anything runs
    rec, rows, ref = study.recorder, [], None
    order = ["default"] + [s for s in settings if s != "default"]
    for setting in order:
        scenario = f"fresh process, allocator {setting}, batch 1"
        ok, reason = allocator.availability(setting)
        if not ok:
            rec.not_applicable(scenario, reason)
            rows.append({"allocator": setting, "status": "not_applicable", "note": f"not applicable: {reason}"})
            continue
        try:
            run = fresh_process.measure(study.profile.name, setting, timeout_s=study.profile.cell_timeout_s)
        except Exception as exc:  # recorded with its error; the other settings still run
            msg = f"{type(exc).__name__}: {exc}"
            say(f"{scenario}: failed: {msg}")
            rec.failed(scenario, msg)
            rows.append({"allocator": setting, "status": "failed", "note": msg[:300]})
            continue
        s = run.summary
        ref = ref or run
        row = {"allocator": setting, "status": "ok", "latency_s": s["latency_s"], "p10_s": s["p10_s"],
               "p90_s": s["p90_s"], "unet_step_s": s["unet_step_s"], "peak_memory_mib": s["peak_memory_mib"],
               "minor_faults_per_generation": run.faults_per_generation,
               "speedup_vs_default": ref.summary["latency_s"] / s["latency_s"],
               "unet_step_speedup_vs_default": ref.summary["unet_step_s"] / s["unet_step_s"],
               "latent_rel_error": drift.relative_error(run.latents, ref.latents), "note": reason}
        rows.append(row)
        rec.add_many([
            dict(scenario=scenario, metric="latency", value=s["latency_s"], unit="s", p10=s["p10_s"], p90=s["p90_s"],
                 n=s.get("n") or study.profile.repeats, note=f"fresh process; {reason}"),
            dict(scenario=scenario, metric="latency_first_call", value=s["first_call_s"], unit="s", n=1,
                 note="first call, includes warm-up"),
            dict(scenario=scenario, metric="unet_step", value=s["unet_step_s"], unit="s",
                 note="median of one UNet call on the guidance batch"),
            dict(scenario=scenario, metric="peak_memory", value=s["peak_memory_mib"], unit="MiB", n=1,
                 note="process peak RSS of the fresh process (VmHWM, reset before the timed calls)"),
            dict(scenario=scenario, metric="minor_faults_per_generation", value=run.faults_per_generation,
                 unit="faults", note="/proc/self/stat minflt over the timed and warm-up calls, per call"),
            dict(scenario=scenario, metric="speedup_vs_fp32", value=row["speedup_vs_default"], unit="x",
                 note="vs fp32 eager in a fresh process with the default allocator"),
            dict(scenario=scenario, metric="latent_rel_error", value=row["latent_rel_error"], unit="",
                 note="vs the fresh default-allocator process (same seed, same latents)"),
        ])
    return pd.DataFrame(rows)
