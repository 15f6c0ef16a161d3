"""int8: the one precision that can beat fp32 on a CPU without AMX, when the CPU has int8 dot-product instructions.

AVX-512 VNNI and AMX-INT8 multiply-accumulate four int8 pairs per lane per instruction, so an int8 matmul can run
several times faster than fp32; AVX2 has a slower int8 path (vpmaddubsw). Which kernel a scheme reaches decides:

- torch.ao `quantize_dynamic`: nn.Linear int8 weights, activations quantized per call (fbgemm / oneDNN); the
  convolutions stay fp32. Deprecated in favour of torchao (the warning is recorded with the result).
- torchao `Int8DynamicActivationInt8WeightConfig`: its matmul is `torch._int_mm`: oneDNN on a CPU only with
  AVX512-VNNI (else a reference loop), cuBLASLt int8 on CUDA.
- OpenVINO + NNCF: the UNet as OpenVINO IR; `nncf.compress_weights` (int8 weights, fp32 compute), `nncf.quantize`
  (int8 weights and activations) or optimum-intel's hybrid mode, calibrated on one generation per caption.

With random-init weights the error figures describe the quantization machinery, not a quantized Stable Diffusion.
"""
from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
import logging
import warnings
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from sdperf.core.environment import cpu_isa
from sdperf.model.generation import Workload, generate
from sdperf.optimizations import openvino_engine
from sdperf.optimizations.catalog import EXECUTOR, Technique

# What the field uses when plain PTQ of the SD UNet costs quality (Technique.fallbacks)
PTQ_ALTERNATIVES = ("int8:openvino-nncf-hybrid", "int8:openvino-nncf-ptq-sq", "int8:openvino-nncf-ptq-wide",
                    "int8:openvino-nncf-ptq-mixed")
SMOOTH_QUANT_ALPHAS = {"matmul": 0.5, "convolution": 0.05}
SMOOTHING_SUFFIX = "/nncf_smooth_quant"  # how NNCF names the scale it inserts before a smoothed layer
WIDE_PER_CAPTION = 4  # UNet calls per caption in the many-caption calibration (trajectory's ends and two between)
# The most UNet calls a calibration set holds, in whole trajectories: nncf.quantize's default subset_size
CALIBRATION_SAMPLES = 300
# CPU instructions that give torch._int_mm its oneDNN path; without them PyTorch runs a scalar loop
INT_MM_CPU_FLAGS = ("avx512_vnni", "amx_int8")
# The int8 dot-product instructions OpenVINO's and fbgemm's kernels use when present
INT8_CPU_FLAGS = ("avx512_vnni", "amx_int8", "avx_vnni")
# The measured roofs (08's int8_roofs rows) of torch's int8 kernels; OpenVINO's are openvino_engine.ROOFS
INT_MM, LINEAR_DYNAMIC = "torch._int_mm", "quantized linear_dynamic"


@dataclass(frozen=True)
class Scheme:
    """One int8 scheme, the source of its catalog entry (int8:<name>). `quantize(pipe, workload, name, ...)` returns
    the quantized UNet; an OpenVINO scheme's `nncf(model, data, subset_size)` is its NNCF step, fed real UNet inputs
    when `calibrated` (`per_caption` calls of each generation, else all)."""

    name: str
    label: str
    note: str
    quantize: Callable
    availability: Callable[[str], tuple[bool, str]]
    roof_kernel: str
    packages: tuple[str, ...] = ()
    extra_copies: dict = field(default_factory=dict, hash=False)
    traces_unet: bool = False
    linear_only: bool = False
    nncf: Callable | None = None
    nncf_step: str = ""
    calibrated: bool = False
    per_caption: int | None = None
    fallbacks: tuple[str, ...] = ()


def check_scheme(scheme: str) -> Scheme:
    """The record of `scheme`; an unknown name is a ValueError that names the valid ones."""
    if scheme not in SCHEMES:
        raise ValueError(f"quantization scheme {scheme!r} is not valid; choose one of: {', '.join(SCHEMES)}")
    return SCHEMES[scheme]


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def int8_cpu_flags() -> list[str]:
    isa = cpu_isa()
    return [f for f in INT8_CPU_FLAGS if isa.get(f)]


def native_int_mm(device: str) -> bool:
    """Whether torch._int_mm has a fast kernel here (cuBLASLt on CUDA, oneDNN with VNNI/AMX on a CPU)."""
    if device == "cuda":
        return True
    isa = cpu_isa()
    return any(isa.get(f) for f in INT_MM_CPU_FLAGS)


def _cpu_int8_words() -> str:
    flags = int8_cpu_flags()
    if flags:
        return f"int8 dot-product instructions {', '.join(flags)}"
    return "no VNNI/AMX int8 instructions" + (": AVX2 int8 (vpmaddubsw)" if cpu_isa().get("avx2") else "")


def availability(device: str, scheme: str) -> tuple[bool, str]:
    """Whether the scheme can run on `device` with what is installed, and which int8 path it would take."""
    return check_scheme(scheme).availability(device)


def _torch_ao_availability(device: str) -> tuple[bool, str]:
    if device == "cuda":
        return False, "torch.ao dynamic quantization has CPU kernels only (fbgemm/oneDNN); torchao is the CUDA path"
    quant = getattr(torch.ao, "quantization", None)
    if quant is None or not hasattr(quant, "quantize_dynamic"):
        return False, f"torch.ao.quantization.quantize_dynamic is gone from torch {torch.__version__}"
    return True, f"quantized engine {torch.backends.quantized.engine!r}; {_cpu_int8_words()}"


def _torchao_availability(device: str) -> tuple[bool, str]:
    if not installed("torchao"):
        return False, "torchao is not installed"
    if device == "cuda":
        return True, "int8 tensor-core matmuls through torch._int_mm (cuBLASLt)"
    if native_int_mm(device):
        return True, f"torch._int_mm runs through oneDNN with {', '.join(int8_cpu_flags())}"
    return True, ("runs, but torch._int_mm has no fast CPU kernel without AVX512-VNNI/AMX-INT8 (a scalar "
                  "reference loop runs instead): expect it far slower than fp32")


def _openvino_availability(device: str) -> tuple[bool, str]:
    if device != "cpu":
        return False, f"OpenVINO runs on CPUs (and Intel GPUs); this profile's device is {device}"
    for module in ("openvino", "nncf"):
        if not installed(module):
            return False, f"{module} is not installed"
    return True, f"OpenVINO CPU plugin int8 kernels; {_cpu_int8_words()}"


def apply(pipe, scheme: str, workload: Workload | None = None, scratch_root=None, prompts: tuple[str, ...] = (),
          limit: int = CALIBRATION_SAMPLES):
    """Quantize the pipeline's UNet with `scheme`. The OpenVINO schemes need the workload (the IR's shapes; the
    calibrated ones generate it once per caption of `prompts`, at most `limit` UNet calls)."""
    pipe.unet = check_scheme(scheme).quantize(pipe, workload, scheme, scratch_root=scratch_root, prompts=prompts,
                                              limit=limit)
    return pipe


def _modules(quantize):
    """A scheme that swaps or rewrites the UNet's modules in place: no workload, no calibration."""
    return lambda pipe, workload, scheme, **_: quantize(pipe.unet)


def torch_ao_dynamic(unet):
    """nn.Linear -> DynamicQuantizedLinear (qint8) in place; torch's warnings are kept on `sdperf_warnings`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unet = torch.ao.quantization.quantize_dynamic(unet, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    unet.sdperf_warnings = sorted({str(w.message).strip().splitlines()[0] for w in caught
                                   if issubclass(w.category, (DeprecationWarning, FutureWarning, UserWarning))})
    return unet


def torchao_int8_dynamic(unet):
    """torchao's documented API: quantize_(model, Int8DynamicActivationInt8WeightConfig()) on every nn.Linear."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(unet, Int8DynamicActivationInt8WeightConfig())
    return unet


def module_counts(unet) -> dict:
    """How many layers each scheme can touch, and how many it did (what a quantized UNet is made of)."""
    kinds: dict[str, int] = {}
    for m in unet.modules():
        name = m._get_name()  # torch.ao's quantized modules name themselves (class Linear -> DynamicQuantizedLinear)
        if name not in ("Linear", "Conv2d", "DynamicQuantizedLinear"):
            continue
        if name == "Linear" and type(m.weight).__name__ not in ("Parameter", "Tensor"):
            name = f"Linear with {type(m.weight).__name__} weight"  # torchao swaps the weight, not the module
        kinds[name] = kinds.get(name, 0) + 1
    return kinds


def unet_inputs(pipe, workload: Workload) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(sample, timestep, text embeddings) of every UNet call of one generation, without the VAE decode."""
    seen = []

    def hook(_module, args, kwargs):
        sample, t = args[0], args[1]
        seen.append((sample.detach().clone(), torch.as_tensor(t, dtype=torch.float32).reshape(()).clone(),
                     kwargs["encoder_hidden_states"].detach().clone()))

    handle = pipe.unet.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        generate(pipe, workload, decode_images=False)
    finally:
        handle.remove()
    return seen


def calibration_captions(prompts, workload: Workload) -> tuple[str, ...]:
    """The captions a calibrated scheme generates from: the given ones, or the workload's prompt when none are."""
    if isinstance(prompts, str):  # a lone string would be calibrated on character by character
        raise TypeError(f"calibration prompts must be a sequence of captions, not the string {prompts!r}")
    captions = tuple(prompts) or (workload.prompt,)
    bad = [c for c in captions if not isinstance(c, str) or not c.strip()]
    if bad:
        raise ValueError(f"calibration captions must be non-empty strings; got {bad!r}")
    return captions


def captions_digest(captions: tuple[str, ...]) -> str:
    """A short hash of the calibration captions, in order: part of a calibrated IR's cache key."""
    return hashlib.sha256(json.dumps(list(captions)).encode()).hexdigest()[:16]


def spread(calls: list, k: int | None) -> list:
    """`k` of a trajectory's calls evenly spaced, first and last included (all when k is None or covers them)."""
    if k is None or k >= len(calls):
        return list(calls)
    if k < 2:
        raise ValueError(f"calls per caption must be at least 2 (the trajectory's ends), got {k!r}")
    picks = sorted({round(i * (len(calls) - 1) / (k - 1)) for i in range(k)})
    return [calls[i] for i in picks]


def calibration_set(pipe, workload: Workload, prompts=(), limit: int = CALIBRATION_SAMPLES,
                    per_caption: int | None = None) -> tuple[list, int]:
    """(UNet inputs, captions used): one generation per caption, as many as fit in `limit` samples (at least one).
    Whole trajectories, or `per_caption` calls spread over each so the same samples cover more captions."""
    if limit < 1:
        raise ValueError(f"calibration limit must be a positive number of UNet calls, got {limit!r}")
    captions = calibration_captions(prompts, workload)
    samples = spread(unet_inputs(pipe, replace(workload, prompt=captions[0])), per_caption)
    used = max(1, min(len(captions), limit // len(samples)))
    for caption in captions[1:used]:
        samples += spread(unet_inputs(pipe, replace(workload, prompt=caption)), per_caption)
    return samples, used


def _const_source(op, port: int) -> bool:
    """Whether input `port` of `op` comes from a constant through Convert, FakeQuantize and Reshape only (as
    optimum-intel's _get_operation_const_op reads a layer as weighted)."""
    node = op.input_value(port).get_node()
    while node.get_type_name() in ("Convert", "FakeQuantize", "Reshape"):
        node = node.input_value(0).get_node()
    return node.get_type_name() == "Constant"


def weighted_ops(model) -> list[str]:
    """The MatMuls with a constant operand and the embedding Gathers: what the hybrid recipe compresses only."""
    out = []
    for op in model.get_ops():
        kind = op.get_type_name()
        if kind == "MatMul" and (_const_source(op, 0) or _const_source(op, 1)):
            out.append(op.get_friendly_name())
        elif kind == "Gather" and op.input_value(0).get_element_type().is_real() and _const_source(op, 0):
            out.append(op.get_friendly_name())
    return out


CONVOLUTIONS = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData")


def hybrid_quantize(model, data, subset_size: int):
    """NNCF's hybrid mode as optimum-intel's _hybrid_quantization runs it: int8 asymmetric compression of every
    weight but the convolutions', then nncf.quantize of the rest with the weighted matmuls ignored (already int8)
    and SmoothQuant off for matmuls (it would rescale compressed weights)."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    weighted = weighted_ops(model)  # read before compression: names survive it, constants do not
    present = {op.get_type_name() for op in model.get_ops()}
    convs = [t for t in CONVOLUTIONS if t in present]  # an ignored type absent from the model is an NNCF error
    model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM,
                                  ignored_scope=nncf.IgnoredScope(types=convs))
    return nncf.quantize(model, data, model_type=nncf.ModelType.TRANSFORMER, subset_size=subset_size,
                         ignored_scope=nncf.IgnoredScope(names=weighted),
                         advanced_parameters=AdvancedQuantizationParameters(
                             smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=-1)))


ATTENTION = "ScaledDotProductAttention"  # the op OpenVINO converts torch's SDPA into (query x key, scores x value)


def sensitive_ops(model) -> tuple[list[str], list[str]]:
    """(names, types) the mixed scheme keeps in float: the first and last convolutions and attention's products of
    two activations (ScaledDotProductAttention, or such MatMuls), the layers Q-Diffusion and PTQ4DM find sensitive.
    Read before quantization: afterwards an int8 weight reaches its MatMul through a Multiply."""
    ordered = model.get_ordered_ops()
    convs = [op.get_friendly_name() for op in ordered if op.get_type_name() in CONVOLUTIONS]
    pairs = [op.get_friendly_name() for op in ordered if op.get_type_name() == "MatMul"
             and not (_const_source(op, 0) or _const_source(op, 1))]
    types = [ATTENTION] if any(op.get_type_name() == ATTENTION for op in ordered) else []  # absent: an NNCF error
    return list(dict.fromkeys(convs[:1] + convs[-1:] + pairs)), types


def ptq(model, data, subset_size: int, **kwargs):
    """nncf.quantize (TRANSFORMER model type); `kwargs` are what an alternative changes."""
    import nncf

    return nncf.quantize(model, data, model_type=nncf.ModelType.TRANSFORMER, subset_size=subset_size, **kwargs)


def ptq_smoothed(model, data, subset_size: int):
    """PTQ with SmoothQuant at SMOOTH_QUANT_ALPHAS: activation outliers moved into the weights before rounding."""
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    return ptq(model, data, subset_size, advanced_parameters=AdvancedQuantizationParameters(
        smooth_quant_alphas=AdvancedSmoothQuantParameters(**SMOOTH_QUANT_ALPHAS)))


def ptq_mixed(model, data, subset_size: int):
    """PTQ with the sensitive layers (sensitive_ops) kept in float."""
    import nncf

    names, types = sensitive_ops(model)
    return ptq(model, data, subset_size, ignored_scope=nncf.IgnoredScope(names=names, types=types))


def compress_weights(model, _data, _subset_size: int):
    """nncf.compress_weights: int8 weights, no calibration data."""
    import nncf

    return nncf.compress_weights(model)


def int8_census(model) -> dict:
    """What NNCF left in the IR: FakeQuantize nodes, int8/u8 constants and SmoothQuant scales."""
    ops = model.get_ops()
    types = collections.Counter(op.get_type_name() for op in ops)
    int8 = sum(op.get_type_name() == "Constant" and op.get_element_type().get_type_name() in ("i8", "u8")
               for op in ops)
    smoothing = sum(op.get_friendly_name().endswith(SMOOTHING_SUFFIX) for op in ops)
    return {"fake_quantize_nodes": types["FakeQuantize"], "int8_constants": int8, "smooth_quant_scales": smoothing}


def openvino_nncf(pipe, workload: Workload, scheme: str, scratch_root=None, prompts=(),
                  limit: int = CALIBRATION_SAMPLES):
    """The UNet converted, run through the scheme's NNCF step and compiled in f32 at the workload's static shapes,
    behind the loop's UNet call (unet_graph.EngineUNet). With `scratch_root` the IR is cached, keyed by the
    calibration captions and `limit` too."""
    s = SCHEMES.get(scheme)
    if s is None or s.nncf is None:
        valid = [n for n, r in SCHEMES.items() if r.nncf is not None]
        raise ValueError(f"scheme {scheme!r} is not an OpenVINO scheme; choose one of: {', '.join(valid)}")
    if workload is None:
        raise ValueError(f"scheme {scheme!r} needs the workload (static shapes and calibration inputs)")
    import nncf

    from sdperf.optimizations.unet_graph import INPUTS, EngineUNet, float32_unet, graph_inputs

    nncf.set_log_level(logging.WARNING)
    captions = calibration_captions(prompts, workload) if s.calibrated else (workload.prompt,)
    seen: dict = {}

    def calibration() -> tuple[list[dict], int]:
        if "inputs" not in seen:
            samples, used = calibration_set(pipe, workload, captions, limit=limit, per_caption=s.per_caption)
            seen.update(inputs=[graph_inputs(*inputs, {}) for inputs in samples], captions=used)
        return seen["inputs"], seen["captions"]

    def transform(model):  # NNCF's progress bars ask for ipywidgets in a notebook: filtered in sdperf.core.quiet
        feeds, n_captions = calibration() if s.calibrated else ([], 0)
        data = nncf.Dataset([{k: v.numpy() for k, v in f.items()} for f in feeds]) if feeds else None
        model = s.nncf(model, data, len(feeds))
        return model, {"calibration_captions": n_captions, "calibration_inputs": len(feeds), **int8_census(model)}

    key = {"workload": repr(workload), "scheduler": scheduler_identity(pipe.scheduler), "scheme": scheme,
           "nncf": nncf.__version__}
    if s.calibrated:
        key["calibration"] = {"captions": captions_digest(captions), "limit": limit}
        if s.per_caption is not None:
            key["calibration"]["per_caption"] = s.per_caption
    model, facts, cache_dir = openvino_engine.ir_model(
        float32_unet(pipe.unet), lambda: tuple(calibration()[0][0][k] for k in INPUTS), scratch_root,
        kind=f"nncf-{scheme.removeprefix('openvino-nncf-')}", transform=transform, key=key)
    shapes = static_shapes(pipe, workload)
    if "inputs" in seen:  # calibrated in this process: the loop's real shapes must be the ones compiled for
        real = {k: tuple(v.shape) for k, v in seen["inputs"][0].items()}
        if real != shapes:
            raise RuntimeError(f"UNet call shapes {real} differ from the static shapes {shapes}")
    compiled, used = openvino_engine.compile_model(model, "f32", shapes, cache_dir)
    request = compiled.create_infer_request()

    def run(feeds: dict) -> torch.Tensor:
        out = request.infer({k: v.numpy() for k, v in feeds.items()}, share_inputs=True, share_outputs=False)
        return torch.from_numpy(out[0])

    facts.update({"engine": "openvino + nncf", "nncf": nncf.__version__, "precision": used,
                  "nncf_step": s.nncf_step})
    return EngineUNet(run, pipe.unet.config, device="cpu", facts=facts, keep=(pipe.unet, model))


def scheduler_identity(scheduler) -> dict:
    """The scheduler's part of a quantized IR's cache key: its class and public config (diffusers'
    `_use_default_values` is in set order, which changes with the hash seed between processes)."""
    config = {k: v for k, v in dict(scheduler.config).items() if not k.startswith("_")}
    return {"class": type(scheduler).__name__, **config}


def static_shapes(pipe, workload: Workload) -> dict:
    """The static shapes of the loop's UNet calls (the pipeline pads prompts to the tokenizer's maximum length)."""
    b = workload.batch_size * (2 if workload.guidance_scale > 1.0 else 1)
    f, cfg = pipe.vae_scale_factor, pipe.unet.config
    return {"sample": (b, cfg.in_channels, workload.height // f, workload.width // f), "timestep": (),
            "encoder_hidden_states": (b, pipe.tokenizer.model_max_length, cfg.cross_attention_dim)}


NOTEBOOK = "08_quantization"
TRANSFER = ("may not transfer",
            "quantization error depends on the ranges of weights and activations; a 4M-parameter UNet on 32 px "
            "images shares neither with SD 1.5's 860M; HF/Intel report plain PTQ does not work for SD 1.5's UNet")


def _quantized(scheme: str):
    def run(pipe, ctx):
        pipe = apply(pipe, scheme, workload=ctx.workload(), scratch_root=ctx.artefacts, prompts=ctx.prompts,
                     limit=ctx.calibration_samples or CALIBRATION_SAMPLES)
        unet = pipe.unet
        if not isinstance(unet, torch.nn.Module):  # an engine stand-in (EngineUNet) says how it was made
            ctx.facts.update(unet.facts)
        else:
            ctx.facts.update(module_counts(unet))
            warned = getattr(unet, "sdperf_warnings", [])
            if warned:
                ctx.facts["warnings"] = " | ".join(warned)
        return pipe
    return run


def _openvino(name: str, label: str, note: str, nncf, nncf_step: str, roof_kernel: str = openvino_engine.ROOFS["int8"],
              calibrated: bool = True, **kw) -> Scheme:
    """A scheme openvino_nncf runs (an IR and its engine beside the eager UNet), roofed by the u8 x s8 GEMM."""
    return Scheme(name, label, note, openvino_nncf, _openvino_availability, roof_kernel, packages=("openvino", "nncf"),
                  extra_copies={"unet": 2}, traces_unet=True, nncf=nncf, nncf_step=nncf_step, calibrated=calibrated,
                  **kw)


SCHEMES = {s.name: s for s in (
    Scheme("torch-ao-dynamic", "torch.ao dynamic int8 (Linear)",
           "torch.ao quantize_dynamic: nn.Linear int8 weights, int8 activations per call (fbgemm/oneDNN)",
           _modules(torch_ao_dynamic), _torch_ao_availability, LINEAR_DYNAMIC, linear_only=True),
    Scheme("torchao-int8-dynamic", "torchao int8 dyn. (Linear)",
           "torchao Int8DynamicActivationInt8Weight: nn.Linear int8 weights and activations (torch._int_mm)",
           _modules(torchao_int8_dynamic), _torchao_availability, INT_MM, packages=("torchao",), linear_only=True),
    # the plugin decompresses the int8 weights to f32 before each MatMul/convolution: it computes in f32
    _openvino("openvino-nncf-weights", "OpenVINO + NNCF int8 weights",
              "OpenVINO IR + nncf.compress_weights: int8 weights, fp32 compute", compress_weights, "compress_weights",
              roof_kernel=openvino_engine.ROOFS["f32"], calibrated=False),
    _openvino("openvino-nncf-ptq", "OpenVINO + NNCF int8 PTQ",
              "OpenVINO IR + nncf.quantize: int8 weights and activations of matmuls and convolutions, calibrated on "
              "one generation's UNet inputs per calibration caption", ptq, "quantize (post-training)",
              fallbacks=PTQ_ALTERNATIVES),
    # int8 x int8 convolutions and int8-weight matmuls: held against the faster (int8) roof
    _openvino("openvino-nncf-hybrid", "OpenVINO + NNCF hybrid int8",
              "OpenVINO IR + NNCF hybrid (optimum-intel's diffusion recipe): nncf.compress_weights int8 on all "
              "weights but the convolutions', then nncf.quantize of the convolutions (and attention inputs) with the "
              "weighted matmuls ignored, calibrated like the PTQ scheme", hybrid_quantize,
              "hybrid: compress_weights (convolutions ignored) + quantize (weighted matmuls ignored)"),
    _openvino("openvino-nncf-ptq-sq", "NNCF int8 PTQ, SmoothQuant 0.5",
              "the PTQ scheme with SmoothQuant at alpha 0.5 on the matmuls (the SmoothQuant paper's value; NNCF's "
              "default is 0.95) and on the convolutions at 0.05 (NNCF's own alpha for them, off by default): "
              "activation outliers moved into the weights before rounding", ptq_smoothed,
              "quantize (post-training), SmoothQuant alpha matmul 0.5, convolution 0.05"),
    _openvino("openvino-nncf-ptq-wide", "NNCF int8 PTQ, many captions",
              "the PTQ scheme calibrated on many captions: a few UNet calls spread over each caption's trajectory "
              "(first and last included) instead of whole trajectories of a few, in the same number of calls", ptq,
              f"quantize (post-training), calibrated on {WIDE_PER_CAPTION} calls per caption",
              per_caption=WIDE_PER_CAPTION),
    _openvino("openvino-nncf-ptq-mixed", "NNCF int8 PTQ, mixed",
              "the PTQ scheme keeping the layers post-training studies of diffusion UNets find sensitive in float: the "
              "first and last convolutions and attention's products of two activations (query x key, scores x value: "
              "OpenVINO's attention op, or such matmuls)", ptq_mixed,
              "quantize (post-training), first/last convolution and attention (activation x activation) ignored"),
)}


def techniques() -> list[Technique]:
    """int8:<scheme>: the UNet quantized by that scheme, its catalog entry built from its record (SCHEMES)."""
    return [Technique(f"int8:{s.name}", s.label, EXECUTOR, NOTEBOOK, transfer=TRANSFER, apply=_quantized(s.name),
                      availability=lambda ctx, s=s: s.availability(ctx.device), changes_output=True, loop_only=True,
                      note=s.note, fallbacks=s.fallbacks, calibrated=s.calibrated, traces_unet=s.traces_unet,
                      extra_copies=dict(s.extra_copies), packages=s.packages, roof_kernel=s.roof_kernel)
            for s in SCHEMES.values()]
