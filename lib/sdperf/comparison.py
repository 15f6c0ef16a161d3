"""Variants measured against the fp32 eager baseline in one run: can it run here, what does getting it ready
cost, how fast is it once warm, and did the picture move.

Every optimization notebook asks those four questions of each variant; asking them in one place keeps the rows
of different notebooks comparable. A process runs faster as it ages (allocator growth, page faults: in the cpu
run of commit b70e048 the fp32 baseline re-timed at the end of each notebook took 0.78-0.83x the time it took at
the start), so a speed-up that divides an early baseline by a late variant is inflated. Hence: one untimed warm
generation before the baseline is timed, each variant timed in turn with the baseline (A B, B A, ...), and its
ratios taken against that in-turn baseline. The baseline timed again at the end still says how far the
conditions moved.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd
import torch

from sdperf.measurements import GenerationRun, compare_runs, timed_generation, timed_in_turn, unet_flops
from sdperf.roofline import achieved, matmul_peak
from sdperf.study import Study

BASELINE = "fp32 eager"
IN_TURN = "fp32 eager, in turn"  # the baseline's calls interleaved with one variant's
WARM_GENERATIONS = 1  # untimed, after the baseline's (timed) first call and before its repeats
DRIFT_METRICS = (("latent_rel_error", ""), ("latent_max_abs_error", ""), ("image_max_abs_error", ""),
                 ("image_psnr_db", "dB"))
COLUMNS = ["variant", "status", "setup_s", "first_call_s", "latency_s", "p10_s", "p90_s", "s_per_image",
           "it_per_s", "unet_step_s", "fp32_in_turn_s", "speedup", "speedup_lo", "speedup_hi", "unet_step_speedup",
           "percent_of_fp32_peak", "peak_memory_mib", "latent_rel_error", "image_psnr_db", "verdict", "note"]


@dataclass
class Variant:
    """One way of running the pipeline. `apply` gets a freshly built fp32 pipeline (same seed, same weights: engines
    export from fp32, precisions cast from it) and returns the pipeline to time; its wall time is reported as
    set-up (export, build, quantize). Lazy work such as torch.compile lands in the first call, reported apart
    from steady state. `dtype` is the precision the variant runs in, for the results rows."""

    label: str
    apply: Callable[[Any], Any] = lambda pipe: pipe
    availability: tuple[bool, str] = (True, "")
    dtype: str = "float32"
    grad_mode: str = "inference_mode"
    note: str = ""
    # notebook-specific facts about the prepared pipeline (e.g. modules replaced); called after apply
    facts: Callable[[Any], dict] | None = None
    extra: dict = field(default_factory=dict)


def release() -> None:
    """Return freed memory (drop your references first), so the next variant starts from the same conditions."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def record_run(recorder, run: GenerationRun, scenario: str, dtype: str | None = None) -> None:
    """Latency (median, p10/p90, first call, peak memory), s/image, it/s and the per-stage split of one run."""
    recorder.timing(scenario, run.timing, dtype=dtype)
    b, n = run.workload.batch_size, len(run.timing.times)
    recorder.add_many([
        dict(scenario=scenario, metric="s_per_image", value=run.s_per_image, unit="s", p10=run.timing.p10 / b,
             p90=run.timing.p90 / b, n=n, dtype=dtype),
        dict(scenario=scenario, metric="it_per_s", value=run.it_per_s, unit="it/s", n=n, dtype=dtype,
             note=f"{run.iterations} denoising iterations for {run.workload.steps} steps; "
             "UNet + scheduler per iteration, median of the loop"),
        dict(scenario=scenario, metric="unet_step", value=run.unet_step_seconds, unit="s", n=n, dtype=dtype,
             note="median of one UNet call on the guidance batch"),
    ] + [dict(scenario=scenario, metric=f"stage:{r.stage}", value=r.seconds_per_image_call, unit="s",
              p10=r.p10_call_s * r.calls_per_generation, p90=r.p90_call_s * r.calls_per_generation, n=n,
              dtype=dtype, note=f"{r.calls_per_generation} call(s) per generation, "
              f"{r.share_percent:.1f}% of the generation")
         for r in run.stages.itertuples()])


def record_comparison(recorder, scenario: str, cmp: dict, n: int, dtype: str | None = None) -> None:
    """Speed-up over the baseline (whole call and per UNet step) and the drift of the output."""
    rows = [dict(scenario=scenario, metric="speedup_vs_fp32", value=cmp["speedup"], unit="x", p10=cmp["speedup_lo"],
                 p90=cmp["speedup_hi"], n=n, dtype=dtype,
                 note=f"vs {cmp['baseline']}: ratio of medians; range from the p10/p90 of both")]
    if "unet_step_speedup" in cmp:
        rows.append(dict(scenario=scenario, metric="unet_step_speedup_vs_fp32", value=cmp["unet_step_speedup"],
                         unit="x", n=n, dtype=dtype, note="ratio of median UNet calls"))
    rows += [dict(scenario=scenario, metric=m, value=cmp[m], unit=u, dtype=dtype, note=cmp["verdict"])
             for m, u in DRIFT_METRICS]
    recorder.add_many(rows)


def compare(baseline: GenerationRun, run: GenerationRun) -> dict:
    """compare_runs plus the per-UNet-step ratio (what a step-count-independent claim compares)."""
    cmp = compare_runs(baseline, run)
    cmp["unet_step_speedup"] = baseline.unet_step_seconds / run.unet_step_seconds
    return cmp


@dataclass
class Comparison:
    """The outcome of run_variants: one row per variant (the baseline first), and the runs themselves."""

    table: pd.DataFrame
    baseline: GenerationRun
    runs: dict[str, GenerationRun]
    facts: dict[str, dict]

    def ok(self) -> pd.DataFrame:
        return self.table[self.table.status == "ok"]


def _row(run: GenerationRun, status: str = "ok", **kw) -> dict:
    s = run.summary()
    return {"variant": run.label, "status": status, "first_call_s": s["first_call_s"], "latency_s": s["latency_s"],
            "p10_s": s["p10_s"], "p90_s": s["p90_s"], "s_per_image": s["s_per_image"], "it_per_s": s["it_per_s"],
            "unet_step_s": s["unet_step_s"], "peak_memory_mib": s["peak_memory_mib"], **kw}


class Bench:
    """The fp32 eager baseline of one workload, measured once, and every variant measured against it.

    run_variants() is the usual entry point; the ladder uses a Bench directly because it decides rung by rung
    what to stack next."""

    def __init__(self, study: Study, *, batch_size: int = 1, roof: bool = True, say: Callable[[str], None] = print):
        p = study.profile
        self.study, self.say, self.suffix = study, say, f", batch {batch_size}"
        self.workload = study.workload(batch_size)
        self._base_pipe = study.pipeline("float32")
        # the first call stays timed alone (cold); WARM_GENERATIONS more run untimed before the repeats
        self.baseline = timed_generation(self._base_pipe, self.workload, device=study.device,
                                         warmup=max(p.warmup, 1) + WARM_GENERATIONS, repeats=p.repeats,
                                         label=BASELINE)
        record_run(study.recorder, self.baseline, BASELINE + self.suffix, dtype="float32")
        self.flops = self.peak = None
        if roof:
            self.flops = unet_flops(self._base_pipe, self.workload)
            self.peak, _ = matmul_peak(study.device, torch.float32, p.matmul_size)

    def percent_of_peak(self, run: GenerationRun) -> float | None:
        if self.flops is None:
            return None
        return achieved(self.flops, run.unet_step_seconds, self.peak)["percent_of_peak"]

    def baseline_row(self) -> dict:
        return _row(self.baseline, note="timed alone at the start; each variant's ratios divide the baseline timed "
                                        "in turn with it (fp32_in_turn_s)", speedup=1.0, unet_step_speedup=1.0,
                    percent_of_fp32_peak=self.percent_of_peak(self.baseline))

    def measure(self, v: Variant) -> tuple[dict, GenerationRun | None, dict]:
        """(table row, run or None when not measured, facts) for one variant on a fresh copy of the network."""
        study, rec, p = self.study, self.study.recorder, self.study.profile
        scenario = v.label + self.suffix
        ok, reason = v.availability
        if not ok:
            self.say(f"{v.label}: not applicable: {reason}")
            rec.not_applicable(scenario, reason)
            return {"variant": v.label, "status": "not_applicable", "note": f"not applicable: {reason}"}, None, {}
        pipe = None
        try:
            pipe = study.pipeline("float32")
            t0 = time.perf_counter()
            pipe = v.apply(pipe)
            setup = time.perf_counter() - t0
            facts = v.facts(pipe) if v.facts else {}
            runs = timed_in_turn({IN_TURN: (self._base_pipe, "inference_mode"), v.label: (pipe, v.grad_mode)},
                                 self.workload, device=study.device, warmup=p.warmup, repeats=p.repeats,
                                 memory_of=(v.label,))
            run, beside = runs[v.label], runs[IN_TURN]
        except Exception as exc:  # a technique this stack cannot run: recorded with its error, the rest go on
            text = str(exc).strip()
            msg = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
            self.say(f"{v.label}: failed: {msg}")
            rec.failed(scenario, msg)
            return {"variant": v.label, "status": "failed", "note": msg[:300]}, None, {}
        finally:
            pipe = None
            release()
        record_run(rec, run, scenario, dtype=v.dtype)
        rec.add(scenario, "setup", setup, "s", n=1, dtype=v.dtype,
                note="apply/export/build before the first call (compile lands in the first call)")
        t = beside.timing
        rec.add(scenario, "fp32_in_turn", t.median, "s", p10=t.p10, p90=t.p90, n=len(t.times), dtype="float32",
                note=f"{BASELINE} timed in turn with this variant (A B, B A, ...): the speed-ups divide this")
        cmp = compare(beside, run)
        record_comparison(rec, scenario, cmp, len(run.timing.times), dtype=v.dtype)
        pct = self.percent_of_peak(run)
        if pct is not None:
            rec.add(scenario, "percent_of_peak", pct, "%", dtype=v.dtype,
                    note=f"UNet FLOPs / median UNet call, of the measured float32 matmul roof "
                         f"{self.peak / 1e9:.1f} GFLOP/s")
        row = _row(run, setup_s=setup, fp32_in_turn_s=t.median, speedup=cmp["speedup"],
                   speedup_lo=cmp["speedup_lo"], speedup_hi=cmp["speedup_hi"],
                   unet_step_speedup=cmp["unet_step_speedup"], percent_of_fp32_peak=pct,
                   latent_rel_error=cmp["latent_rel_error"], image_psnr_db=cmp["image_psnr_db"], verdict=cmp["verdict"],
                   note=v.note)
        return row, run, facts

    def retime(self) -> dict:
        """The baseline again: how much the conditions moved while the variants ran."""
        p, rec = self.study.profile, self.study.recorder
        again = timed_generation(self._base_pipe, self.workload, device=self.study.device, warmup=p.warmup,
                                 repeats=p.repeats, label=f"{BASELINE} (re-timed after the variants)")
        moved = again.timing.median / self.baseline.timing.median
        record_run(rec, again, again.label + self.suffix, dtype="float32")
        rec.add(again.label + self.suffix, "baseline_retime_ratio", moved, "x", n=len(again.timing.times),
                note="median after / median before the variants: how much the conditions moved during the run")
        return _row(again, note=f"baseline after / before = {moved:.3f}: how far the conditions moved; the "
                                "ratios above are taken in turn, so this drift does not enter them",
                    speedup=self.baseline.timing.median / again.timing.median,
                    unet_step_speedup=self.baseline.unet_step_seconds / again.unet_step_seconds)

    def close(self) -> None:
        self._base_pipe = None
        release()


def run_variants(study: Study, variants: list[Variant], *, batch_size: int = 1, retime_baseline: bool = True,
                 roof: bool = True, say: Callable[[str], None] = print) -> Comparison:
    """Baseline, then each variant on a fresh copy of the same network and the same latents, timed in turn with
    the baseline, then (optionally) the baseline again. A variant that cannot run here is recorded as not
    applicable with its reason; one that raises is recorded as failed with its error, and the rest still run."""
    bench = Bench(study, batch_size=batch_size, roof=roof, say=say)
    rows, runs, facts = [bench.baseline_row()], {BASELINE: bench.baseline}, {}
    for v in variants:
        row, run, fact = bench.measure(v)
        rows.append(row)
        if run is not None:
            runs[v.label], facts[v.label] = run, fact
    if retime_baseline:
        rows.append(bench.retime())
    bench.close()
    return Comparison(table=pd.DataFrame(rows).reindex(columns=COLUMNS), baseline=bench.baseline, runs=runs,
                      facts=facts)


def published_row(claim: str, source: str, hardware: str, conditions: str, published: float | None,
                  measured: float | None, measured_conditions: str, unit: str = "x", detail: str = "") -> dict:
    """One line of a notebook's published-vs-measured table: both figures with the conditions of each."""
    return {"claim": claim, "source": source, "hardware": hardware, "conditions": conditions,
            "published": published, "published_detail": detail, "measured_here": measured, "unit": unit,
            "measured_conditions": measured_conditions}
