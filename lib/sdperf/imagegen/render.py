"""Images for a batch of keys through sdperf.model.generation's loop: each image's noise from its own seed; prompts
are encoded one by one and stacked, all unconditional rows first, as the loop's guidance split expects.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from sdperf.model import generation
from sdperf.model.generation import Workload
from sdperf.config.profiles import Profile


def workload(profile: Profile, caption: str, guidance: float, seed: int, steps: int | None = None) -> Workload:
    """The profile's workload (resolution, steps, scheduler) for one image; `steps` overrides the profile's."""
    return replace(Workload.from_profile(profile, steps=steps), prompt=caption, guidance_scale=float(guidance),
                   seed=int(seed))


def _stack_cfg(parts: list[torch.Tensor], do_cfg: bool) -> torch.Tensor:
    """Per-prompt [uncond, cond] pairs -> [all uncond, all cond]; without guidance a plain concatenation."""
    if not do_cfg:
        return torch.cat(parts)
    return torch.cat([torch.cat([p[:1] for p in parts]), torch.cat([p[1:] for p in parts])])


def _stack_extra(extras: list[dict], do_cfg: bool) -> dict:
    """SDXL's added_cond_kwargs (pooled text embeddings, size ids) stacked like the embeddings."""
    if not extras[0]:
        return {}
    added = [e["added_cond_kwargs"] for e in extras]
    return {"added_cond_kwargs": {k: _stack_cfg([a[k] for a in added], do_cfg) for k in added[0]}}


def render(pipe, profile: Profile, items: list[tuple[str, float, int]], steps: int | None = None,
           grad_mode: str = "inference_mode") -> np.ndarray:
    """uint8 NHWC images for (caption, guidance, seed) items sharing one guidance scale, under `grad_mode`."""
    guidance = {g for _, g, _ in items}
    if len(guidance) != 1:
        raise ValueError(f"a batch must share one guidance scale, got {sorted(guidance)}")
    with generation.GRAD_MODES[grad_mode]():
        return render_workloads(pipe, [workload(profile, caption, g, seed, steps) for caption, g, seed in items])


def render_workloads(pipe, singles: list[Workload]) -> np.ndarray:
    """uint8 NHWC images of single-image workloads sharing one guidance scale and step count, in one batch."""
    return render_with_latents(pipe, singles)[1]


def render_with_latents(pipe, singles: list[Workload]) -> tuple[torch.Tensor, np.ndarray]:
    """(final latents as float32 on the CPU, on which a solver's error is measured; uint8 NHWC images)."""
    device = generation.module_device(pipe.unet)
    dtype = generation.module_dtype(pipe.unet)
    batch = replace(singles[0], batch_size=len(singles))
    do_cfg = generation.uses_cfg(pipe, batch)
    latents = torch.cat([generation.initial_latents(pipe, w) for w in singles])
    encoded = [generation.encode(pipe, w, device) for w in singles]
    embeds = _stack_cfg([e for e, _ in encoded], do_cfg)
    extra = _stack_extra([x for _, x in encoded], do_cfg)
    latents = generation.denoise(pipe, batch, latents.to(device, dtype), embeds, extra)
    images = generation.decode(pipe, latents).float().cpu()
    return latents.float().cpu(), to_uint8(images)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """[0, 1] NCHW floats -> uint8 NHWC, rounded as diffusers' numpy_to_pil does."""
    return (images.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
