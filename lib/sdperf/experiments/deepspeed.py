"""06_deepspeed: DeepSpeed-Inference kernel injection, with the modules it actually replaced counted.

A call that replaces nothing still "runs", and its ratio is then noise around 1.0; so every attempt records how many
modules DeepSpeed put in (a census of module classes before and after), and a ratio is only shown beside that count.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import deepspeed  # noqa: F401  imported first so its accelerator log line prints at import, not mid-notebook
import pandas as pd

from sdperf.config import published
from sdperf.measure.comparison import Comparison, published_row, release, run_variants
from sdperf.experiments.common import interpolated, rounds_method, rounds_n
from sdperf.optimizations import deepspeed_inference as ds, deepspeed_policies
from sdperf.store.plots import speedup_bars
from sdperf.measure.study import Study
from sdperf.core import tables

KERNELS = "DeepSpeed kernel injection, fp16 pipeline"
KERNELS_ADAPTED = "DeepSpeed kernel injection + CLIP layout adapter"
FP16 = "fp16 (the rung DeepSpeed is added to)"
PASS_THROUGH = "init_inference(pipe.unet, fp32): pass-through"
PASS_THROUGH_NOTE = "pass-through: 0 modules replaced, so any ratio is run-to-run noise, not a DeepSpeed speed-up"


def compat_table() -> pd.DataFrame:
    """The version findings of DeepSpeed with SD's libraries, with their issue / PR references."""
    return tables.table("deepspeed_sd_compat.csv")


def targets(study: Study) -> pd.DataFrame:
    """The modules DeepSpeed's diffusers policies name in this profile's pipeline (counted, not replaced)."""
    counts = ds.injection_targets(study.pipeline("float32"))
    release()
    return pd.DataFrame({"module": list(counts), "count": list(counts.values())})


def policy_check() -> pd.DataFrame:
    """DeepSpeed's own policies against the tiny SD twin's modules (SD 1.5's classes), without and with sdperf's CLIP
    layout adapter: per policy the class it expects, what it matches, what generic_injection would replace (counted
    by DeepSpeed class) and the attributes it did not find; CI runs the same check."""
    twin = deepspeed_policies.tiny_twin()
    frames = []
    for adapter in (False, True):
        table = deepspeed_policies.policy_table(twin, clip_adapter=adapter)
        table.insert(0, "clip_adapter", adapter)
        frames.append(table)
    out = pd.concat(frames, ignore_index=True)
    out["matched"] = out.matched.map(", ".join)
    out["replaced"] = out.replaced.map(lambda r: ", ".join(f"{n} {c}" for c, n in Counter(r.values()).items()))
    out["missing"] = out.missing.map(", ".join)
    return out.drop(columns=["note"])


def _error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


PROBES = {
    "init_inference(pipeline, float16, kernel inject)": lambda p: ds.apply(p, "float16"),
    "init_inference(pipeline, float32, kernel inject)": lambda p: ds.apply(p, "float32"),
    "generic_injection(pipeline, float16)": lambda p: ds.inject_only(p, "float16"),
    "generic_injection(pipeline, float16) + CLIP layout adapter": lambda p: ds.inject_only(p, "float16",
                                                                                            clip_adapter=True),
}
PROBE_METHOD = ("module census of a fresh fp32 pipeline before and after the call, in this kernel "
                "(deepspeed_inference.count_replaced): modules whose class changed, also when the call raised")


def probe(study: Study, say: Callable[[str], None] = print) -> pd.DataFrame:
    """Where the seed's call stops on this device: each step of init_inference on a fresh pipeline, its exact error
    and the modules it had replaced by then (run where the kernels are missing; on a GPU the variants measure)."""
    rows = []
    for call, fn in PROBES.items():
        pipe = study.pipeline("float32")
        before = ds.census(pipe)
        scenario = f"probe: {call}"
        try:
            fn(pipe)
            outcome, error = "ok", ""
        except Exception as exc:  # the point of the probe: record exactly how it fails here
            outcome, error = "failed", _error(exc)
        finally:  # also when it raised: what had been replaced before the error
            r = ds.count_replaced(before, ds.census(pipe))
            pipe = None
            release()
        rows.append({"call": call, "outcome": outcome, "error": error, "replaced_modules": r["replaced_modules"],
                     "kernel_modules": r["kernel_modules"], "new_classes": r["new_classes"]})
        if outcome == "failed":
            say(f"{call}: failed: {error}")
            study.recorder.failed(scenario, error, metric="init")
        study.recorder.add(scenario, "replaced_modules", r["replaced_modules"], "modules", n=1, method=PROBE_METHOD,
                           note=f"{r['kernel_modules']} fused-kernel modules; "
                                f"{'before the error' if outcome == 'failed' else 'after the call'}: "
                                f"{r['new_classes'] or 'no DeepSpeed class'}")
    return pd.DataFrame(rows)


def configs(study: Study) -> list[tuple[str, str]]:
    """The seed's call (also with sdperf's CLIP adapter: it runs where only the lock's transformers stops the seed's),
    with the fp16 rung it is added to where the kernels exist; everywhere, the UNet-only pass-through, labelled so."""
    ok, _ = ds.availability(study.device, study.profile.arch, clip_adapter=True)
    fp16 = [(FP16, "precision:float16")] if ok else []  # the seed's ratio is against fp16 + inference_mode
    return fp16 + [(KERNELS, "deepspeed:inject"), (KERNELS_ADAPTED, "deepspeed:inject-clip-adapter"),
                   (PASS_THROUGH, "deepspeed:unet-fp32")]


def compare(study: Study, say: Callable[[str], None] = print, **run_kw) -> Comparison:
    """run_variants, then the replaced-module count each worker's apply() reported beside every configuration."""
    cmp = run_variants(study, configs(study), say=say, **run_kw)
    counts = {}
    for name, facts in cmp.facts.items():
        if "replaced_modules" not in facts:
            continue
        n = counts[name] = facts["replaced_modules"]
        note = PASS_THROUGH_NOTE if n == 0 else f"{facts['kernel_modules']} fused-kernel modules"
        study.recorder.add(f"{name}, batch 1", "replaced_modules", n, "modules", n=1, method=cmp.method,
                           batch_size=1, note=f"{note}; new classes: {facts['new_classes'] or 'none'}")
        row = cmp.table.variant == name
        cmp.table.loc[row, "note"] = (PASS_THROUGH_NOTE if n == 0 else
                                      f"{n} modules replaced; {cmp.table.loc[row, 'note'].iloc[0]}")
    cmp.table.insert(2, "replaced_modules", cmp.table.variant.map(counts))
    return cmp


def published_vs_measured(study: Study, cmp: Comparison) -> pd.DataFrame:
    """Cerebrium's DeepSpeed rung beside the ratio measured here, only where kernels were actually injected."""
    before = published.value("Cerebrium SD ladder", what="inference_mode")
    after = published.value("Cerebrium SD ladder", what="deepspeed")
    t = cmp.ok().set_index("variant")
    measured, cond = None, "no DeepSpeed kernel was injected on this stack, so there is no DeepSpeed ratio to show"
    injected = [v for v in (KERNELS, KERNELS_ADAPTED) if v in t.index and (t.loc[v, "replaced_modules"] or 0) > 0]
    if injected and FP16 in t.index:  # ratio of medians over rounds of two configurations' own processes
        measured = float(t.loc[FP16, "latency_s"] / t.loc[injected[0], "latency_s"])
        cond = (study.conditions(scope=f"whole generation, '{injected[0]}' vs fp16 eager") +
                f"; median latencies, {cmp.method}")
    return pd.DataFrame([published_row(
        "fp16 + inference_mode -> + DeepSpeed kernel injection", published.cite("Cerebrium SD ladder"), "NVIDIA A10G",
        "SD v1.x, 512px, fp16", before / after, measured, cond, detail=f"{before} s -> {after} s")])


def plot(study: Study, cmp: Comparison):
    """Speed-up bars (min-max over rounds), each labelled with the modules DeepSpeed replaced."""
    table = cmp.table.copy()
    table["variant"] = [f"{v}\n({int(n)} replaced)" if n == n else v
                        for v, n in zip(table.variant, table.replaced_modules)]
    title = f"DeepSpeed-Inference vs fp32 eager ({study.device})"
    if (cmp.ok().replaced_modules == 0).any():
        title += "\na bar with 0 replaced is run-to-run noise, not a speed-up"
    fig = speedup_bars(table, title)
    study.save_figure(fig, "speedup",
                      what="DeepSpeed-Inference (init_inference, kernel injection) configurations: speed-up per image "
                      "at the profile's steps, median with min-max bars over rounds, each bar labelled with the "
                      "modules DeepSpeed replaced",
                      baseline=interpolated("fp32 eager"), method=rounds_method(cmp), n=rounds_n(study, cmp.table))
    return fig
