"""The denoising loop written out stage by stage, so each stage can be timed and swapped; it computes what diffusers'
pipeline call computes (a test holds them equal). Image i's noise comes from its own seed, whatever the batch."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from sdperf.model.pipelines import is_sdxl
from sdperf.config.profiles import Profile

STAGES = ("text_encoder", "unet", "scheduler", "vae_decode")
# How autograd is kept out of the way: the Cerebrium ladder's inference_mode rung compares these.
GRAD_MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@dataclass(frozen=True)
class Workload:
    prompt: str
    batch_size: int
    steps: int
    guidance_scale: float
    height: int
    width: int
    seed: int

    @classmethod
    def from_profile(cls, profile: Profile, batch_size: int = 1, steps: int | None = None) -> "Workload":
        return cls(prompt=profile.prompt, batch_size=batch_size, steps=steps or profile.steps,
                   guidance_scale=profile.guidance_scale, height=profile.resolution, width=profile.resolution,
                   seed=profile.seed)


@dataclass
class Output:
    latents: torch.Tensor  # final latents, float32 on the CPU
    images: torch.Tensor | None  # decoded images in [0, 1], float32 on the CPU, NCHW; None when not decoded


def initial_latents(pipe, workload: Workload) -> torch.Tensor:
    """Float32 CPU noise, one generator per image (seed + i), independent of device and dtype."""
    scale = pipe.vae_scale_factor
    shape = (pipe.unet.config.in_channels, workload.height // scale, workload.width // scale)
    return torch.stack([torch.randn(shape, generator=torch.Generator("cpu").manual_seed(workload.seed + i))
                        for i in range(workload.batch_size)])


def no_clock(_stage):
    return contextlib.nullcontext()


def module_dtype(module) -> torch.dtype:
    """The dtype inputs must have; engine wrappers (ONNX Runtime, OpenVINO, TensorRT) say it themselves."""
    dtype = getattr(module, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else next(module.parameters()).dtype


def module_device(module) -> torch.device:
    device = getattr(module, "device", None)
    return device if isinstance(device, torch.device) else next(module.parameters()).device


def guidance_embedded(unet) -> bool:
    """A UNet that takes the guidance scale as an input (`time_cond_proj_dim`: LCM and guidance-distilled students):
    one call per step at the prompt batch returns the guided noise, so the loop runs no unconditional half."""
    return getattr(getattr(unet, "config", None), "time_cond_proj_dim", None) is not None


def uses_cfg(pipe, workload: Workload) -> bool:
    """Whether the loop runs classifier-free guidance's two halves (diffusers' do_classifier_free_guidance)."""
    return workload.guidance_scale > 1.0 and not guidance_embedded(pipe.unet)


def guidance_kwargs(pipe, workload: Workload, n: int, device, dtype) -> dict:
    """The guidance-embedded UNet's `timestep_cond` at the workload's scale, as StableDiffusionPipeline makes it."""
    if not guidance_embedded(pipe.unet):
        return {}
    w = torch.full((n,), workload.guidance_scale - 1.0)
    emb = pipe.get_guidance_scale_embedding(w, embedding_dim=pipe.unet.config.time_cond_proj_dim)
    return {"timestep_cond": emb.to(device, dtype)}


# pipe.GUIDED_AT: (step index, step count, timestep) -> whether that step runs guidance (a training-free cut)
GUIDED_AT = "sdperf_guided_at"


def _cond_half(embeds, extra: dict):
    """The conditional half of CFG embeddings and SDXL's added kwargs: what an unguided step conditions on."""
    half = lambda t: t.chunk(2)[1]  # noqa: E731
    if "added_cond_kwargs" in extra:
        extra = {**extra, "added_cond_kwargs": {k: half(v) for k, v in extra["added_cond_kwargs"].items()}}
    return half(embeds), extra


def noise_generators(latents: torch.Tensor) -> list[torch.Generator]:
    """One generator per image for a stochastic sampler's fresh noise (LCM's multistep), seeded by that image's
    own initial noise: the same image gets the same noise in any batch, in any process."""
    import hashlib

    out = []
    for x in latents.detach().float().cpu():
        seed = int.from_bytes(hashlib.sha256(x.numpy().tobytes()).digest()[:8], "little") >> 1
        out.append(torch.Generator("cpu").manual_seed(seed))
    return out


def encode(pipe, workload: Workload, device):
    """Text conditioning for classifier-free guidance: (embeddings, extra UNet kwargs), uncond first."""
    do_cfg = uses_cfg(pipe, workload)
    if not is_sdxl(pipe):
        cond, uncond = pipe.encode_prompt(workload.prompt, device, workload.batch_size, do_cfg)
        return (torch.cat([uncond, cond]) if do_cfg else cond), {}
    cond, uncond, pooled, uncond_pooled = pipe.encode_prompt(
        workload.prompt, device=device, num_images_per_prompt=workload.batch_size,
        do_classifier_free_guidance=do_cfg)
    size = (workload.height, workload.width)
    time_ids = pipe._get_add_time_ids(size, (0, 0), size, dtype=cond.dtype,
                                      text_encoder_projection_dim=pipe.text_encoder_2.config.projection_dim)
    time_ids = time_ids.to(device).repeat(workload.batch_size * (2 if do_cfg else 1), 1)
    embeds = torch.cat([uncond, cond]) if do_cfg else cond
    pooled = torch.cat([uncond_pooled, pooled]) if do_cfg else pooled
    return embeds, {"added_cond_kwargs": {"text_embeds": pooled, "time_ids": time_ids}}


def upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device without a sync: a blocking copy from pageable memory waits for the stream, so pin first."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def denoise(pipe, workload: Workload, latents: torch.Tensor, embeds, extra: dict, clock=no_clock,
            host_values: bool = False):
    """The loop: scale input, UNet on the CFG batch, guidance, scheduler step. `host_values` keeps the timesteps on
    the host, so the scheduler reads nothing back from the device (the UNet's are uploaded once)."""
    sched = pipe.scheduler
    device = latents.device
    if host_values:
        sched.set_timesteps(workload.steps, device="cpu")
        timesteps, unet_timesteps = sched.timesteps.tolist(), upload(sched.timesteps, device)
    else:
        sched.set_timesteps(workload.steps, device=device)
        timesteps = unet_timesteps = sched.timesteps
    stochastic = {"generator": noise_generators(latents)} if type(sched).__name__ == "LCMScheduler" else {}
    latents = latents * sched.init_noise_sigma
    do_cfg = uses_cfg(pipe, workload)
    unet_dtype = module_dtype(pipe.unet)
    extra = {**extra, **guidance_kwargs(pipe, workload, len(latents), device, unet_dtype)}
    guided_at = getattr(pipe, GUIDED_AT, None)
    unguided = _cond_half(embeds, extra) if do_cfg and guided_at is not None else None
    for i, (t, unet_t) in enumerate(zip(timesteps, unet_timesteps)):
        guided = do_cfg and (guided_at is None or guided_at(i, len(timesteps), float(t)))
        e, kw = (embeds, extra) if guided or not do_cfg else unguided
        with clock("unet"):
            x = torch.cat([latents] * 2) if guided else latents
            x = sched.scale_model_input(x, t)
            eps = pipe.unet(x.to(unet_dtype), unet_t, encoder_hidden_states=e, return_dict=False, **kw)[0]
            if guided:
                uncond, cond = eps.chunk(2)
                eps = uncond + workload.guidance_scale * (cond - uncond)
        with clock("scheduler"):
            latents = sched.step(eps.to(latents.dtype), t, latents, return_dict=False, **stochastic)[0]
    return latents


def decode(pipe, latents: torch.Tensor) -> torch.Tensor:
    """VAE decode to [0, 1] images; SDXL's fp16 VAE decodes in float32 (force_upcast), as diffusers' SDXL does."""
    vae = pipe.vae
    dtype = module_dtype(vae)
    if dtype == torch.float16 and is_sdxl(pipe) and getattr(vae.config, "force_upcast", False):
        vae = vae.to(torch.float32)
        try:
            return decode(pipe, latents)
        finally:
            vae.to(dtype)
    images = vae.decode(latents.to(dtype) / vae.config.scaling_factor, return_dict=False)[0]
    return (images.float() / 2 + 0.5).clamp(0, 1)


def generate(pipe, workload: Workload, latents: torch.Tensor | None = None, clock=no_clock,
             grad_mode: str = "inference_mode", decode_images: bool = True) -> Output:
    """One full text-to-image call timed by `clock` (a StageClock); `decode_images=False` stops at the latents."""
    if grad_mode not in GRAD_MODES:
        raise ValueError(f"grad_mode {grad_mode!r} is not valid; choose one of: {', '.join(GRAD_MODES)}")
    with GRAD_MODES[grad_mode]():
        return _generate(pipe, workload, latents, clock, decode_images)


def _generate(pipe, workload: Workload, latents: torch.Tensor | None, clock, decode_images: bool = True) -> Output:
    device = module_device(pipe.unet)
    if latents is None:
        latents = initial_latents(pipe, workload)
    with clock("text_encoder"):
        embeds, extra = encode(pipe, workload, device)
    # the loop keeps latents in the UNet's dtype, as diffusers does
    latents = latents.to(device, module_dtype(pipe.unet))
    latents = denoise(pipe, workload, latents, embeds, extra, clock)
    if not decode_images:
        return Output(latents=latents.detach().float().cpu(), images=None)
    with clock("vae_decode"):
        images = decode(pipe, latents)
    return Output(latents=latents.detach().float().cpu(), images=images.detach().cpu())
