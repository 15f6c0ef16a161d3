"""How far an optimized run's output moved from the fp32 baseline on the same seed and latents."""
from __future__ import annotations

import math

import torch


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN when the output itself holds NaN/inf (a broken picture)."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return math.nan
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


def psnr(images: torch.Tensor, ref: torch.Tensor) -> float:
    """PSNR in dB of [0, 1] images against the baseline's; inf when identical, NaN when broken."""
    images, ref = images.double(), ref.double()
    if not torch.isfinite(images).all():
        return math.nan
    if torch.equal(images, ref):
        return math.inf
    # torchmetrics' peak_signal_noise_ratio(images, ref, data_range=1.0) written out: importing it is slow
    return float(10 * torch.log10(1.0 / torch.mean((images - ref) ** 2)))


def compare(output, baseline) -> dict:
    """Drift of a generation Output against the baseline's Output (same workload, same initial latents)."""
    if output.latents.shape != baseline.latents.shape:
        raise ValueError(f"drift needs the same workload: latents {tuple(output.latents.shape)} vs "
                         f"baseline {tuple(baseline.latents.shape)}")
    return {
        "latent_rel_error": relative_error(output.latents, baseline.latents),
        "latent_max_abs_error": float((output.latents.double() - baseline.latents.double()).abs().max()),
        "image_max_abs_error": float((output.images.double() - baseline.images.double()).abs().max()),
        "image_psnr_db": psnr(output.images, baseline.images),
    }


def verdict(d: dict, psnr_threshold_db: float = 40.0) -> str:
    """A plain sentence: does this speed-up change the picture?"""
    if math.isnan(d["image_psnr_db"]):
        return "broken: the output holds NaN/inf"
    if math.isinf(d["image_psnr_db"]):
        return "bit-identical to the fp32 baseline"
    if d["image_psnr_db"] >= psnr_threshold_db:
        return f"visually identical (PSNR {d['image_psnr_db']:.1f} dB >= {psnr_threshold_db:.0f} dB)"
    return f"changes the picture (PSNR {d['image_psnr_db']:.1f} dB < {psnr_threshold_db:.0f} dB)"
