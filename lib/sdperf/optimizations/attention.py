"""Which kernel computes the UNet's attention: diffusers' classic processor, PyTorch's scaled_dot_product_attention
(SDPA) with the backend PyTorch picks, or one SDPA backend forced (math, flash, memory-efficient, cuDNN).

The classic processor (`AttnProcessor`) writes the whole tokens x tokens score matrix of every head to memory;
SDPA (`AttnProcessor2_0`, diffusers' default) picks a fused kernel by device, dtype and shape, and flash and
memory-efficient attention never materialise it. `enable_flash_sdp(True)` only allows flash (it is on by default);
`torch.nn.attention.sdpa_kernel` restricts the choice, which is how each backend is measured alone here. Sliced
attention (`enable_attention_slicing`) computes the classic path a few heads at a time to bound its memory.
"""
from __future__ import annotations

import functools
import warnings
from collections import Counter

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0
from torch.nn.attention import SDPBackend, sdpa_kernel

from sdperf.optimizations.catalog import ATTENTION, Technique

PROCESSORS = {"classic": AttnProcessor, "sdpa": AttnProcessor2_0}
BACKENDS = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
SLICE_SIZES = ("auto", "max")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PROBE_TOKENS = (64, 77)  # query tokens, and the text context length of the cross-attention keys


def _choice(kind: str, value, valid) -> None:
    if value not in valid:
        raise ValueError(f"{kind} {value!r} is not valid; choose one of: {', '.join(map(str, valid))}")


def attention_modules(module: torch.nn.Module) -> list[Attention]:
    return [m for m in module.modules() if isinstance(m, Attention)]


def head_shapes(unet: torch.nn.Module) -> list[tuple[int, int]]:
    """The distinct (heads, head size) pairs of the UNet's attention layers: what a kernel must support."""
    return sorted({(m.heads, m.to_q.out_features // m.heads) for m in attention_modules(unet)})


def unet_skeleton(unet_config: dict) -> torch.nn.Module:
    """The UNet on the meta device: its modules and processors without allocating a single weight."""
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        return UNet2DConditionModel(**unet_config)


def _probe(device: str, dtype: torch.dtype, backend: SDPBackend, heads: int, dim: int) -> str | None:
    """SDPA under one backend at a self- and a cross-attention shape: the error (and PyTorch's why), or None."""
    q_len, kv_len = PROBE_TOKENS
    q = torch.randn(2, heads, q_len, dim, device=device, dtype=dtype)
    for kv in (q, torch.randn(2, heads, kv_len, dim, device=device, dtype=dtype)):
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel(backend):
            warnings.simplefilter("always")
            try:
                F.scaled_dot_product_attention(q, kv, kv)
            except RuntimeError as exc:
                why = " ".join(dict.fromkeys(str(w.message).strip() for w in caught))
                return f"{str(exc).strip().splitlines()[0]}{' PyTorch says: ' + why if why else ''}"
    return None


def sdpa_availability(device: str, backend: str, dtype: str = "float32",
                      shapes: list[tuple[int, int]] | tuple = ((8, 40),)) -> tuple[bool, str]:
    """Whether one SDPA backend runs on this device and dtype at the UNet's head shapes, found by trying it."""
    _choice("SDPA backend", backend, BACKENDS)
    _choice("dtype", dtype, DTYPES)
    if device == "cuda" and not torch.cuda.is_available():
        return False, "CUDA is not available in this process"
    name = f"SDPBackend.{BACKENDS[backend].name}"
    for heads, dim in shapes:
        error = _probe(device, DTYPES[dtype], BACKENDS[backend], heads, dim)
        if error:
            return False, (f"{name} has no kernel in torch {torch.__version__.split('+')[0]} for {device} "
                           f"{dtype}, {heads} heads of size {dim}: {error}")
    return True, f"{name} runs on {device} {dtype} at head shapes {list(shapes)}"


def use_processor(pipe, name: str):
    """Set one attention processor on every attention layer of the UNet (only the UNet, like every attention
    technique here, so it changes only the denoising loop: catalog loop_only)."""
    _choice("attention processor", name, PROCESSORS)
    pipe.unet.set_attn_processor(PROCESSORS[name]())
    return pipe


def use_sdpa_backend(pipe, backend: str):
    """Run every UNet call inside `sdpa_kernel(backend)`, through the instance's forward (pipe.unet stays the same
    module); the VAE and text encoder keep PyTorch's choice (some backends cannot take their shapes)."""
    _choice("SDPA backend", backend, BACKENDS)
    unet = pipe.unet
    forward = unet.forward

    @functools.wraps(forward)
    def restricted(*args, **kwargs):
        with sdpa_kernel(BACKENDS[backend]):
            return forward(*args, **kwargs)

    restricted.sdpa_backend = backend
    unet.forward = restricted
    return pipe


def check_slice_size(slice_size) -> None:
    if slice_size not in SLICE_SIZES and not (isinstance(slice_size, int) and slice_size > 0):
        raise ValueError(f"slice_size {slice_size!r} is not valid; choose one of: {', '.join(SLICE_SIZES)}, "
                         "or a positive int")


def use_slicing(pipe, slice_size="auto"):
    """diffusers' sliced attention on the UNet: the classic computation a slice of heads at a time."""
    check_slice_size(slice_size)
    pipe.unet.set_attention_slice(slice_size)
    return pipe


def dispatcher_backends() -> list[str]:
    from diffusers.models.attention_dispatch import AttentionBackendName

    return [b.value for b in AttentionBackendName]


def dispatcher_reach(unet: torch.nn.Module) -> dict:
    """How many attention layers `set_attention_backend` would change (processors with an `_attention_backend`)."""
    mods = attention_modules(unet)
    return {"attention_layers": len(mods),
            "dispatched": sum(hasattr(m.processor, "_attention_backend") for m in mods),
            "processors": dict(Counter(type(m.processor).__name__ for m in mods))}


def dispatcher_availability(unet: torch.nn.Module) -> tuple[bool, str]:
    reach = dispatcher_reach(unet)
    if reach["dispatched"]:
        return True, f"{reach['dispatched']} of {reach['attention_layers']} attention layers use the dispatcher"
    names = ", ".join(reach["processors"])
    return False, (f"none of the UNet's {reach['attention_layers']} attention layers goes through diffusers' "
                   f"attention dispatcher: their processors ({names}) call F.scaled_dot_product_attention "
                   "directly, so set_attention_backend would change nothing (it serves the newer transformer "
                   "models such as Flux, Wan and Qwen-Image)")


def check_dispatcher_backend(backend: str) -> None:
    _choice("diffusers attention backend", backend, dispatcher_backends())


def use_dispatcher(pipe, backend: str):
    check_dispatcher_backend(backend)
    pipe.unet.set_attention_backend(backend)
    return pipe


def facts(pipe) -> dict:
    """Which processors the prepared pipeline runs and whether the UNet call is restricted to one backend."""
    return {"unet_processors": dict(Counter(type(m.processor).__name__ for m in attention_modules(pipe.unet))),
            "vae_processors": dict(Counter(type(m.processor).__name__ for m in attention_modules(pipe.vae))),
            "unet_sdpa_backend": getattr(pipe.unet.forward, "sdpa_backend", "PyTorch's choice")}


NOTEBOOK = "03_attention"
TRANSFER = ("transfers", "sliced attention computes the same softmax in pieces, on any model")
KEY_PREFIXES = ("attention",)


def _skeleton(ctx) -> torch.nn.Module:
    from sdperf.config.architectures import get as get_arch

    return unet_skeleton(get_arch(ctx.profile.arch).unet)


def _with_facts(change):
    def apply(pipe, ctx):
        pipe = change(pipe)
        ctx.facts.update(facts(pipe))
        return pipe
    return apply


def technique(prefix: str, arg: str) -> Technique:
    """attention:classic, attention:sdpa:<backend>, attention:sliced:<auto|max|n>, attention:dispatcher:<name>."""
    kind, _, rest = arg.partition(":")
    key = f"{prefix}:{arg}"
    if kind == "classic" and not rest:
        return Technique(key, "classic (AttnProcessor)", ATTENTION, NOTEBOOK, loop_only=True, transfer=TRANSFER,
                         apply=_with_facts(lambda p: use_processor(p, "classic")),
                         note="softmax(QK^T)V with batched matmuls, the score matrix in memory")
    if kind == "sdpa" and rest:
        _choice("SDPA backend", rest, BACKENDS)
        return Technique(key, f"SDPA {rest} only", ATTENTION, NOTEBOOK, loop_only=True, transfer=TRANSFER,
                         apply=_with_facts(lambda p: use_sdpa_backend(p, rest)),
                         availability=lambda ctx: sdpa_availability(ctx.device, rest, ctx.profile.dtype,
                                                                    head_shapes(_skeleton(ctx))),
                         note=f"UNet calls inside sdpa_kernel(SDPBackend.{BACKENDS[rest].name})")
    if kind == "sliced":
        size = int(rest) if rest.isdigit() else (rest or "auto")
        check_slice_size(size)
        return Technique(key, f"sliced attention ({size})", ATTENTION, NOTEBOOK, loop_only=True, transfer=TRANSFER,
                         apply=_with_facts(lambda p: use_slicing(p, size)),
                         note="enable_attention_slicing: SlicedAttnProcessor on the UNet")
    if kind == "dispatcher" and rest:
        check_dispatcher_backend(rest)
        return Technique(key, f"set_attention_backend('{rest}')", ATTENTION, NOTEBOOK, loop_only=True, transfer=TRANSFER,
                         apply=_with_facts(lambda p: use_dispatcher(p, rest)),
                         availability=lambda ctx: dispatcher_availability(_skeleton(ctx)),
                         note="diffusers' attention dispatcher")
    raise ValueError(f"attention {arg!r} is not valid; choose one of: classic, sdpa:<{'|'.join(BACKENDS)}>, "
                     "sliced:<auto|max|n>, dispatcher:<diffusers backend>")


def techniques() -> list[Technique]:
    return [technique("attention", a) for a in
            ("classic", *(f"sdpa:{b}" for b in BACKENDS), "sliced:auto", "sliced:max", "dispatcher:native")]
