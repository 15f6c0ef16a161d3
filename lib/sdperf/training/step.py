"""One Stable Diffusion training step for the UNet, as the SD, NeMo and MosaicML recipes take it.

Noise the latents at a random timestep per sample (DDPM schedule), predict the noise (or the velocity, for
v-prediction) from them and the text embeddings, take the MSE, back-propagate, clip the gradient norm, step AdamW.
Autocast (bf16, or fp16 with a gradient scaler) wraps the forward pass only, as torch's AMP recipe does.
"""
from __future__ import annotations

import contextlib
import hashlib

import torch
import torch.nn.functional as F

AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast(device_type: str, mode: str):
    if mode == "none":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=AUTOCAST_DTYPES[mode])


def unet_inputs(batch: dict, device) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(latents, text embeddings, extra UNet kwargs): SDXL's pooled embeddings and time ids go in added_cond_kwargs."""
    latents = batch["latents"].to(device, non_blocking=True)
    embeds = batch["embeds"].to(device, non_blocking=True)
    extra = {}
    if "text_embeds" in batch:
        extra["added_cond_kwargs"] = {k: batch[k].to(device, non_blocking=True) for k in ("text_embeds", "time_ids")}
    return latents, embeds, extra


def noise_prediction_loss(unet, scheduler, batch: dict, generator: torch.Generator, device,
                          autocast_mode: str = "none") -> torch.Tensor:
    """The diffusion loss on one batch: MSE between the UNet's prediction and the noise (or velocity) target."""
    latents, embeds, extra = unet_inputs(batch, device)
    noise = torch.randn(latents.shape, generator=generator, device=latents.device)
    t = torch.randint(0, scheduler.config.num_train_timesteps, (latents.shape[0],), generator=generator,
                      device=latents.device)
    noisy = scheduler.add_noise(latents, noise, t)
    target = noise if scheduler.config.prediction_type == "epsilon" else scheduler.get_velocity(latents, noise, t)
    with autocast(latents.device.type, autocast_mode):
        pred = unet(noisy, t, encoder_hidden_states=embeds, return_dict=False, **extra)[0]
    return F.mse_loss(pred.float(), target.float())


class Trainer:
    """A model (plain or DDP-wrapped), AdamW and the step; `step(batch)` returns the loss (not synchronized)."""

    def __init__(self, model, scheduler, device, learning_rate: float, weight_decay: float, max_grad_norm: float,
                 autocast_mode: str, seed: int):
        self.model, self.scheduler, self.device = model, scheduler, torch.device(device)
        self.autocast_mode, self.max_grad_norm = autocast_mode, max_grad_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=learning_rate, weight_decay=weight_decay,
                                           fused=self.device.type == "cuda")
        fp16 = autocast_mode == "float16"
        self.scaler = torch.amp.GradScaler(self.device.type) if fp16 else None
        self.generator = torch.Generator(self.device).manual_seed(seed)

    def step(self, batch: dict) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = noise_prediction_loss(self.model, self.scheduler, batch, self.generator, self.device, self.autocast_mode)
        if self.scaler is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return loss.detach()


class ZeroTrainer:
    """The same step through a DeepSpeed engine: it reduces, clips (config gradient_clipping) and steps itself."""

    def __init__(self, engine, scheduler, device, autocast_mode: str, seed: int):
        self.model, self.scheduler, self.device = engine, scheduler, torch.device(device)
        self.autocast_mode = autocast_mode
        self.generator = torch.Generator(self.device).manual_seed(seed)

    def step(self, batch: dict) -> torch.Tensor:
        loss = noise_prediction_loss(self.model, self.scheduler, batch, self.generator, self.device, self.autocast_mode)
        self.model.backward(loss)
        self.model.step()
        return loss.detach()


def parameter_digest(module) -> str:
    """sha256 of every parameter's bytes in name order: equal digests mean bit-identical models."""
    h = hashlib.sha256()
    for name, p in sorted(module.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
