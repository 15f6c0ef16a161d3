"""The students' training: their data from the teacher, and one step of each kind (sdperf.refmodel.loop runs them).

Data: domain scenes encoded by the teacher's VAE into its UNet's latent space (posterior means times the stored
scaling factor), each caption's embedding from the teacher's frozen text encoder. Step s draws from (seed, s)
alone, so a resumed run takes an uninterrupted one's steps.

- `lcm`: latent consistency distillation as diffusers' `examples/consistency_distillation` does it: a point t_n
  of the teacher's DDIM grid, one guided DDIM step of the teacher to t_{n-1}, and the student at t_n pulled to
  the EMA target's output at t_{n-1}, both under LCM's boundary conditions (c_skip, c_out) and a Huber loss.
- `guidance`: the student at (x_t, t, w) regresses the teacher's guided noise eps_c + w (eps_c - eps_u).
- `tiny-decoder`: AutoencoderTiny's decoder regresses the teacher VAE's decode of the same latents (L1).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from sdperf.refmodel import domain, sdref
from sdperf.refmodel.evaluator import to_input

SCENE_SEED_OFFSET = 5  # scene seed of the students' data: apart from every training, held-out and judged set
SIGMA_DATA, TIMESTEP_SCALING = 0.5, 10.0  # LCM's boundary conditions, as diffusers' LCMScheduler


@torch.inference_mode()
def encode_data(teacher, recipe, batch: int = 500) -> dict:
    """Latents (UNet space) of `recipe.scenes` domain scenes, their caption index, every caption's embedding."""
    items = domain.scenes(recipe.seed + SCENE_SEED_OFFSET, recipe.scenes)
    vae = teacher.vae
    means = [vae.encode(to_input(domain.render_many(items[i:i + batch], teacher.unet.config.sample_size
                                                    * teacher.vae_scale_factor))).latent_dist.mean
             for i in range(0, len(items), batch)]
    captions = sorted({s.caption for s in items})
    where = {c: i for i, c in enumerate(captions)}
    embeds = [teacher.text_encoder(sdref.tokenize(teacher.tokenizer, captions[i:i + batch]))[0]
              for i in range(0, len(captions), batch)]
    empty = teacher.text_encoder(sdref.tokenize(teacher.tokenizer, [""]))[0]
    return {"latents": (torch.cat(means) * vae.config.scaling_factor).contiguous(),
            "caption_index": torch.as_tensor(np.array([where[s.caption] for s in items]), dtype=torch.long),
            "embeds": torch.cat(embeds).contiguous(), "empty": empty[0].contiguous()}


def draw(data: dict, recipe, step: int) -> tuple[torch.Tensor, torch.Tensor, np.random.Generator]:
    """(latents, caption embeddings, the step's generator) of step `step`'s batch."""
    rng = np.random.default_rng([recipe.seed, step])
    pick = torch.as_tensor(rng.integers(len(data["latents"]), size=recipe.batch))
    return data["latents"][pick], data["embeds"][data["caption_index"][pick]], rng


def guidance_embedding(w: torch.Tensor, dim: int) -> torch.Tensor:
    """diffusers' guidance-scale embedding of w (what StableDiffusionPipeline feeds a `time_cond_proj_dim` UNet)."""
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.get_guidance_scale_embedding(None, w, embedding_dim=dim)


def student_unet(teacher_unet, dim: int):
    """The teacher's UNet with a guidance embedding: its weights copied, the embedding's projection at zero, so the
    untrained student is the teacher's conditional branch exactly."""
    from diffusers import UNet2DConditionModel

    student = UNet2DConditionModel.from_config({**teacher_unet.config, "time_cond_proj_dim": dim})
    missing, unexpected = student.load_state_dict(teacher_unet.state_dict(), strict=False)
    if unexpected or any(not k.startswith("time_embedding.cond_proj") for k in missing):
        raise RuntimeError(f"the student UNet does not take the teacher's weights: missing {missing}, "
                           f"unexpected {unexpected}")
    torch.nn.init.zeros_(student.time_embedding.cond_proj.weight)
    return student


def _ws(rng: np.random.Generator, recipe) -> torch.Tensor:
    return torch.as_tensor(rng.uniform(recipe.w_min, recipe.w_max, size=recipe.batch), dtype=torch.float32)


def _noise(rng: np.random.Generator, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(rng.standard_normal(like.shape), dtype=like.dtype)


def _guided(teacher_unet, x, t, cond, empty, w):
    """(eps_u, eps_c) of the teacher in one call at twice the batch."""
    uncond = empty.expand_as(cond)
    eps = teacher_unet(torch.cat([x, x]), torch.cat([t, t]), encoder_hidden_states=torch.cat([uncond, cond]),
                       return_dict=False)[0]
    return eps.chunk(2)


def guidance_loss(student, teacher_unet, alphas: torch.Tensor, data: dict, recipe, step: int) -> torch.Tensor:
    """Meng et al.'s stage 1: the student's eps at (x_t, t, w) against the teacher's guided eps."""
    x0, cond, rng = draw(data, recipe, step)
    t = torch.as_tensor(rng.integers(len(alphas), size=recipe.batch), dtype=torch.long)
    a = alphas[t].view(-1, 1, 1, 1)
    x = a.sqrt() * x0 + (1 - a).sqrt() * _noise(rng, x0)
    w = _ws(rng, recipe)
    with torch.no_grad():
        eps_u, eps_c = _guided(teacher_unet, x, t, cond, data["empty"], w)
        target = eps_c + w.view(-1, 1, 1, 1) * (eps_c - eps_u)
    pred = student(x, t, encoder_hidden_states=cond, timestep_cond=guidance_embedding(w, recipe.guidance_dim),
                   return_dict=False)[0]
    return F.mse_loss(pred, target)


def boundary(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LCM's (c_skip, c_out) at timestep t (LCMScheduler.get_scalings_for_boundary_condition_discrete)."""
    scaled = TIMESTEP_SCALING * t.float()
    c_skip = SIGMA_DATA ** 2 / (scaled ** 2 + SIGMA_DATA ** 2)
    c_out = scaled / (scaled ** 2 + SIGMA_DATA ** 2) ** 0.5
    return c_skip.view(-1, 1, 1, 1), c_out.view(-1, 1, 1, 1)


def _x0(eps, x, a):
    return (x - (1 - a).sqrt() * eps) / a.sqrt()


def solver_grid(n_train: int, solver_steps: int) -> torch.Tensor:
    """The teacher's DDIM grid the student skips along: t_n = (n + 1) * k - 1 (LCMScheduler's original steps)."""
    k = n_train // solver_steps
    return torch.arange(1, solver_steps + 1) * k - 1


def consistency_loss(student, target_net, teacher_unet, alphas: torch.Tensor, data: dict, recipe,
                     step: int) -> torch.Tensor:
    """One consistency-distillation step: f(x_{t_n}, t_n) against the EMA target's f at the teacher's x_{t_{n-1}}."""
    grid = solver_grid(len(alphas), recipe.solver_steps)
    x0, cond, rng = draw(data, recipe, step)
    n = torch.as_tensor(rng.integers(len(grid), size=recipe.batch), dtype=torch.long)
    t = grid[n]
    s = (t - (grid[1] - grid[0])).clamp(min=0)
    a_t, a_s = alphas[t].view(-1, 1, 1, 1), alphas[s].view(-1, 1, 1, 1)
    x_t = a_t.sqrt() * x0 + (1 - a_t).sqrt() * _noise(rng, x0)
    w = _ws(rng, recipe)
    w_emb = guidance_embedding(w, recipe.guidance_dim)
    skip_t, out_t = boundary(t)
    eps = student(x_t, t, encoder_hidden_states=cond, timestep_cond=w_emb, return_dict=False)[0]
    pred = skip_t * x_t + out_t * _x0(eps, x_t, a_t)
    with torch.no_grad():
        eps_u, eps_c = _guided(teacher_unet, x_t, t, cond, data["empty"], w)
        wv = w.view(-1, 1, 1, 1)
        x0_g = _x0(eps_c, x_t, a_t) + wv * (_x0(eps_c, x_t, a_t) - _x0(eps_u, x_t, a_t))
        eps_g = eps_c + wv * (eps_c - eps_u)
        x_s = a_s.sqrt() * x0_g + (1 - a_s).sqrt() * eps_g  # the teacher's DDIM step t_n -> t_{n-1}
        skip_s, out_s = boundary(s)
        eps_s = target_net(x_s, s, encoder_hidden_states=cond, timestep_cond=w_emb, return_dict=False)[0]
        target = skip_s * x_s + out_s * _x0(eps_s, x_s, a_s)
    c = recipe.huber_c
    return (torch.sqrt((pred.float() - target.float()) ** 2 + c ** 2) - c).mean()


def tiny_decoder(width: int, levels: int):
    """AutoencoderTiny at `width` channels with TAESD's block counts, `levels` VAE levels (2**(levels-1) x up)."""
    from diffusers import AutoencoderTiny

    channels = (width,) * levels
    dec_blocks = (3,) * (levels - 1) + (1,)
    enc_blocks = (1,) + (3,) * (levels - 1)
    return AutoencoderTiny(encoder_block_out_channels=channels, decoder_block_out_channels=channels,
                           num_encoder_blocks=enc_blocks, num_decoder_blocks=dec_blocks, latent_channels=4,
                           scaling_factor=1.0)


def decoder_loss(decoder, teacher_vae, data: dict, recipe, step: int) -> torch.Tensor:
    """L1 between the tiny decoder's image and the teacher VAE's decode of the same latents, both in [-1, 1]."""
    z, _, _ = draw(data, recipe, step)
    with torch.no_grad():
        target = teacher_vae.decode(z / teacher_vae.config.scaling_factor, return_dict=False)[0].clamp(-1, 1)
    return F.l1_loss(decoder.decode(z, return_dict=False)[0], target)
