"""The training step itself: it learns, it conditions SDXL correctly, and its fingerprint tells models apart."""
from __future__ import annotations

import pytest
import torch

from sdperf.training import dataset, model, step


def _batch(arch: str, n: int = 2) -> dict:
    return dataset.synthetic(arch, 64, n, seed=0)


def _eval_loss(unet, sched, batch) -> float:
    """The loss on the same noise and timesteps every time (a fixed generator), averaged over a few draws."""
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        return sum(step.noise_prediction_loss(unet, sched, batch, g, "cpu").item() for _ in range(4)) / 4


def test_training_step_reduces_the_loss_on_a_tiny_overfit_batch():
    unet, sched = model.build_unet("tiny", 1.0, seed=0), model.noise_scheduler("tiny")
    batch = _batch("tiny")
    before = _eval_loss(unet, sched, batch)
    trainer = step.Trainer(unet, sched, "cpu", learning_rate=1e-3, weight_decay=0.0, max_grad_norm=1.0,
                           autocast_mode="none", seed=1)
    losses = [trainer.step(batch).item() for _ in range(20)]
    after = _eval_loss(unet, sched, batch)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert after < 0.75 * before, (before, after, losses)


def test_gradient_clipping_bounds_the_update():
    """With a tiny clip norm, AdamW's first step moves each weight by about lr at most (Adam normalizes), and
    the clipped gradient norm is what clip_grad_norm_ reports back."""
    unet, sched = model.build_unet("tiny", 1.0, seed=0), model.noise_scheduler("tiny")
    before = [p.detach().clone() for p in unet.parameters()]
    trainer = step.Trainer(unet, sched, "cpu", learning_rate=1e-2, weight_decay=0.0, max_grad_norm=1e-6,
                           autocast_mode="none", seed=1)
    trainer.step(_batch("tiny"))
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in unet.parameters()
                                                 if p.grad is not None]))
    assert norm <= 1e-6 * 1.01
    moved = max((p.detach() - b).abs().max().item() for p, b in zip(unet.parameters(), before))
    assert 0 < moved <= 1e-2 * 1.01


def test_bf16_autocast_step_runs_and_keeps_fp32_weights():
    unet, sched = model.build_unet("tiny", 1.0, seed=0), model.noise_scheduler("tiny")
    trainer = step.Trainer(unet, sched, "cpu", 1e-4, 0.0, 1.0, autocast_mode="bfloat16", seed=1)
    loss = trainer.step(_batch("tiny"))
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in unet.parameters())


def test_sdxl_unet_gets_its_added_conditioning():
    unet, sched = model.build_unet("tiny-sdxl", 1.0, seed=0), model.noise_scheduler("tiny-sdxl")
    batch = _batch("tiny-sdxl")
    assert set(batch) == {"latents", "embeds", "text_embeds", "time_ids"}
    loss = step.noise_prediction_loss(unet, sched, batch, torch.Generator().manual_seed(0), "cpu")
    loss.backward()
    assert torch.isfinite(loss)
    without = {k: batch[k] for k in ("latents", "embeds")}
    with pytest.raises((TypeError, ValueError, AttributeError)):
        step.noise_prediction_loss(unet, sched, without, torch.Generator().manual_seed(0), "cpu")


def test_parameter_digest_is_a_fingerprint_of_the_weights():
    a, b = model.build_unet("tiny", 1.0, seed=0), model.build_unet("tiny", 1.0, seed=0)
    assert step.parameter_digest(a) == step.parameter_digest(b)  # seeded: every rank builds the same UNet
    with torch.no_grad():
        next(b.parameters()).view(-1)[0] += 1e-6
    assert step.parameter_digest(a) != step.parameter_digest(b)


def test_reduced_width_keeps_the_architecture():
    full = model.unet_config("sd15", 1.0)
    narrow = model.unet_config("sd15", 0.2)
    assert narrow["block_out_channels"] == [64, 128, 256, 256]
    assert {k: v for k, v in narrow.items() if k != "block_out_channels"} == \
        {k: v for k, v in full.items() if k != "block_out_channels"}
