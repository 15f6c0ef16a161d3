"""Achieved FLOP/s against this device's measured matmul peak, so a latency also says how close to the roof it is."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from sdperf.measure.timing import Timing, blocked, synchronize

# torch's FLOP counter knows the CUDA attention kernels but not SDPA's CPU one: it would count every attention free
_CPU_SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
if _CPU_SDPA not in flop_counter.flop_registry and _CPU_SDPA.default not in flop_counter.flop_registry:
    @flop_counter.register_flop_formula(_CPU_SDPA)
    def _cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


# How each roofline figure was taken: the method column of its rows
ROOF_METHOD = ("one square matmul of the kernel the scenario names, on random inputs at the size shown: "
               "torch.utils.benchmark blocked_autorange median; 2 n^3 operations per call")
FLOP_METHOD = "torch.utils.flop_counter over one call at the real shapes (multiply-add = 2 FLOPs)"
ACHIEVED_METHOD = "counted FLOPs / measured median seconds per call, against the measured matmul roof"


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
    """The largest power-of-two fraction of `size` whose call should fit `call_budget_s` (scaled n^3 from `probe`)."""
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


# --- OpenVINO's own GEMM kernels ---------------------------------------------------------------------------
# An OpenVINO executor's roof is the CPU plugin's own kernel: a MatMul by a constant weight, which is what a UNet
# layer is to the plugin (a FullyConnected whose weights are repacked once, at compile time).
OPENVINO_PRECISIONS = ("f32", "bf16", "int8")
OPENVINO_CAPABILITY = {"f32": "FP32", "bf16": "BF16", "int8": "INT8"}  # the OPTIMIZATION_CAPABILITIES entry needed
# the runtime precisions the GEMM node may report for each (int8: u8 activations x s8 weights)
OPENVINO_RUNTIME = {"f32": ("f32",), "bf16": ("bf16",), "int8": ("u8", "i8")}
GEMM_LAYERS = ("FullyConnected", "MatMul")
LEVELS = 256  # FakeQuantize levels of both int8 inputs (u8 activations, s8 weights)
ACTIVATION_HIGH = 4.0  # the activation FakeQuantize's u8 range is [0, ACTIVATION_HIGH]; inputs are drawn in it


def check_openvino_precision(precision: str) -> None:
    if precision not in OPENVINO_PRECISIONS:
        raise ValueError(f"OpenVINO roof precision {precision!r} is not valid; choose one of: "
                         f"{', '.join(OPENVINO_PRECISIONS)}")


def openvino_availability(precision: str) -> tuple[bool, str]:
    """Whether OpenVINO's CPU plugin runs `precision` natively here (OPTIMIZATION_CAPABILITIES), and why not."""
    check_openvino_precision(precision)
    try:
        import openvino as ov
    except ImportError:
        return False, "the openvino package is not installed"
    caps = list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    need = OPENVINO_CAPABILITY[precision]
    if need not in caps:
        return False, f"OpenVINO's CPU plugin lists no {need} here (OPTIMIZATION_CAPABILITIES: {', '.join(caps)})"
    return True, f"openvino {ov.__version__}, CPU plugin"


def weight_scale(w: np.ndarray) -> float:
    """The symmetric s8 step of the weight FakeQuantize: max|w| / 127, so [-128, 127] steps cover every weight."""
    return float(np.abs(w).max()) / 127.0


def _fake_quantize(node, low: float, high: float):
    from openvino import opset13 as ops

    lo, hi = ops.constant(np.float32(low)), ops.constant(np.float32(high))
    return ops.fake_quantize(node, lo, hi, lo, hi, LEVELS)


def openvino_matmul_model(x: np.ndarray, w: np.ndarray, precision: str):
    """An OpenVINO model of input @ constant `w`; for int8 both inputs pass through FakeQuantize first, as in NNCF's
    quantized models (activation u8 [0, ACTIVATION_HIGH], weight symmetric s8), fused into the u8 x s8 kernel."""
    import openvino as ov
    from openvino import opset13 as ops

    check_openvino_precision(precision)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"MatMul shapes {x.shape} @ {w.shape} do not chain: need (m, k) @ (k, n)")
    param = ops.parameter(list(x.shape), ov.Type.f32, name="x")
    a, b = param, ops.constant(w.astype(np.float32))
    if precision == "int8":
        s = weight_scale(w)
        a, b = _fake_quantize(a, 0.0, ACTIVATION_HIGH), _fake_quantize(b, -128 * s, 127 * s)
    return ov.Model([ops.matmul(a, b, False, False)], [param], f"matmul_{precision}")


def gemm_kernel(compiled) -> dict:
    """What the plugin ran for the GEMM (the execution graph's rt_info): layer type, runtime precision, primitive."""
    nodes = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) in GEMM_LAYERS:
            nodes.append({k: info[k].astype(str) for k in ("layerType", "runtimePrecision", "primitiveType")})
    if len(nodes) != 1:
        raise RuntimeError(f"expected one MatMul/FullyConnected node in the compiled model, found {nodes}")
    n = nodes[0]
    return {"layer_type": n["layerType"], "runtime_precision": n["runtimePrecision"],
            "primitive_type": n["primitiveType"]}


@dataclass
class OpenVINOMatMul:
    """A compiled square MatMul with its infer request and preallocated input: one call is what the roof times."""

    precision: str
    x: np.ndarray
    w: np.ndarray
    compiled: object
    request: object
    inference_precision: str
    threads: int

    def __call__(self) -> np.ndarray:
        """One inference; the output array is the request's own buffer (no copy), valid until the next call."""
        return self.request.infer(share_outputs=True)[0]

    def kernel(self) -> dict:
        return gemm_kernel(self.compiled)


def openvino_matmul(size: int, precision: str, seed: int = 0) -> OpenVINOMatMul:
    """A size x size MatMul compiled as the engine compiles a UNet (openvino_engine.compile_model; int8 under the
    f32 hint, as the NNCF executor is). Inputs are random: activations in [0, ACTIVATION_HIGH), weights normal."""
    import openvino as ov

    from sdperf.optimizations.openvino_engine import compile_model

    check_openvino_precision(precision)
    if size < 1:
        raise ValueError(f"matmul size must be a positive integer, got {size!r}")
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, ACTIVATION_HIGH, (size, size)).astype(np.float32)
    w = rng.standard_normal((size, size)).astype(np.float32)
    compiled, used = compile_model(openvino_matmul_model(x, w, precision), "f32" if precision == "int8" else precision)
    request = compiled.create_infer_request()
    request.set_input_tensor(ov.Tensor(x, shared_memory=True))
    return OpenVINOMatMul(precision, x, w, compiled, request, used, torch.get_num_threads())


@dataclass
class OpenVINORoof:
    """Measured ops/s (multiply-add = 2) of OpenVINO's GEMM in one precision, with the kernel that ran."""

    precision: str
    size: int
    ops_per_s: float
    timing: Timing
    layer_type: str
    runtime_precision: str
    primitive_type: str
    inference_precision: str
    threads: int

    @property
    def gops(self) -> float:
        return self.ops_per_s / 1e9

    def note(self) -> str:
        return (f"OpenVINO CPU plugin {self.layer_type} {self.size}x{self.size} @ constant weight, runtime precision "
                f"{self.runtime_precision}, primitive {self.primitive_type}, inference precision hint "
                f"{self.inference_precision}, {self.threads} threads; blocked_autorange median of one infer call"
                + ("; the activation's u8 quantization included, as in a quantized UNet layer"
                   if self.precision == "int8" else ""))


def openvino_matmul_peak(size: int, precision: str, min_run_time: float = 1.0) -> OpenVINORoof:
    """OpenVINO's GEMM roof in `precision`, timed like torch.mm's; another precision's kernel is an error."""
    mm = openvino_matmul(size, precision)
    kernel = mm.kernel()
    if kernel["runtime_precision"] not in OPENVINO_RUNTIME[precision]:
        raise RuntimeError(f"OpenVINO ran the {precision} MatMul as {kernel['layer_type']} in "
                           f"{kernel['runtime_precision']} ({kernel['primitive_type']}), not in "
                           f"{'/'.join(OPENVINO_RUNTIME[precision])}")
    timing = blocked(mm, device="cpu", min_run_time=min_run_time)
    return OpenVINORoof(precision, size, 2 * size**3 / timing.median, timing, **kernel,
                        inference_precision=mm.inference_precision, threads=mm.threads)
