"""03_attention: diffusers' attention processors and PyTorch's SDPA backends, side by side in one run.

The fp32 eager baseline already runs SDPA with PyTorch's own choice of backend (diffusers' default processor), and
its twin is the run's noise floor. On GPU profiles (float16) each configuration runs in that precision.
"""
from __future__ import annotations

import time

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from sdperf.config import published
from sdperf.config.architectures import get as get_arch
from sdperf.measure.comparison import BASELINE, TWIN, Comparison, published_row, release, run_variants
from sdperf.experiments.common import (at_dtype, baseline_runs, facts_table,  # noqa: F401  (notebook API)
                                       ratio_columns, speedup_and_memory)
from sdperf.measure.measurements import unet_call_inputs
from sdperf.optimizations import attention as opt, catalog, half_precision
from sdperf.optimizations.catalog import Stack
from sdperf.measure.study import Study
from sdperf.measure.timing import synchronize

SDPA_OP = "aten::scaled_dot_product_attention"


def skeleton(study: Study) -> torch.nn.Module:
    """The profile's UNet on the meta device, for the checks that need its layers but not its weights."""
    return opt.unet_skeleton(get_arch(study.profile.arch).unet)


def configs(study: Study, keys: list[str]) -> list[tuple[str, str]]:
    """(display name, stack key) per attention key, in the profile's precision."""
    dtype = study.profile.dtype
    suffix = "" if dtype == "float32" else f", {dtype}"
    return [(Stack.of(k).label + suffix, Stack.of(at_dtype(study, k)).key) for k in keys]


def compare_attention(study: Study, keys: list[str]) -> Comparison:
    """Each attention configuration in its own processes, in rounds, against fp32 eager (SDPA, PyTorch's choice)."""
    return run_variants(study, configs(study, keys))


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


def _unet_call(pipe, workload):
    args, kwargs = unet_call_inputs(pipe, workload)
    return lambda: pipe.unet(*args, **kwargs)


def sdpa_share(study: Study) -> pd.DataFrame:
    """How much of one UNet step is spent inside scaled_dot_product_attention (torch.profiler, one warm call):
    the most any attention kernel can save, whatever the backend."""
    device, dtype = study.device, study.profile.dtype
    pipe = study.pipeline("float32")
    pipe = pipe if dtype == "float32" else half_precision.apply(pipe, dtype)
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
    method = (f"torch.profiler over one UNet call after a warm one: {'GPU' if device == 'cuda' else 'CPU'} time "
              f"of {SDPA_OP} and its children; share of that call's wall time under the profiler")
    note = f"{sum(e.count for e in events)} calls in a {wall:.3f} s profiled UNet call"
    common = dict(scenario=scenario, n=1, dtype=dtype, batch_size=1, method=method, note=note)
    study.recorder.add_many([dict(common, metric="sdpa_seconds", value=seconds, unit="s"),
                             dict(common, metric="sdpa_share", value=share, unit="%")])
    return pd.DataFrame([{"sdpa_calls": sum(e.count for e in events), "sdpa_s": seconds, "unet_step_s": wall,
                          "sdpa_share_percent": share,
                          "best_case_speedup_if_attention_were_free": 100.0 / (100.0 - share)}])


# (source, config) of the published SD 1.5 throughputs with SDPA in eager mode
PUBLISHED_SDPA_EAGER = (("diffusers docs torch2.0", "SDPA eager"), ("fal-ai stable-diffusion-benchmarks", "SDPA fp16"))


def published_vs_measured(study: Study, cmp: Comparison) -> pd.DataFrame:
    """Published SD 1.5 SDPA eager it/s beside the baseline's: context across hardware, not a like-for-like ratio."""
    base = baseline_runs(cmp)
    it_per_s = float(base.it_per_s.median())
    measured = (f"{study.conditions(1, scope='denoising loop (UNet + scheduler)')}, float32, SDPA with PyTorch's "
                f"choice of backend; median of {len(base)} baseline processes ({cmp.method})")
    rows = []
    for source, config in PUBLISHED_SDPA_EAGER:
        r = published.select(source, what=config, model="SD 1.5").iloc[0]
        rows.append(published_row(
            "SD 1.5 denoising throughput, SDPA, eager", f"{published.cite(source)}; {r.detail}", r.hardware,
            f"{r.settings}; {config}", float(r.value), it_per_s, measured, unit="it/s"))
    return pd.DataFrame(rows)


def plot(study: Study, cmp: Comparison):
    return speedup_and_memory(study, cmp, f"attention variants vs {BASELINE} ({study.device})", "attention",
                              f"Attention processors and SDPA backends in {study.profile.dtype}",
                              baseline=f"{BASELINE} (SDPA, PyTorch's choice of backend)")


# --- token merging (tomesd) ---------------------------------------------------------------------------------
MERGING_COLUMNS = ["variant", "status", *ratio_columns("speedup", "unet_step_speedup"), "seed_speedup", "image_psnr_db",
                   "note"]


def check_merging(keys: list[str]) -> list[str]:
    for k in keys:
        if catalog.get(k).family != catalog.MERGING:
            raise ValueError(f"{k!r} is not a token-merging technique; valid: "
                             f"{', '.join(catalog.keys(family=catalog.MERGING))} (tome:<ratio>)")
    return list(keys)


def merging(study: Study, keys: list[str]) -> pd.DataFrame:
    """Token merging at each ratio against fp32 eager (attention's cost falls with the tokens merged away)."""
    cmp = run_variants(study, check_merging(keys), batch_size=1)
    t = cmp.table[~cmp.table.variant.isin([BASELINE, TWIN])]
    return t.reindex(columns=MERGING_COLUMNS).reset_index(drop=True)
