"""02_inference_mode: grad mode on (frozen and trainable parameters), no_grad and inference_mode, in one run.

The baseline of run_variants is fp32 eager under inference_mode (sdperf's default). inference_mode is measured
again as a variant, on a fresh pipeline in the profile's precision, built and timed exactly like no_grad: the
Cerebrium step (no_grad -> inference_mode, "<1%") is the ratio of those two, and on float32 profiles the gap
between the baseline and that repeat is the run's noise floor, which a sub-percent claim has to clear.
"""
from __future__ import annotations

import pandas as pd
import torch

from sdperf import published
from sdperf.comparison import BASELINE, Comparison, Variant, published_row, release, run_variants
from sdperf.experiments.common import at_dtype, speedup_and_memory
from sdperf.generation import Workload, generate
from sdperf.optimizations import inference_mode as opt
from sdperf.study import Study
from sdperf.timing import ratio

# key -> (label, grad mode, parameters): what a notebook's `variants` parameter may name
VARIANTS = {
    "inference_mode": ("inference_mode (fresh pipeline)", "inference_mode", "frozen"),
    "no_grad": ("no_grad", "no_grad", "frozen"),
    "grad_frozen": ("grad on, parameters frozen", "grad", "frozen"),
    "grad_trainable": ("grad on, parameters trainable", "grad", "trainable"),
}
CLAIM = "no_grad -> inference_mode"


def variant(study: Study, key: str) -> Variant:
    if key not in VARIANTS:
        raise ValueError(f"variant {key!r} is not valid; choose one of: {', '.join(VARIANTS)}")
    label, mode, parameters = VARIANTS[key]
    dtype = study.profile.dtype
    return Variant(label=_label(key, dtype), apply=lambda pipe: opt.apply(at_dtype(pipe, dtype), parameters),
                   availability=opt.availability(study.device, mode), dtype=dtype, grad_mode=mode,
                   facts=opt.trainable_parameters, note=f"{mode}, parameters {parameters}, {dtype}")


def variants(study: Study, keys: list[str]) -> list[Variant]:
    """All named variants, validated before anything is timed."""
    return [variant(study, k) for k in keys]


def compare_modes(study: Study, keys: list[str]) -> Comparison:
    """The baseline (inference_mode, frozen, fp32) first, then each named variant on a fresh pipeline."""
    return run_variants(study, variants(study, keys))


def facts_table(cmp: Comparison) -> pd.DataFrame:
    """How many parameters require grad in each prepared pipeline: what decides whether grad mode records."""
    return pd.DataFrame([{"variant": k, **v} for k, v in cmp.facts.items()])


def _label(key: str, dtype: str = "float32") -> str:
    return VARIANTS[key][0] + ("" if dtype == "float32" else f", {dtype}")


def _pair(study: Study, name: str, before, after, note: str) -> dict:
    """Speed-up of `after` over `before` with the conservative p10/p90 range, and whether it clears the noise."""
    r = ratio(before.timing, after.timing)
    within = r["speedup_lo"] <= 1.0 <= r["speedup_hi"]
    verdict = ("within noise: the range straddles 1.0" if within else
               f"measurable: the whole range is {'above' if r['speedup_lo'] > 1 else 'below'} 1.0")
    study.recorder.add(f"{name}, batch {before.workload.batch_size}", "speedup", r["speedup"], "x",
                       p10=r["speedup_lo"], p90=r["speedup_hi"], n=len(after.timing.times),
                       note=f"{note}; {verdict}")
    return {"comparison": name, "before_s": before.timing.median, "after_s": after.timing.median, **r,
            "verdict": verdict, "note": note}


def cerebrium_ratio(study: Study, cmp: Comparison) -> pd.DataFrame:
    """The Cerebrium step (no_grad -> inference_mode, both fresh pipelines) and, when the variants run in
    float32 like the baseline, the same configuration measured twice (the noise floor)."""
    dtype = study.profile.dtype
    no_grad, again = cmp.runs.get(_label("no_grad", dtype)), cmp.runs.get(_label("inference_mode", dtype))
    rows = []
    if no_grad is not None and again is not None:
        rows.append(_pair(study, CLAIM, no_grad, again, f"the Cerebrium step, {dtype}, two fresh pipelines"))
    if dtype == "float32" and no_grad is not None:
        rows.append(_pair(study, f"{CLAIM} (against the baseline run)", no_grad, cmp.baseline,
                          "the same step against the baseline pipeline"))
    if dtype == "float32" and again is not None:
        rows.append(_pair(study, "noise floor: inference_mode twice", again, cmp.baseline,
                          "one configuration on two pipelines in one run: any gap is noise"))
    return pd.DataFrame(rows)


def saved_for_backward(pipe, workload: Workload, grad_mode: str) -> dict:
    """Bytes autograd keeps for a backward pass during one generation, parameters excluded (they are resident
    anyway). Nothing is freed before the generation returns (each step's latents feed the next), so the sum
    is what the graph holds at its end."""
    params = {p.untyped_storage().data_ptr() for m in opt.networks(pipe) for p in m.parameters()}
    saved: dict = {}

    def pack(t: torch.Tensor):
        try:
            key, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # opaque tensors (e.g. mkldnn) have no storage
            key, size = id(t), t.numel() * t.element_size()
        if key not in params:
            saved[key] = size
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        generate(pipe, workload, grad_mode=grad_mode)
    return {"saved_for_backward_mib": sum(saved.values()) / 2**20, "saved_storages": len(saved)}


def saved_activations(study: Study, cases: list[tuple[str, str]] | None = None) -> pd.DataFrame:
    """One generation per (parameters, grad mode) case, counting what autograd holds: zero unless grad mode
    meets trainable parameters. One pipeline serves every case (requires_grad is switched in place)."""
    cases = cases or [("frozen", "grad"), ("trainable", "grad"), ("trainable", "no_grad"),
                      ("trainable", "inference_mode")]
    workload, dtype = study.workload(1), study.profile.dtype
    pipe = at_dtype(study.pipeline("float32"), dtype)
    rows = []
    for parameters, mode in cases:
        out = saved_for_backward(opt.apply(pipe, parameters), workload, mode)
        rows.append({"parameters": parameters, "grad_mode": mode, **out})
        study.recorder.add(f"{mode}, parameters {parameters}, batch 1", "saved_for_backward",
                           out["saved_for_backward_mib"], "MiB", n=1, dtype=dtype,
                           note=f"{out['saved_storages']} tensors autograd keeps for backward during one "
                                "generation, parameters excluded (saved_tensors_hooks)")
    pipe = None
    release()
    return pd.DataFrame(rows)


def published_vs_measured(study: Study, claims: pd.DataFrame) -> pd.DataFrame:
    fp16 = published.value("Cerebrium SD ladder", config="fp16")
    im = published.value("Cerebrium SD ladder", config="inference_mode")
    row = claims[claims.comparison == CLAIM]
    measured = float(row["speedup"].iloc[0]) if len(row) else None
    spread = (f"; range {row['speedup_lo'].iloc[0]:.3f}-{row['speedup_hi'].iloc[0]:.3f}x, "
              f"{row['verdict'].iloc[0]}" if len(row) else "; not measured in this run")
    return pd.DataFrame([published_row(
        f"{CLAIM} speed-up", "Cerebrium SD ladder (seeds/cerebrium-sd-ladder.txt)", "NVIDIA A10G",
        "SD v1.x, 512px, fp16, one latency each, no spread given", fp16 / im, measured,
        f"{study.conditions(1)}, {study.profile.dtype}{spread}", detail=f"{fp16} s -> {im} s")])


def plot(study: Study, cmp: Comparison):
    """Speed-up of each mode over the inference_mode baseline, and the peak memory each one needed."""
    return speedup_and_memory(study, cmp, f"vs {BASELINE} under inference_mode ({study.device})", "grad_modes")
