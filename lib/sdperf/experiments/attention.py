"""03_attention: diffusers' attention processors and PyTorch's SDPA backends, side by side in one run.

Every variant is measured against the fp32 eager baseline, which already runs SDPA with PyTorch's own choice of
backend (diffusers' default processor). 'default' re-measures that configuration on a fresh pipeline in the
profile's precision: on float32 profiles it is the run's noise floor, on GPU profiles (float16) the reference
the forced backends are read against.
"""
from __future__ import annotations

import time

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from sdperf import published
from sdperf.architectures import get as get_arch
from sdperf.comparison import BASELINE, Comparison, Variant, published_row, release, run_variants
from sdperf.experiments.common import at_dtype, speedup_and_memory
from sdperf.measurements import unet_call_inputs
from sdperf.optimizations import attention as opt
from sdperf.study import Study
from sdperf.timing import synchronize

KINDS = ("default", "classic", "sdpa", "sliced", "dispatcher")
SDPA_OP = "aten::scaled_dot_product_attention"


def skeleton(study: Study) -> torch.nn.Module:
    """The profile's UNet on the meta device, for the checks that need its layers but not its weights."""
    return opt.unet_skeleton(get_arch(study.profile.arch).unet)


def _slice_arg(arg: str):
    return int(arg) if arg.isdigit() else arg


def variant(study: Study, spec: str, unet_skeleton: torch.nn.Module) -> Variant:
    """One variant from a spec: 'default', 'classic', 'sdpa:<backend>', 'sliced:<auto|max|n>',
    'dispatcher:<diffusers backend>'."""
    kind, _, arg = spec.partition(":")
    if kind not in KINDS or (kind in ("default", "classic") and arg):
        raise ValueError(f"variant {spec!r} is not valid; choose one of: default, classic, "
                         f"sdpa:<{'|'.join(opt.BACKENDS)}>, sliced:<auto|max|n>, dispatcher:<name>")
    dtype = study.profile.dtype
    suffix = "" if dtype == "float32" else f", {dtype}"

    def make(label, change, availability=(True, ""), note=""):
        return Variant(label=label + suffix, apply=lambda pipe: change(at_dtype(pipe, dtype)),
                       availability=availability, dtype=dtype, facts=opt.facts, note=note)

    if kind == "default":
        return make("SDPA, PyTorch's choice (fresh pipeline)", lambda p: p, note="the baseline's configuration")
    if kind == "classic":
        return make("classic (AttnProcessor)", lambda p: opt.use_processor(p, "classic"),
                    note="softmax(QK^T)V with batched matmuls, the score matrix in memory")
    if kind == "sdpa":
        ok = opt.sdpa_availability(study.device, arg, dtype, opt.head_shapes(unet_skeleton))
        return make(f"SDPA {arg} only", lambda p: opt.use_sdpa_backend(p, arg), ok,
                    note=f"UNet calls inside sdpa_kernel(SDPBackend.{opt.BACKENDS[arg].name})")
    if kind == "sliced":
        size = _slice_arg(arg or "auto")
        opt.check_slice_size(size)
        return make(f"sliced attention ({size})", lambda p: opt.use_slicing(p, size),
                    note="enable_attention_slicing: SlicedAttnProcessor on the UNet")
    opt.check_dispatcher_backend(arg)
    return make(f"set_attention_backend('{arg}')", lambda p: opt.use_dispatcher(p, arg),
                opt.dispatcher_availability(unet_skeleton), note="diffusers' attention dispatcher")


def variants(study: Study, specs: list[str]) -> list[Variant]:
    """All named variants, validated (and their availability probed) before anything is timed."""
    unet = skeleton(study)
    return [variant(study, s, unet) for s in specs]


def compare_attention(study: Study, specs: list[str]) -> Comparison:
    """The fp32 eager baseline (SDPA, PyTorch's choice) first, then each variant on a fresh pipeline."""
    return run_variants(study, variants(study, specs))


def backend_matrix(study: Study, dtypes: list[str]) -> pd.DataFrame:
    """Which SDPA backend runs on this device in which precision, at the UNet's head shapes, found by trying."""
    shapes = opt.head_shapes(skeleton(study))
    rows = []
    for backend in opt.BACKENDS:
        for dtype in dtypes:
            ok, reason = opt.sdpa_availability(study.device, backend, dtype, shapes)
            rows.append({"backend": backend, "dtype": dtype, "runs_here": ok, "reason": reason})
    return pd.DataFrame(rows)


def global_switches() -> dict[str, bool]:
    """torch.backends.cuda's process-wide SDPA switches (enable_flash_sdp & co.): which backends may be chosen."""
    b = torch.backends.cuda
    return {"flash": b.flash_sdp_enabled(), "efficient": b.mem_efficient_sdp_enabled(),
            "cudnn": b.cudnn_sdp_enabled(), "math": b.math_sdp_enabled()}


def facts_table(cmp: Comparison) -> pd.DataFrame:
    """The processors each prepared pipeline runs, and whether its UNet is held to one SDPA backend."""
    return pd.DataFrame([{"variant": k, **v} for k, v in cmp.facts.items()])


def _unet_call(pipe, workload):
    """One UNet forward on the guidance batch of this workload, ready to call (as measurements.unet_flops)."""
    args, kwargs = unet_call_inputs(pipe, workload)
    return lambda: pipe.unet(*args, **kwargs)


def sdpa_share(study: Study) -> pd.DataFrame:
    """How much of one UNet step is spent inside scaled_dot_product_attention (torch.profiler, one warm call):
    the most any attention kernel can save, whatever the backend."""
    device, dtype = study.device, study.profile.dtype
    pipe = at_dtype(study.pipeline("float32"), dtype)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.inference_mode():
        call = _unet_call(pipe, study.workload(1))
        call()
        synchronize(device)
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            call()
            synchronize(device)
            wall = time.perf_counter() - t0
    pipe = call = None
    release()
    attr = "device_time_total" if device == "cuda" else "cpu_time_total"
    events = [e for e in prof.key_averages() if e.key == SDPA_OP]
    seconds = sum(getattr(e, attr) for e in events) / 1e6
    share = 100.0 * seconds / wall
    scenario = "SDPA, PyTorch's choice, one UNet step, batch 1"
    note = (f"{sum(e.count for e in events)} {SDPA_OP} calls in one profiled UNet call ({wall:.3f} s under the "
            f"profiler, {'GPU' if device == 'cuda' else 'CPU'} time of the op and its children)")
    study.recorder.add_many([
        dict(scenario=scenario, metric="sdpa_seconds", value=seconds, unit="s", n=1, dtype=dtype, note=note),
        dict(scenario=scenario, metric="sdpa_share", value=share, unit="%", n=1, dtype=dtype, note=note)])
    return pd.DataFrame([{"sdpa_calls": sum(e.count for e in events), "sdpa_s": seconds, "unet_step_s": wall,
                          "sdpa_share_percent": share,
                          "best_case_speedup_if_attention_were_free": 100.0 / (100.0 - share)}])


# (source, config) of the published SD 1.5 throughputs with SDPA in eager mode
PUBLISHED_SDPA_EAGER = (("diffusers docs torch2.0", "SDPA eager"), ("fal-ai stable-diffusion-benchmarks", "SDPA fp16"))


def published_vs_measured(study: Study, cmp: Comparison) -> pd.DataFrame:
    """Published SD 1.5 throughput with SDPA in eager mode beside the baseline's (also SDPA, eager) it/s:
    context across very different hardware, not a like-for-like ratio."""
    measured = (f"{study.conditions(1, scope='denoising loop (UNet + scheduler)')}, float32, SDPA with "
                "PyTorch's choice of backend")
    rows = []
    for source, config in PUBLISHED_SDPA_EAGER:
        r = published.select(source, config=config).iloc[0]
        steps = "" if pd.isna(r.steps) else f", {int(r.steps)} steps"
        rows.append(published_row(
            "SD 1.5 denoising throughput, SDPA, eager", f"{source} ({r.note})", r.hardware,
            f"{r.model}, {int(r.resolution)}px{steps}, batch {int(r.batch_size)}, {config}", float(r.value),
            cmp.baseline.it_per_s, measured, unit="it/s"))
    return pd.DataFrame(rows)


def plot(study: Study, cmp: Comparison):
    return speedup_and_memory(study, cmp, f"attention variants vs {BASELINE} ({study.device})", "attention")
