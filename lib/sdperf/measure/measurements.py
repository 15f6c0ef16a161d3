"""In-process measurements: a generation timed with its per-stage breakdown, the UNet's FLOPs at the workload's
shapes, and a variant-vs-baseline comparison (speed ratio and drift)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from sdperf.measure import drift
from sdperf.model.generation import (STAGES, Output, Workload, encode, generate, guidance_kwargs, initial_latents,
                                     uses_cfg)
from sdperf.measure.roofline import count_flops
from sdperf.measure.timing import StageClock, Timing, measure, ratio


@dataclass
class GenerationRun:
    """One configuration measured end to end: its timing, stage breakdown and (last) output."""

    label: str
    workload: Workload
    timing: Timing
    stages: pd.DataFrame
    output: Output
    unet_calls: list[list[float]] | None = None  # each timed generation's UNet call times, in call order

    @property
    def loop_seconds(self) -> float:
        """Median denoising-loop time (UNet + scheduler) of one generation."""
        s = self.stages.set_index("stage")["seconds_per_image_call"]
        return float(s.get("unet", 0.0) + s.get("scheduler", 0.0))

    @property
    def unet_step_seconds(self) -> float:
        """Median time of one UNet call (one denoising step's forward on the guidance batch)."""
        return float(self.stages.set_index("stage").loc["unet", "median_call_s"])

    @property
    def iterations(self) -> int:
        """Denoising iterations per generation (PLMS runs steps + 1: its first timestep twice)."""
        return int(self.stages.set_index("stage").loc["unet", "calls_per_generation"])

    @property
    def it_per_s(self) -> float:
        return self.iterations / self.loop_seconds

    @property
    def s_per_image(self) -> float:
        return self.timing.median / self.workload.batch_size

    def summary(self) -> dict:
        t = self.timing
        return {"label": self.label, "batch_size": self.workload.batch_size, "steps": self.workload.steps,
                "iterations": self.iterations,
                "latency_s": t.median, "p10_s": t.p10, "p90_s": t.p90, "s_per_image": self.s_per_image,
                "it_per_s": self.it_per_s, "unet_step_s": self.unet_step_seconds, "first_call_s": t.first_call,
                "peak_memory_mib": None if t.peak_memory_bytes is None else t.peak_memory_bytes / 2**20}


def _stage_table(clocks: list[StageClock], steps: int) -> pd.DataFrame:
    """Per stage: median time of one call and of all its calls in one generation, with p10/p90 and share."""
    rows = []
    per_gen = {s: [sum(c.records.get(s, [])) for c in clocks] for s in STAGES}
    total = float(np.median([sum(per_gen[s][i] for s in STAGES) for i in range(len(clocks))]))
    for stage in STAGES:
        calls = [t for c in clocks for t in c.records.get(stage, [])]
        if not calls:
            continue
        gen = per_gen[stage]
        rows.append({"stage": stage, "calls_per_generation": len(calls) // len(clocks),
                     "median_call_s": float(np.median(calls)), "p10_call_s": float(np.percentile(calls, 10)),
                     "p90_call_s": float(np.percentile(calls, 90)),
                     "seconds_per_image_call": float(np.median(gen)),
                     "share_percent": 100.0 * float(np.median(gen)) / total})
    return pd.DataFrame(rows)


def _generation_call(pipe, workload: Workload, latents: torch.Tensor, device: str, grad_mode: str,
                     decode_images: bool = True):
    """A call that runs one generation, and the stage clocks and last output it leaves behind."""
    clocks: list[StageClock] = []
    last: list[Output] = []

    def call():
        clock = StageClock(device)
        last[:] = [generate(pipe, workload, latents, clock=clock, grad_mode=grad_mode, decode_images=decode_images)]
        clocks.append(clock)

    return call, clocks, last


def _generation_run(label: str, workload: Workload, timing: Timing, clocks: list[StageClock], last: list[Output],
                    repeats: int) -> GenerationRun:
    steady = clocks[-repeats:]
    for c in steady:
        c.collect()
    return GenerationRun(label=label, workload=workload, timing=timing, stages=_stage_table(steady, workload.steps),
                         output=last[0], unet_calls=[list(c.records.get("unet", [])) for c in steady])


def timed_generation(pipe, workload: Workload, *, device: str, warmup: int, repeats: int, label: str = "",
                     latents: torch.Tensor | None = None, grad_mode: str = "inference_mode",
                     first_call_steps: int | None = None, decode_images: bool = True) -> GenerationRun:
    """Time whole generations (first call apart, of `first_call_steps` when given) and each stage inside them."""
    latents = initial_latents(pipe, workload) if latents is None else latents
    call, clocks, last = _generation_call(pipe, workload, latents, device, grad_mode, decode_images)
    first = None
    if first_call_steps:
        short = replace(workload, steps=first_call_steps)
        first = lambda: generate(pipe, short, latents, grad_mode=grad_mode, decode_images=decode_images)  # noqa: E731
    timing = measure(call, device=device, warmup=warmup, repeats=repeats, first=first)
    return _generation_run(label, workload, timing, clocks, last, repeats)


def unet_call_inputs(pipe, workload: Workload) -> tuple[tuple, dict]:
    """(args, kwargs) of one UNet forward as the loop makes it: the guidance batch, its embeddings, a timestep."""
    device = next(pipe.unet.parameters()).device
    dtype = next(pipe.unet.parameters()).dtype
    with torch.inference_mode():
        embeds, extra = encode(pipe, workload, device)
        latents = initial_latents(pipe, workload).to(device, dtype)
        x = torch.cat([latents] * 2) if uses_cfg(pipe, workload) else latents
        t = torch.tensor(999, device=device)
        extra = {**extra, **guidance_kwargs(pipe, workload, len(x), device, dtype)}
    return (x, t), {"encoder_hidden_states": embeds, "return_dict": False, **extra}


def unet_flops(pipe, workload: Workload) -> int:
    args, kwargs = unet_call_inputs(pipe, workload)
    return count_flops(pipe.unet, *args, **kwargs)


def compare_runs(baseline: GenerationRun, variant: GenerationRun) -> dict:
    """Speed-up of the variant over the baseline (same run, same workload) and its output drift."""
    if baseline.workload != variant.workload:
        raise ValueError("compare like with like: the two runs used different workloads")
    out = {"variant": variant.label, "baseline": baseline.label}
    out.update(ratio(baseline.timing, variant.timing))
    out["it_per_s_ratio"] = variant.it_per_s / baseline.it_per_s
    out.update(drift.compare(variant.output, baseline.output))
    out["verdict"] = drift.verdict(out)
    return out


class _Captured(Exception):
    """Raised by capture_block_inputs' hook: the block's inputs are in, the rest of the generation is not needed."""


def capture_block_inputs(pipe, workload: Workload, block: str = "down_blocks.0") -> tuple[tuple, dict]:
    """The exact inputs one UNet block receives in the first denoising step; the generation stops there."""
    module = pipe.unet.get_submodule(block)
    seen: list = []

    def hook(_m, args, kwargs):
        seen.append((args, kwargs))
        raise _Captured

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        generate(pipe, Workload(**{**workload.__dict__, "steps": 1}))
    except _Captured:
        pass
    finally:
        handle.remove()
    if not seen:
        raise RuntimeError(f"UNet block {block!r} was not called in a generation")
    return seen[0]


def _cast(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _first_tensor(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else _first_tensor(out[0])


def block_comparison(pipe, workload: Workload, dtype: torch.dtype, *, device: str, warmup: int, repeats: int,
                     block: str = "down_blocks.0") -> dict:
    """One real UNet block at the workload's shapes, float32 vs `dtype`: a cheap stand-in for whole generations."""
    import copy

    args, kwargs = capture_block_inputs(pipe, workload, block)
    ref_block = pipe.unet.get_submodule(block)
    var_block = copy.deepcopy(ref_block).to(dtype)
    v_args, v_kwargs = _cast(args, dtype), _cast(kwargs, dtype)
    outs = {}

    def run(mod, a, kw, key):
        with torch.inference_mode():
            outs[key] = _first_tensor(mod(*a, **kw))

    base = measure(lambda: run(ref_block, args, kwargs, "ref"), device=device, warmup=warmup, repeats=repeats)
    var = measure(lambda: run(var_block, v_args, v_kwargs, "var"), device=device, warmup=warmup, repeats=repeats)
    out = {"block": block, "baseline_timing": base, "variant_timing": var}
    out.update(ratio(base, var))
    out["block_rel_error"] = drift.relative_error(outs["var"].float().cpu(), outs["ref"].float().cpu())
    return out


IN_PROCESS = "in process: one pipeline, whole generations timed one by one; median with p10/p90 of the repeats"


def record_generation(recorder, run: GenerationRun, scenario: str, dtype: str | None = None) -> None:
    """The rows of one run timed in this process: one pipeline's description, never ratios (sdperf.measure.rounds)."""
    b, n = run.workload.batch_size, len(run.timing.times)
    t = run.timing
    common = dict(n=n, dtype=dtype, method=IN_PROCESS, batch_size=b)
    rows = [dict(scenario=scenario, metric="latency", value=t.median, unit="s", p10=t.p10, p90=t.p90, **common),
            dict(scenario=scenario, metric="latency_first_call", value=t.first_call, unit="s",
                 note="first call, includes warm-up", **{**common, "n": 1}),
            dict(scenario=scenario, metric="s_per_image", value=run.s_per_image, unit="s", p10=t.p10 / b,
                 p90=t.p90 / b, **common),
            dict(scenario=scenario, metric="it_per_s", value=run.it_per_s, unit="it/s", note=f"{run.iterations} "
                 f"denoising iterations for {run.workload.steps} steps; UNet + scheduler per iteration", **common),
            dict(scenario=scenario, metric="unet_step", value=run.unet_step_seconds, unit="s",
                 note="median of one UNet call on the guidance batch", **common)]
    if t.peak_memory_bytes is not None:
        rows.append(dict(scenario=scenario, metric="peak_memory", value=t.peak_memory_bytes / 2**20, unit="MiB",
                         note=t.memory_kind, **common))
    rows += [dict(scenario=scenario, metric=f"stage:{r.stage}", value=r.seconds_per_image_call, unit="s",
                  p10=r.p10_call_s * r.calls_per_generation, p90=r.p90_call_s * r.calls_per_generation,
                  note=f"{r.calls_per_generation} call(s) per generation, {r.share_percent:.1f}% of the generation",
                  **common) for r in run.stages.itertuples()]
    recorder.add_many(rows)
