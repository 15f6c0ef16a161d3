"""Achieved FLOP/s against this device's measured matmul peak, so a latency also says how close to the roof it is."""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from sdperf.timing import Timing, blocked


def count_flops(fn, *args, **kwargs) -> int:
    """FLOPs of one call (multiply-add = 2 FLOPs), counted by torch.utils.flop_counter on the real shapes."""
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


def matmul_peak(device: str, dtype: torch.dtype, size: int, min_run_time: float = 1.0) -> tuple[float, Timing]:
    """Measured FLOP/s of a square size x size matmul in `dtype`: the practical roof for dense layers."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    timing = blocked(lambda: torch.mm(a, b, out=out), device=device, min_run_time=min_run_time)
    return 2 * size**3 / timing.median, timing


def achieved(flops: int, seconds: float, peak_flops_per_s: float) -> dict:
    rate = flops / seconds
    return {"achieved_gflops": rate / 1e9, "percent_of_peak": 100.0 * rate / peak_flops_per_s}
