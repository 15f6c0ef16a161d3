"""02_inference_mode: grad mode on (frozen and trainable parameters), no_grad and inference_mode, in one run.

The baseline is fp32 eager under inference_mode (sdperf's default); inference_mode is measured again in the profile's
precision, built and timed like no_grad, so the Cerebrium step (no_grad -> inference_mode, "<1%") is the ratio of
those two configurations' ratios per round, read against the noise floor (the twin) a sub-percent claim must clear.
"""
from __future__ import annotations

import pandas as pd
import torch

from sdperf.config import published
from sdperf.measure import rounds
from sdperf.measure.comparison import BASELINE, TWIN, Comparison, published_row, release, run_variants
from sdperf.experiments.common import at_dtype, facts_table, speedup_and_memory  # noqa: F401  (notebook API)
from sdperf.model.generation import Workload, generate
from sdperf.optimizations import half_precision, inference_mode as opt
from sdperf.optimizations.catalog import Stack
from sdperf.store.results import VERDICTS
from sdperf.measure.study import Study

# stack key (without the profile's precision) -> display name
NAMES = {"grad:inference_mode": "inference_mode (fresh pipeline)", "grad:no_grad": "no_grad",
         "grad:grad": "grad on, parameters frozen", "grad:grad+parameters:trainable": "grad on, parameters trainable"}
CLAIM = "no_grad -> inference_mode"
NOISE_FLOOR = "noise floor: fp32 eager against its twin"


def _name(key: str, dtype: str = "float32") -> str:
    return NAMES.get(key, Stack.of(key).label) + ("" if dtype == "float32" else f", {dtype}")


def configs(study: Study, keys: list[str]) -> list[tuple[str, str]]:
    """(display name, stack key) per grad-mode key, in the profile's precision."""
    dtype = study.profile.dtype
    return [(_name(k, dtype), Stack.of(at_dtype(study, k)).key) for k in keys]


def compare_modes(study: Study, keys: list[str]) -> Comparison:
    """Each grad-mode configuration in its own processes, in rounds, against fp32 eager (inference_mode)."""
    return run_variants(study, configs(study, keys))


def step_ratio(ratios: pd.DataFrame, before: str, after: str) -> pd.Series:
    """Per round, how much faster `after` ran than `before`: the ratio of their ratios to the same baseline."""
    r = ratios.pivot_table(index="round", columns="config", values="speedup")
    if before not in r or after not in r:
        return pd.Series(dtype=float)
    return (r[after] / r[before]).dropna()


def _claim_row(name: str, per_round: pd.Series, band: tuple[float, float], note: str) -> dict:
    lo, hi = float(per_round.min()), float(per_round.max())
    return {"comparison": name, "speedup": float(per_round.median()), "speedup_lo": lo, "speedup_hi": hi,
            "rounds": len(per_round), "verdict": rounds.speed_verdict(lo, hi, band), "noise_lo": band[0],
            "noise_hi": band[1], "note": note}


def cerebrium_ratio(study: Study, cmp: Comparison) -> pd.DataFrame:
    """The Cerebrium step per round, median [min-max] judged against the noise band, and the noise floor itself."""
    dtype, band, m = study.profile.dtype, cmp.noise["speedup"], cmp.measured
    rows = []
    step = step_ratio(m.ratios, _name("grad:no_grad", dtype), _name("grad:inference_mode", dtype))
    if len(step):
        rows.append(_claim_row(CLAIM, step, band, f"the Cerebrium step, {dtype}: ratio of the two "
                                                 "configurations' ratios to the baseline, per round"))
    twin = m.ratios.loc[m.ratios.config == TWIN, "speedup"]
    if len(twin):
        row = _claim_row(NOISE_FLOOR, twin, band, f"{BASELINE} measured twice: any gap is noise")
        row["verdict"] = f"the noise floor itself (symmetric band {band[0]:.3f}-{band[1]:.3f}x)"
        rows.append(row)
    for r in rows:
        study.recorder.add(f"{r['comparison']}, batch 1", "speedup", r["speedup"], "x", lo=r["speedup_lo"],
                           hi=r["speedup_hi"], n=r["rounds"], method=cmp.method, batch_size=1,
                           verdict=r["verdict"] if r["verdict"] in VERDICTS else None,
                           note=f"{r['note']}; {r['verdict']}")
    return pd.DataFrame(rows)


def saved_for_backward(pipe, workload: Workload, grad_mode: str) -> dict:
    """Bytes autograd keeps for backward during one generation, parameters excluded (resident anyway); nothing is
    freed before it returns (each step's latents feed the next), so the sum is what the graph holds at its end."""
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


SAVED_METHOD = ("bytes of the distinct storages autograd keeps for backward during one generation, parameters "
                "excluded (torch.autograd.graph.saved_tensors_hooks)")


def saved_activations(study: Study, cases: list[tuple[str, str]] | None = None) -> pd.DataFrame:
    """One generation per (parameters, grad mode) case, counting what autograd holds: zero unless grad mode
    meets trainable parameters. One pipeline serves every case (requires_grad is switched in place)."""
    cases = cases or [("frozen", "grad"), ("trainable", "grad"), ("trainable", "no_grad"),
                      ("trainable", "inference_mode")]
    workload, dtype = study.workload(1), study.profile.dtype
    pipe = study.pipeline("float32")
    pipe = pipe if dtype == "float32" else half_precision.apply(pipe, dtype)
    rows = []
    for parameters, mode in cases:
        out = saved_for_backward(opt.apply(pipe, parameters), workload, mode)
        rows.append({"parameters": parameters, "grad_mode": mode, **out})
        study.recorder.add(f"{mode}, parameters {parameters}, batch 1", "saved_for_backward",
                           out["saved_for_backward_mib"], "MiB", n=1, dtype=dtype, batch_size=1,
                           method=SAVED_METHOD, note=f"{out['saved_storages']} tensors")
    pipe = None
    release()
    return pd.DataFrame(rows)


def published_vs_measured(study: Study, claims: pd.DataFrame, method: str) -> pd.DataFrame:
    fp16 = published.value("Cerebrium SD ladder", what="fp16")
    im = published.value("Cerebrium SD ladder", what="inference_mode")
    row = claims[claims.comparison == CLAIM]
    measured = float(row["speedup"].iloc[0]) if len(row) else None
    spread = (f"; median [min-max] over {row['rounds'].iloc[0]} rounds {row['speedup_lo'].iloc[0]:.3f}-"
              f"{row['speedup_hi'].iloc[0]:.3f}x, {row['verdict'].iloc[0]}" if len(row) else
              "; not measured in this run")
    return pd.DataFrame([published_row(
        f"{CLAIM} speed-up", published.cite("Cerebrium SD ladder"), "NVIDIA A10G",
        "SD v1.x, 512px, fp16, one latency each, no spread given", fp16 / im, measured,
        f"{study.conditions(1)}, {study.profile.dtype}{spread}; {method}", detail=f"{fp16} s -> {im} s")])


def plot(study: Study, cmp: Comparison):
    return speedup_and_memory(study, cmp, f"vs {BASELINE} under inference_mode ({study.device})", "grad_modes",
                              "Grad modes (grad on with frozen or trainable parameters, no_grad, inference_mode) "
                              f"in {study.profile.dtype}", baseline=f"{BASELINE} under inference_mode")
