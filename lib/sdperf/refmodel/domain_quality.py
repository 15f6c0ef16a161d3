"""Judging images of the reference domain: adherence and domain FID with bootstrap intervals, paired deltas.

Images come from the study's one generation path (`sdperf.imagegen.render`); prompts are captions drawn from
PROMPT_SEED, which no training stage or held-out set uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sdperf.refmodel import domain, evaluator

PROMPT_SEED = 2_000_003
N_RESAMPLES = 2000
CONFIDENCE = 0.95


def prompts(n: int) -> list[domain.Scene]:
    return domain.scenes(PROMPT_SEED, n)


def generate(pipe, captions: list[str], seeds: list[int], guidance: float, steps: int,
             batch: int = 100, grad_mode: str = "inference_mode", pad: bool = True) -> np.ndarray:
    """uint8 NHWC images, caption i with latent seed i, `batch` prompts per UNet call, under `grad_mode`; `pad`
    repeats a short last batch's last prompt (dropped after), so every call has an engine's static shape."""
    return generate_with_latents(pipe, captions, seeds, guidance, steps, batch, grad_mode, pad)[1]


def generate_with_latents(pipe, captions: list[str], seeds: list[int], guidance: float, steps: int,
                          batch: int = 100, grad_mode: str = "inference_mode",
                          pad: bool = True) -> tuple[torch.Tensor, np.ndarray]:
    """(final float32 latents, uint8 NHWC images) of `generate`: the same call, the latents kept."""
    from sdperf.model.generation import GRAD_MODES, Workload
    from sdperf.imagegen.render import render_with_latents

    side = pipe.unet.config.sample_size * pipe.vae_scale_factor
    work = [Workload(prompt=c, batch_size=1, steps=steps, guidance_scale=float(guidance), height=side, width=side,
                     seed=int(s)) for c, s in zip(captions, seeds)]
    latents, images = [], []
    with GRAD_MODES[grad_mode]():
        for i in range(0, len(work), batch):
            part = work[i:i + batch]
            z, x = render_with_latents(pipe, part + [part[-1]] * (batch - len(part)) if pad else part)
            latents.append(z[:len(part)])
            images.append(x[:len(part)])
    return torch.cat(latents), np.concatenate(images)


@dataclass
class Real:
    """The FID's real side: features of held-out renders."""

    features: torch.Tensor

    @classmethod
    def of(cls, net: evaluator.Evaluator, n: int) -> "Real":
        """Computed once per process for these evaluator weights, n and resolution, then handed out as a copy."""
        from sdperf.optimizations.artefacts import weights_digest

        key = (weights_digest(net), int(n), int(net.resolution))
        if key not in _REAL_FEATURES:
            _, images = evaluator.held_out(n, net.resolution)
            _REAL_FEATURES[key] = evaluator.features(net, images).detach()
        return cls(_REAL_FEATURES[key].clone())


_REAL_FEATURES: dict[tuple, torch.Tensor] = {}


def _mu_sigma(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from sdperf.quality import fid

    return fid.mu_sigma(fid.stats_of(f), "fake")


def draws(rng: np.random.Generator, n: int, n_resamples: int) -> np.ndarray:
    """How often each of n items is drawn in each resample with replacement (n_resamples x n): weights of sums."""
    return np.stack([np.bincount(rng.integers(n, size=n), minlength=n) for _ in range(n_resamples)])


class FidTo:
    """features -> FID against `real` (sdperf.quality.fid), the real side's statistics computed once."""

    def __init__(self, real: Real):
        self.mu, self.sigma = _mu_sigma(real.features)

    def __call__(self, fake: torch.Tensor) -> float:
        from sdperf.quality import fid

        return fid.frechet_distance(*_mu_sigma(fake), self.mu, self.sigma)

    def resampled(self, fake: torch.Tensor, counts: np.ndarray) -> np.ndarray:
        """The FID of each resample of `fake` that `counts` (draws) describes, from weighted sums."""
        from sdperf.quality import fid

        x, w = fake.double(), torch.as_tensor(counts, dtype=torch.float64)
        n = float(w[0].sum())
        mu = (w @ x) / n
        outer = torch.einsum("rn,ni,nj->rij", w, x, x)
        sigma = (outer - n * mu[:, :, None] * mu[:, None, :]) / (n - 1)
        return fid.frechet_distances(mu, sigma, self.mu, self.sigma)


def fid_to(real: Real) -> FidTo:
    return FidTo(real)


def domain_fid(fake: torch.Tensor, real: Real) -> float:
    """FID between generated and held-out features."""
    return fid_to(real)(fake)


def recentred(estimate: float, resampled, confidence: float = None) -> tuple[float, float]:
    """A percentile bootstrap interval shifted so the resamples' mean sits on the estimate (resampling inflates FID)."""
    confidence = CONFIDENCE if confidence is None else confidence
    values = np.asarray(resampled, dtype=float)
    lo, hi = np.percentile(values, [100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2])
    shift = estimate - float(values.mean())
    return float(lo + shift), float(hi + shift)


def fid_interval(fake: torch.Tensor, real: Real, seed: int = 0, n_resamples: int = 200) -> tuple[float, float]:
    """FID's spread from the generated sample (the real side fixed), recentred on the estimate."""
    fid_of = fid_to(real)
    return recentred(fid_of(fake), fid_of.resampled(fake, draws(np.random.default_rng(seed), len(fake), n_resamples)))


def mean_interval(values: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): scipy's BCa bootstrap of the mean (percentile when all values are equal)."""
    from scipy.stats import bootstrap

    values = np.asarray(values, dtype=float)
    if np.ptp(values) == 0:
        return float(values.mean()), float(values.mean()), float(values.mean())
    ci = bootstrap((values,), np.mean, n_resamples=N_RESAMPLES, confidence_level=CONFIDENCE, method="BCa",
                   random_state=np.random.default_rng(seed)).confidence_interval
    return float(values.mean()), float(ci.low), float(ci.high)


def paired_delta(variant: np.ndarray, base: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """Mean of per-prompt differences variant - base with its bootstrap interval: same prompts, same latents."""
    variant, base = np.asarray(variant, dtype=float), np.asarray(base, dtype=float)
    if variant.shape != base.shape:
        raise ValueError(f"paired scores need equal shapes, got {variant.shape} and {base.shape}")
    return mean_interval(variant - base, seed)


def judge(pipe, net: evaluator.Evaluator, real: Real, n: int, guidance: float, steps: int) -> dict:
    """Adherence (mean and interval) and domain FID (value and interval) of n images at one guidance scale."""
    items = prompts(n)
    images = generate(pipe, [s.caption for s in items], list(range(n)), guidance, steps, pad=False)
    scores = evaluator.adherence_checks(evaluator.predict(net, images), domain.labels_many(items))
    feats = evaluator.features(net, images)
    mean, lo, hi = mean_interval(scores)
    return {"n": n, "guidance": guidance, "steps": steps, "adherence": mean, "adherence_ci": [lo, hi],
            "fid": domain_fid(feats, real), "fid_ci": list(fid_interval(feats, real))}
