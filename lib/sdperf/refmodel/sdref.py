"""The reference model's parts: SD's own components at the `sdref` architecture, and the module training updates.

`build(seed)` is the seeded init every random-init comparison uses. `Conditioned` puts the text encoder in front of
the UNet: the training step calls it as a UNet with token ids, so one backward pass trains both.
"""
from __future__ import annotations

import torch
from torch import nn

ARCH = "sdref"
MAX_TOKENS = 77  # CLIP's context, as StableDiffusionPipeline tokenizes


class Conditioned(nn.Module):
    """unet(sample, t, encoder_hidden_states=token ids) -> the UNet's output on the text encoder's embeddings."""

    def __init__(self, unet, text_encoder):
        super().__init__()
        self.unet, self.text_encoder = unet, text_encoder

    def forward(self, sample, timestep, encoder_hidden_states, return_dict: bool = False, **kwargs):
        embeds = self.text_encoder(encoder_hidden_states)[0]
        return self.unet(sample, timestep, encoder_hidden_states=embeds, return_dict=return_dict, **kwargs)


def build(seed: int, scheduler: str = "plms"):
    """The seeded random-init `sdref` pipeline (fp32, CPU, eval mode)."""
    from sdperf.model.pipelines import build_random

    return build_random(ARCH, scheduler=scheduler, seed=seed)


def tokenize(tokenizer, captions: list[str]) -> torch.Tensor:
    """Token ids as StableDiffusionPipeline.encode_prompt makes them: padded to 77, truncated."""
    return tokenizer(list(captions), padding="max_length", max_length=MAX_TOKENS, truncation=True,
                     return_tensors="pt").input_ids


def noise_scheduler():
    from sdperf.training.model import noise_scheduler as ddpm

    return ddpm(ARCH)
