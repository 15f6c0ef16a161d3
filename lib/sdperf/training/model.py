"""The UNet a training run updates, and the noise schedule its loss uses.

Width 1.0 is the real UNet (the profile's weights, else the inference notebooks' seeded random init); a smaller width
scales every block's channels and keeps the rest of the architecture: fewer FLOPs and less optimizer memory, for
machines where the real UNet's fp32 weights, gradients and AdamW moments (~14 GB per rank) do not fit twice.
"""
from __future__ import annotations

import torch

from sdperf.config import architectures
from sdperf.config.profiles import weights_source


def unet_config(arch: str, width: float) -> dict:
    cfg = dict(architectures.get(arch).unet)
    cfg["block_out_channels"] = [int(round(c * width)) for c in cfg["block_out_channels"]]
    return cfg


def build_unet(arch: str, width: float, seed: int, weights: str | None = None):
    """A trainable fp32 UNet on the CPU; identical on every rank (seeded), as DDP requires."""
    from diffusers import UNet2DConditionModel

    if weights and width == 1.0:
        source, local = weights_source(weights)
        unet = UNet2DConditionModel.from_pretrained(source, subfolder="unet", local_files_only=local)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            unet = UNet2DConditionModel(**unet_config(arch, width))
    return unet.float().train().requires_grad_(True)


def noise_scheduler(arch: str, weights: str | None = None):
    """The DDPM training schedule of the architecture (1000 steps, scaled-linear betas, epsilon prediction)."""
    from diffusers import DDPMScheduler

    if weights:
        source, local = weights_source(weights)
        return DDPMScheduler.from_pretrained(source, subfolder="scheduler", local_files_only=local)
    return DDPMScheduler(**{k: v for k, v in architectures.get(arch).scheduler.items() if k != "steps_offset"})


def describe(arch: str, width: float, unet) -> str:
    n = architectures.count_parameters(unet)
    what = f"the real {arch} UNet" if width == 1.0 else f"{arch} UNet at {width:g}x channel width"
    return f"{what}: channels {list(unet.config.block_out_channels)}, {n / 1e6:.1f}M parameters"
