"""fp16 / bf16 weights and activations: fast on a GPU's tensor cores, and on a CPU only with half-precision matrix
instructions (AMX, AVX-512 FP16/BF16); otherwise oneDNN converts and the rung is slower than fp32.
"""
from __future__ import annotations

import torch

from sdperf.core.environment import cpu_isa
from sdperf.optimizations.catalog import PRECISION, Technique

HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}

# The CPU instructions that give each half precision a native matrix path (fp32 is the reference).
NATIVE_CPU_PATHS = {"float16": ("amx_fp16", "avx512_fp16"), "bfloat16": ("amx_bf16", "avx512_bf16")}


def availability(device: str, dtype: str) -> tuple[bool, str]:
    """Half precision runs everywhere torch does; the reason says whether it has a fast path here."""
    if dtype not in HALF:
        return False, f"dtype {dtype!r} is not a half precision; choose one of: {', '.join(HALF)}"
    if device == "cuda":
        if dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
            return False, "this GPU has no bfloat16 support (needs compute capability 8.0+)"
        return True, "tensor cores run this precision natively"
    isa = cpu_isa()
    native = [f for f in NATIVE_CPU_PATHS[dtype] if isa.get(f)]
    if native:
        return True, f"native CPU path via {', '.join(native)}"
    return True, (f"runs, but this CPU lacks {' / '.join(NATIVE_CPU_PATHS[dtype])}: no native {dtype} matrix "
                  "instructions, so expect it slower than float32")


def apply(pipe, dtype: str):
    """Cast every network of the pipeline to `dtype` in place (diffusers keeps the scheduler in fp32)."""
    return pipe.to(dtype=HALF[dtype])


NOTEBOOK = "01_half_precision"
TRANSFER = ("may not transfer",
            "half-precision error grows with depth and attention width (SD 1.5 runs fp16 routinely on GPUs, "
            "with a VAE kept in fp32 by diffusers for SDXL); the reference model is far shallower")
SHORT = {"float16": "fp16", "bfloat16": "bf16"}


def techniques() -> list[Technique]:
    """precision:<dtype>: every network cast to that half precision (weights and activations)."""
    return [Technique(f"precision:{dtype}", f"{SHORT[dtype]} weights+activations", PRECISION, NOTEBOOK, transfer=TRANSFER,
                      apply=lambda pipe, ctx, d=dtype: apply(pipe, d),
                      availability=lambda ctx, d=dtype: availability(ctx.device, d), changes_output=True,
                      dtype=dtype, note="every network cast; the scheduler stays float32")
            for dtype in HALF]
