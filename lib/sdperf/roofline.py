"""Achieved FLOP/s against this device's measured matmul peak, so a latency also says how close to the roof it is."""
from __future__ import annotations

import time

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from sdperf.timing import Timing, blocked, synchronize

# torch's FLOP counter knows the CUDA attention kernels but not the CPU one that SDPA dispatches to here, so on a
# CPU it would count every attention as free and overstate nothing but understate the UNet's work.
_CPU_SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
if _CPU_SDPA not in flop_counter.flop_registry and _CPU_SDPA.default not in flop_counter.flop_registry:
    @flop_counter.register_flop_formula(_CPU_SDPA)
    def _cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops(fn, *args, **kwargs) -> int:
    """FLOPs of one call (multiply-add = 2 FLOPs), counted by torch.utils.flop_counter on the real shapes."""
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


def matmul_peak(device: str, dtype: torch.dtype, size: int, min_run_time: float = 1.0) -> tuple[float, Timing]:
    """Measured FLOP/s of a square size x size matmul in `dtype`: the practical roof for dense layers."""
    timing = blocked(matmul_call(device, dtype, size), device=device, min_run_time=min_run_time)
    return 2 * size**3 / timing.median, timing


def matmul_call(device: str, dtype: torch.dtype, size: int):
    """One size x size torch.mm in `dtype` on random inputs, into a preallocated output: what a roof times."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    return lambda: torch.mm(a, b, out=out)


def fit_size(fn_of_size, size: int, call_budget_s: float, device: str = "cpu", probe: int = 128) -> int:
    """The largest power-of-two fraction of `size` whose single call should fit `call_budget_s`, scaled
    (n^3) from one timed call at `probe`: a scalar fallback kernel at full size could take minutes."""
    fn = fn_of_size(probe)
    fn()
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    per = time.perf_counter() - t0
    n = size
    while n > probe and per * (n / probe) ** 3 > call_budget_s:
        n //= 2
    return n


def achieved(flops: int, seconds: float, peak_flops_per_s: float) -> dict:
    rate = flops / seconds
    return {"achieved_gflops": rate / 1e9, "percent_of_peak": 100.0 * rate / peak_flops_per_s}
