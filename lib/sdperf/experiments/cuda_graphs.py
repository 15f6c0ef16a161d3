"""05_cuda_graphs: the graphed UNet step against eager where CUDA exists; everywhere, the host work a graph
replay would remove, measured with the profiler on one real UNet step.

On a CPU the operators' arithmetic and the host work (Python, nn.Module calls, dispatcher, per-operator set-up) run
on the same cores in turn, so a UNet step splits into the FLOP-heavy operators ("math": convolution, matmul,
attention) and everything else; on a GPU the math moves to the device and a graph replay removes the host work.
Three bounds on it per step: lower, time outside every ATen operator (Python and module overhead); upper, time
outside the math operators (views, norms and elementwise kernels a GPU still runs: an over-count); independent, the
whole step at the smallest latent the UNet accepts (math small, not zero). The shares are of a CPU step, where math
is slower than on a GPU: the seconds and operator counts carry over, not the shares.
"""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from sdperf.config import published
from sdperf.store import figure_captions
from sdperf.measure.comparison import BASELINE, Comparison, published_row, release, run_variants
from sdperf.measure.measurements import capture_block_inputs
from sdperf.measure.study import Study
from sdperf.measure.timing import Timing, measure, synchronize

STEP = "sdperf::unet_step"
# Operators that carry the UNet's FLOPs: torch.utils.flop_counter's registry, plus the CPU attention kernel it
# lacks. Their time is counted inclusively at the outermost one (conv2d -> convolution -> mkldnn_convolution).
MATH_OPS = frozenset("aten::" + n for n in (
    "convolution", "_convolution", "convolution_overrideable", "mkldnn_convolution", "cudnn_convolution",
    "_slow_conv2d_forward", "mm", "addmm", "bmm", "baddbmm", "_scaled_mm",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_efficient_attention_forward", "_flash_attention_forward"))


def compare(study: Study, say=print) -> Comparison:
    """run_variants with the graphed UNet (in the profile's precision, beside eager in it); without CUDA it is not
    applicable and only the fp32 baseline and its twin are timed (they give the UNet's share of a generation)."""
    items = [("CUDA graph (UNet step)", "cuda_graphs")]
    dtype = study.profile.dtype
    if dtype != "float32":
        items = [(f"{dtype} eager", f"precision:{dtype}"),
                 (f"{dtype} + CUDA graph (UNet step)", f"precision:{dtype}+cuda_graphs")]
    return run_variants(study, items, say=say)


def unet_share(cmp: Comparison) -> pd.DataFrame:
    """The baseline's UNet share of a generation: the ceiling for anything that only speeds up the UNet step."""
    b = cmp.measured.row(BASELINE)
    unet_s = b["unet_step_s"] * b["iterations"]
    return pd.DataFrame([{"latency_s": b["latency_s"], "unet_step_s": b["unet_step_s"],
                          "iterations": int(b["iterations"]), "unet_s": unet_s,
                          "unet_share_percent": 100 * unet_s / b["latency_s"],
                          "ceiling_speedup_if_unet_were_free": b["latency_s"] / (b["latency_s"] - unet_s),
                          "method": cmp.method}])


def step_inputs(pipe, workload) -> tuple[tuple, dict]:
    return capture_block_inputs(pipe, workload, block="")


def smallest_latent(unet) -> int:
    """The smallest latent side the UNet accepts: each down block but the last halves it."""
    return 2 ** (len(unet.config.block_out_channels) - 1)


def _step(unet, args, kwargs):
    with torch.inference_mode():
        return unet(*args, **kwargs)


@dataclass
class HostSplit:
    """Per UNet step, from the profiler (times in seconds, counts per step)."""

    profiled_step_s: float  # means over the profiled steps, so the parts add up
    python_s: float  # outside every ATen operator
    aten_self_s: float  # inside ATen operators, self time summed
    math_s: float  # inside the FLOP-heavy operators, inclusive
    aten_calls: float  # every dispatcher entry
    leaf_calls: float  # ATen calls with no ATen call inside: the ones that do the work (views included)
    math_calls: float
    device_kernels: float | None  # CUDA kernels launched (None on a CPU)

    @property
    def host_upper_s(self) -> float:
        return self.profiled_step_s - self.math_s


def _outermost_math(e) -> bool:
    if e.name not in MATH_OPS:
        return False
    p = e.cpu_parent
    while p is not None:
        if p.name in MATH_OPS:
            return False
        p = p.cpu_parent
    return True


def profile_steps(unet, args, kwargs, device: str, steps: int) -> HostSplit:
    """Profile `steps` UNet calls (warm already) with CPU activities and split each step's time."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            with record_function(STEP):
                _step(unet, args, kwargs)
                synchronize(device)
    events = prof.events()
    ranges = [e for e in events if e.name == STEP]
    aten = [e for e in events if e.name.startswith("aten::")]
    leaves = [e for e in aten if not any(c.name.startswith("aten::") for c in e.cpu_children)]
    math = [e for e in aten if _outermost_math(e)]
    kernels = None
    if device == "cuda":
        kernels = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in events) / steps
    per_step = 1e-6 / steps  # profiler times are microseconds; every figure is a mean over the profiled steps
    return HostSplit(profiled_step_s=sum(e.cpu_time_total for e in ranges) * per_step,
                     python_s=sum(e.self_cpu_time_total for e in ranges) * per_step,
                     aten_self_s=sum(e.self_cpu_time_total for e in aten) * per_step,
                     math_s=sum(e.cpu_time_total for e in math) * per_step,
                     aten_calls=len(aten) / steps, leaf_calls=len(leaves) / steps, math_calls=len(math) / steps,
                     device_kernels=kernels)


@dataclass
class HostOverhead:
    latent: int
    batch: int
    step: Timing  # unprofiled UNet step
    split: HostSplit
    tiny_latent: int
    tiny_step: Timing  # unprofiled UNet step at the smallest latent

    def table(self) -> pd.DataFrame:
        s, t = self.split, self.split.profiled_step_s
        rows = [("UNet step (unprofiled, median)", self.step.median, None),
                ("UNet step under the profiler", t, 100.0),
                ("math operators (conv / matmul / attention)", s.math_s, 100 * s.math_s / t),
                ("host work, upper bound: everything outside math operators", s.host_upper_s, 100 * s.host_upper_s / t),
                ("host work, lower bound: outside every ATen operator (Python)", s.python_s, 100 * s.python_s / t),
                (f"independent: whole UNet step at latent {self.tiny_latent}x{self.tiny_latent}",
                 self.tiny_step.median, None)]
        return pd.DataFrame(rows, columns=["quantity", "seconds_per_step", "percent_of_profiled_step"])

    def counts(self) -> pd.DataFrame:
        s = self.split
        rows = [("ATen operator calls (dispatcher entries)", s.aten_calls),
                ("ATen leaf calls (no ATen call inside: the ones that do the work, views included)", s.leaf_calls),
                ("math operator calls", s.math_calls)]
        if s.device_kernels is not None:
            rows.append(("CUDA kernels launched", s.device_kernels))
        return pd.DataFrame(rows, columns=["per UNet step", "count"])


def host_overhead(study: Study, batch_size: int = 1) -> HostOverhead:
    """Time one real UNet step, profile it, and time the same step at the smallest latent."""
    p = study.profile
    pipe = study.pipeline("float32")
    workload = study.workload(batch_size)
    args, kwargs = step_inputs(pipe, workload)
    unet = pipe.unet
    step = measure(lambda: _step(unet, args, kwargs), device=study.device, warmup=p.warmup, repeats=p.repeats)
    split = profile_steps(unet, args, kwargs, study.device, p.repeats)
    side = smallest_latent(unet)
    tiny = torch.randn(*args[0].shape[:2], side, side, generator=torch.Generator().manual_seed(p.seed))
    tiny_args = (tiny.to(args[0].device, args[0].dtype),) + tuple(args[1:])
    tiny_step = measure(lambda: _step(unet, tiny_args, kwargs), device=study.device, warmup=p.warmup, repeats=p.repeats)
    out = HostOverhead(latent=args[0].shape[-1], batch=args[0].shape[0], step=step, split=split,
                       tiny_latent=side, tiny_step=tiny_step)
    pipe = unet = None
    release()
    _record(study, out)
    return out


STEP_METHOD = "in process: one UNet call on the guidance batch timed call by call; median with p10/p90 of the repeats"
PROFILE_METHOD = ("torch.profiler (CPU activities) over the repeats' UNet calls: operator times and calls, mean per "
                  "step; math = outermost conv / matmul / attention operators")


def _record(study: Study, h: HostOverhead) -> None:
    rec, s = study.recorder, h.split
    scen = f"fp32 eager UNet step, latent {h.latent}x{h.latent}, UNet batch {h.batch}"
    rec.timing(scen, h.step, metric="unet_step", dtype="float32", method=STEP_METHOD)
    rows = [("profiled_step", s.profiled_step_s, "s", f"profiler overhead x{s.profiled_step_s / h.step.median:.2f}"),
            ("math_op_time", s.math_s, "s", "inclusive time of the outermost conv / matmul / attention operators"),
            ("host_upper", s.host_upper_s, "s", "profiled step minus math operators: upper bound of the host work"),
            ("host_lower_python", s.python_s, "s", "time outside every ATen operator: lower bound of the host work"),
            ("host_share_upper", 100 * s.host_upper_s / s.profiled_step_s, "%",
             "of a CPU step; on a GPU the same seconds are a larger share (math is faster there)"),
            ("host_share_lower_python", 100 * s.python_s / s.profiled_step_s, "%", "of a CPU step"),
            ("aten_calls_per_step", s.aten_calls, "calls", "dispatcher entries per UNet step"),
            ("aten_leaf_calls_per_step", s.leaf_calls, "calls",
             "ATen calls with no ATen call inside; a GPU launches at most one kernel for each"),
            ("math_calls_per_step", s.math_calls, "calls", "outermost conv / matmul / attention calls")]
    if s.device_kernels is not None:
        rows.append(("cuda_kernels_per_step", s.device_kernels, "kernels", "CUDA kernel events per step"))
    rec.add_many([dict(scenario=scen, metric=m, value=v, unit=u, n=study.profile.repeats, dtype="float32",
                       method=PROFILE_METHOD, note=n) for m, v, u, n in rows])
    rec.timing(f"fp32 eager UNet step, latent {h.tiny_latent}x{h.tiny_latent} (smallest), UNet batch {h.batch}",
               h.tiny_step, metric="unet_step", dtype="float32", method=STEP_METHOD)


def plot(study: Study, h: HostOverhead):
    """Where a UNet step's time goes on this device, beside the whole step at the smallest latent."""
    s = h.split
    other_aten = max(s.host_upper_s - s.python_s, 0.0)
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    parts = [("math operators", s.math_s), ("other ATen (dispatch, views, norms, elementwise)", other_aten),
             ("outside ATen (Python)", s.python_s)]
    left = 0.0
    for (label, v), color in zip(parts, plt.cm.tab10.colors):
        ax.barh([f"latent {h.latent}"], [v], left=left, color=color, label=label)
        left += v
    t = h.tiny_step
    ax.barh([f"latent {h.tiny_latent}\n(whole step)"], [t.median], color=plt.cm.tab10.colors[3],
            xerr=[[t.median - min(t.times)], [max(t.times) - t.median]], capsize=3,
            label="whole step at the smallest latent (median, bar: min-max)")
    ax.set(xlabel="seconds per UNet step", title=f"UNet step split, batch {h.batch} ({study.device})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    p = study.profile
    study.save_figure(fig, "host_split",
                      what=f"One fp32 eager UNet step at latent {h.latent}x{h.latent} (UNet batch {h.batch}, "
                      "the guidance batch) split into math operators (conv, matmul, attention), other ATen work and "
                      "time outside every ATen operator (Python), beside a whole step at the smallest latent "
                      f"{h.tiny_latent}x{h.tiny_latent}: the host-side share CUDA graphs would remove",
                      baseline=figure_captions.NO_BASELINE + " (seconds per step)",
                      method="in this notebook's process: the split is torch.profiler's mean over the profiled "
                      f"steps (CPU activities); the smallest-latent step is timed unprofiled after {p.warmup} "
                      "warm-up call(s)",
                      n=f"{p.repeats} profiled steps; {len(t.times)} timed steps at the smallest latent")
    return fig


def published_vs_measured(study: Study, h: HostOverhead) -> pd.DataFrame:
    """The seed's claim has no figure; what is measured here is the most a replay could remove."""
    return pd.DataFrame([published_row(
        "CUDA graphs remove per-kernel launch and Python overhead",
        published.cite("Cerebrium SD ladder") + ", closing suggestion", "NVIDIA A10G", "no figure published", None,
        100 * h.split.host_upper_s / h.split.profiled_step_s,
        study.conditions(scope=f"one UNet step, upper bound of the host share, latent {h.latent}"), unit="%",
        detail="'capture the graph operations and replay it at once' (qualitative)")])


def explain(study: Study, h: HostOverhead) -> str:
    """What the measured bounds say about graphs on this device, in words built from the numbers."""
    s = h.split
    lo, hi = 100 * s.python_s / s.profiled_step_s, 100 * s.host_upper_s / s.profiled_step_s
    lines = [f"Host work per UNet step (batch {h.batch}, latent {h.latent}): between {s.python_s:.4f} s (Python "
             f"alone) and {s.host_upper_s:.4f} s (everything outside the math operators), {lo:.1f}-{hi:.1f}% of "
             f"the profiled step; {s.aten_calls:.0f} operator calls, {s.leaf_calls:.0f} of them leaf calls, "
             f"which one graph replay issues as a single launch.",
             f"Independent estimate: the whole step at latent {h.tiny_latent}x{h.tiny_latent} takes "
             f"{h.tiny_step.median:.4f} s here (math small but not zero), against {h.step.median:.4f} s at "
             f"latent {h.latent}."]
    if study.device == "cuda":
        lines.append("On this GPU the graphed variants above measure the gain itself; these figures say how "
                     "much host work each eager step issued.")
    else:
        lines.append("On this CPU the operators' arithmetic runs on the same cores as the host work, so these "
                     "shares are not what a GPU would gain: there the math is faster and the same host seconds "
                     "weigh more. The seconds bound what a replay removes per step only where the GPU waits "
                     "for the host; a GPU busier than its host gains less.")
    return "\n".join(lines)
