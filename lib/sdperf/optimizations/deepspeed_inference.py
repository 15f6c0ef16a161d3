"""DeepSpeed-Inference kernel injection on a diffusers pipeline.

`deepspeed.init_inference(pipe, dtype=torch.half, replace_with_kernel_inject=True)` on the *pipeline* (an nn.Module
goes down the transformer-layer path, whose policies match no UNet layer) runs `module_inject.generic_injection`:
it wraps the text encoder, UNet and VAE (DSClipEncoder, DSUNet, DSVAE) and replaces every diffusers `Attention` and
`BasicTransformerBlock` by fused CUDA kernels built by the InferenceBuilder op, which has no CPU build.

Versions: the compatibility sources are in `sdperf/data/deepspeed_sd_compat.csv`. transformers >= 5.6 flattened
`CLIPTextModel`, so `DSClipEncoder` raises AttributeError on `enc.text_model`; DSUNet drops `added_cond_kwargs`, so
SDXL is out. Whether DeepSpeed's policies match the installed libraries is computed on the CPU
(`deepspeed_policies`); availability() names a mismatch on every CUDA profile.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from sdperf.optimizations.catalog import EXECUTOR, Technique
from sdperf.optimizations.deepspeed_clip import adapt_clip_layout

# Classes under these packages are DeepSpeed's replacements; the engine itself wraps without replacing
DEEPSPEED_PACKAGE = "deepspeed."
NOT_REPLACEMENTS = ("deepspeed.inference.",)
KERNEL_PACKAGE = "deepspeed.ops."  # fused-kernel modules; the rest (model_implementations) are wrappers
DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}
# Kernel injection of a diffusers pipeline accepts only half precision (generic_injection raises otherwise).
INJECTION_DTYPE = "float16"
SUPPORTED_ARCHS = ("sd15", "sd2-base", "tiny")


def policy_mismatch(clip_adapter: bool = False) -> str:
    """Why DeepSpeed's injection policies would not match this stack's SD modules ("" when they do), from
    deepspeed_policies on the tiny twin; without the adapter, also whether the adapter would fix it."""
    from sdperf.optimizations import deepspeed_policies

    try:
        found = deepspeed_policies.twin_mismatches(clip_adapter)
    except Exception as exc:  # noqa: BLE001 - a check that cannot run is itself the reason
        return f"DeepSpeed's policy check could not run: {type(exc).__name__}: {exc}"
    if not found:
        return ""
    import deepspeed
    import diffusers
    import transformers

    why = (f"DeepSpeed {deepspeed.__version__}'s injection policies do not match diffusers {diffusers.__version__} / "
           f"transformers {transformers.__version__} (DeepSpeed's own code, run on the CPU on the tiny SD twin): "
           + "; ".join(found))
    if not clip_adapter and not policy_mismatch(clip_adapter=True):
        why += "; with sdperf's CLIP layout adapter (deepspeed:inject-clip-adapter) they match"
    return why


def availability(device: str, arch: str = "sd15", clip_adapter: bool = False) -> tuple[bool, str]:
    """Whether DeepSpeed's kernel injection can run here, and if not, why. A CUDA profile's policies are checked
    (`policy_mismatch`) even without CUDA, so `sdperf doctor` names a version drift before a GPU does."""
    if device != "cuda":
        return False, (f"device {device!r}: DeepSpeed's diffusers kernels (deepspeed.ops.transformer.inference, "
                       "InferenceBuilder) are CUDA/ROCm kernels; DeepSpeed's CPU accelerator implements none of "
                       "them and rejects float16 where oneDNN has no fp16 path")
    if arch not in SUPPORTED_ARCHS:
        return False, (f"arch {arch!r}: DSUNet forwards only sample/timestep/encoder_hidden_states, so SDXL's "
                       f"added_cond_kwargs would be dropped; kernel injection supports {', '.join(SUPPORTED_ARCHS)}")
    mismatch = policy_mismatch(clip_adapter)
    if not torch.cuda.is_available():
        return False, ("device 'cuda' requested but torch.cuda.is_available() is False"
                       + (f"; and {mismatch}" if mismatch else ""))
    if mismatch:
        return False, mismatch
    return True, ("CUDA device: fused attention / transformer-block kernels are built on first use (JIT); "
                  "DeepSpeed's policies match this stack's SD modules" + (" with sdperf's CLIP layout adapter"
                                                                          if clip_adapter else ""))


def _dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not valid; choose one of: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def apply(pipe, dtype: str = INJECTION_DTYPE, enable_cuda_graph: bool = False, clip_adapter: bool = False):
    """The seed's call on the whole pipeline, cast first (init_inference converts only nn.Modules); CUDA graphs
    stay off by default so the rung measures the kernels alone."""
    torch_dtype = _dtype(dtype)
    import deepspeed

    pipe = pipe.to(dtype=torch_dtype)
    if clip_adapter:
        adapt_clip_layout(pipe.text_encoder)
    engine = deepspeed.init_inference(pipe, dtype=torch_dtype, replace_with_kernel_inject=True,
                                      enable_cuda_graph=enable_cuda_graph)
    return engine.module


def inject_only(pipe, dtype: str = INJECTION_DTYPE, clip_adapter: bool = False):
    """generic_injection called directly: what happens past the accelerator's dtype check."""
    torch_dtype = _dtype(dtype)
    from deepspeed.module_inject import generic_injection

    if clip_adapter:
        adapt_clip_layout(pipe.text_encoder)
    generic_injection(pipe, dtype=torch_dtype, enable_cuda_graph=False)
    return pipe


def apply_to_unet(pipe, dtype: str = "float32"):
    """init_inference on `pipe.unet` alone, the call people often write: the transformer-layer path, whose
    policies match none of its layers. The engine becomes the pipeline's UNet."""
    torch_dtype = _dtype(dtype)
    import deepspeed

    engine = deepspeed.init_inference(pipe.unet, dtype=torch_dtype, replace_with_kernel_inject=True)
    pipe.unet = engine
    return pipe


def _roots(obj) -> list[torch.nn.Module]:
    if isinstance(obj, torch.nn.Module):
        return [obj]
    components = getattr(obj, "components", None)
    if isinstance(components, dict):
        return [m for m in components.values() if isinstance(m, torch.nn.Module)]
    raise ValueError(f"cannot take a census of a {type(obj).__name__}: pass an nn.Module or a diffusers pipeline")


def census(obj) -> Counter:
    """Every module reachable from a module or a pipeline's components, counted by class ('package.Class')."""
    seen: set[int] = set()
    counts: Counter = Counter()
    for root in _roots(obj):
        for m in root.modules():
            if id(m) not in seen:
                seen.add(id(m))
                counts[f"{type(m).__module__}.{type(m).__qualname__}"] += 1
    return counts


def _is_replacement(cls: str) -> bool:
    return cls.startswith(DEEPSPEED_PACKAGE) and not cls.startswith(NOT_REPLACEMENTS)


def replacements(before: Counter, after: Counter) -> dict[str, int]:
    """DeepSpeed classes that appeared between two censuses, with how many of each."""
    return {cls: n for cls, n in sorted((after - before).items()) if _is_replacement(cls)}


def count_replaced(before: Counter, after: Counter) -> dict[str, Any]:
    """How many modules DeepSpeed put in: total, fused-kernel modules, wrappers, and what disappeared."""
    new = replacements(before, after)
    kernels = sum(n for cls, n in new.items() if cls.startswith(KERNEL_PACKAGE))
    gone = {cls: n for cls, n in sorted((before - after).items()) if not _is_replacement(cls)}
    return {"replaced_modules": sum(new.values()), "kernel_modules": kernels,
            "wrapper_modules": sum(new.values()) - kernels, "new_classes": new, "removed_classes": gone}


def injection_targets(pipe) -> dict[str, int]:
    """What DeepSpeed's injection would swap in this pipeline, by its own policies, without building a kernel."""
    from deepspeed.module_inject.replace_policy import generic_policies
    from diffusers.models.attention import BasicTransformerBlock
    from diffusers.models.attention_processor import Attention

    out = {"text_encoder -> DSClipEncoder (wrapper)": int(getattr(pipe, "text_encoder", None) is not None)}
    for name, module in pipe.components.items():
        policy = next((p() for p in generic_policies if isinstance(module, torch.nn.Module) and p().match(module)),
                      None)
        if policy is None:
            continue
        modules = list(module.modules())
        out[f"{name} -> wrapper ({type(policy).__name__})"] = 1
        out[f"{name}: Attention -> DeepSpeedDiffusersAttention (kernel)"] = sum(
            isinstance(m, Attention) and policy.attention(m) is not None for m in modules)
        out[f"{name}: BasicTransformerBlock -> DeepSpeedDiffusersTransformerBlock (kernel)"] = sum(
            isinstance(m, BasicTransformerBlock) for m in modules)
    return out


NOTEBOOK = "06_deepspeed"
TRANSFER = ("may not transfer",
            "DeepSpeed's injected kernels run the UNet in fp16; half-precision error grows with depth and "
            "attention width, and the reference model is far shallower than SD 1.5")


def _counted(fn):
    """apply with a census of module classes before and after (also when it raises): a pass-through shows."""
    def run(pipe, ctx):
        before = census(pipe)
        try:
            pipe = fn(pipe)
        finally:
            ctx.facts.update(count_replaced(before, census(pipe)))
        return pipe
    return run


def techniques() -> list[Technique]:
    """deepspeed:inject, deepspeed:inject-clip-adapter (with sdperf's CLIP layout adapter), deepspeed:unet-fp32."""
    def kernels(ctx):
        return availability(ctx.device, ctx.profile.arch)

    def kernels_adapted(ctx):
        return availability(ctx.device, ctx.profile.arch, clip_adapter=True)

    return [
        Technique("deepspeed:inject", "DeepSpeed kernel injection, fp16 pipeline", EXECUTOR, NOTEBOOK,
                  apply=_counted(lambda p: apply(p, "float16")), availability=kernels, changes_output=True,
                  transfer=TRANSFER, packages=("deepspeed",), dtype="float16", note="the seed's call: init_inference on the pipeline"),
        Technique("deepspeed:inject-clip-adapter", "DeepSpeed kernel injection + CLIP layout adapter", EXECUTOR,
                  NOTEBOOK, apply=_counted(lambda p: apply(p, "float16", clip_adapter=True)),
                  availability=kernels_adapted, changes_output=True, transfer=TRANSFER, packages=("deepspeed",),
                  dtype="float16", note="sdperf's adapter for transformers >= 5.6"),
        Technique("deepspeed:unet-fp32", "init_inference(pipe.unet, fp32): pass-through", EXECUTOR, NOTEBOOK,
                  apply=_counted(lambda p: apply_to_unet(p, "float32")), loop_only=True, packages=("deepspeed",),
                  note="pass-through: DeepSpeed's transformer policies match none of the UNet's layers"),
    ]
