"""The reference model's first stage: its AutoencoderKL, and the training set encoded into latents once.

The autoencoder reconstructs fresh renders (L1 plus a small KL term: SD's objective without pretrained networks).
The UNet trains on posterior means scaled to unit variance (SD's 0.18215), the scale stored in the VAE's config.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sdperf.refmodel import domain, loop, sdref
from sdperf.refmodel.evaluator import to_input
from sdperf.refmodel.training_recipe import Recipe

VAE_SEED_OFFSET, TRAIN_SET_SEED_OFFSET = 1, 2  # scene seeds of the VAE's renders and the UNet's training set


def train_vae(recipe: Recipe, checkpoint: Path, show: bool = True):
    """(trained AutoencoderKL in eval mode, training curve)."""
    vae = sdref.build(recipe.seed).vae.train().requires_grad_(True)
    opt = torch.optim.AdamW(vae.parameters(), lr=recipe.vae_lr, weight_decay=0.0)
    sched = loop.cosine_with_warmup(opt, min(100, recipe.vae_steps), recipe.vae_steps)
    g = torch.Generator().manual_seed(recipe.seed + VAE_SEED_OFFSET)
    scene_seed = recipe.seed + VAE_SEED_OFFSET

    def step(s: int) -> float:
        items = domain.scenes(scene_seed, recipe.vae_batch, start=s * recipe.vae_batch)
        x = to_input(domain.render_many(items, recipe.resolution))
        posterior = vae.encode(x).latent_dist
        rec = vae.decode(posterior.sample(generator=g)).sample
        value = F.l1_loss(rec, x) + recipe.vae_kl * posterior.kl().mean()
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        return float(value.detach())

    parts = {"vae": vae, "optimizer": opt, "schedule": sched, "noise": loop.GeneratorState(g)}
    curve = loop.run(checkpoint, parts, recipe.vae_steps, step, every=recipe.checkpoint_every, desc="autoencoder",
                     show=show)
    return vae.eval().requires_grad_(False), curve


@torch.inference_mode()
def reconstruction_accuracy(vae, net, n: int, resolution: int) -> dict[str, float]:
    """The evaluator's reading of the autoencoder's reconstructions of n held-out renders: the UNet's ceiling."""
    from sdperf.imagegen.render import to_uint8
    from sdperf.refmodel import evaluator

    items, images = evaluator.held_out(n, resolution)
    rec = torch.cat([vae.decode(vae.encode(to_input(images[i:i + 250])).latent_dist.mean).sample
                     for i in range(0, n, 250)])
    pred = evaluator.predict(net, to_uint8((rec / 2 + 0.5).clamp(0, 1)))
    return evaluator.accuracy(pred, domain.labels_many(items))


@torch.inference_mode()
def encode_training_set(recipe: Recipe, vae, tokenizer, batch: int = 500) -> dict:
    """The UNet's data: scaled latents, each distinct caption's token ids, each latent's caption, the empty ids."""
    items = domain.scenes(recipe.seed + TRAIN_SET_SEED_OFFSET, recipe.train_scenes)
    means = []
    for i in range(0, len(items), batch):
        x = to_input(domain.render_many(items[i:i + batch], recipe.resolution))
        means.append(vae.encode(x).latent_dist.mean)
    latents = torch.cat(means)
    scale = float(1.0 / latents.std())
    captions = sorted({s.caption for s in items})
    where = {c: i for i, c in enumerate(captions)}
    return {"latents": (latents * scale).contiguous(), "scaling_factor": scale,
            "caption_index": torch.as_tensor(np.array([where[s.caption] for s in items]), dtype=torch.long),
            "ids": sdref.tokenize(tokenizer, captions), "empty": sdref.tokenize(tokenizer, [""])[0],
            "n_captions": len(captions)}
