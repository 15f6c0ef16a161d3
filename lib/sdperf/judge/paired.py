"""Paired measures of one image set against the converged solve of the same captions and noise, and the budget.

Each with a 95% bootstrap interval: adherence and soft adherence deltas, latent MSE, image PSNR and SSIM against
the converged images, domain FID and KID deltas against held-out renders (both sets resampled with the same
indices, recentred). The budget (`decide`): adherence and soft adherence may each lose at most ADHERENCE_BUDGET
(interval wholly above the line "within", wholly below "over", across it "undecided"); FID and KID may rise at most
DISTANCE_BUDGET_REL of the converged images' own, voting only where their interval resolves that margin. Latent
MSE, PSNR and SSIM decide nothing (a solver's latent error is not a loss of quality by itself). Any "over" decides.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sdperf.refmodel import domain_quality

ADHERENCE_BUDGET = 0.01  # at most 1 point of adherence (and of soft adherence) lost against the converged solve
DISTANCE_BUDGET_REL = 0.10  # FID / KID may rise at most 10% of the converged images' own distance to the real renders
HALF_WIDTH_GOAL = 0.005  # n large enough that the adherence interval's half-width is at most 0.5 point
N_DISTANCE_RESAMPLES = 200
WITHIN, OVER, UNDECIDED = "within budget", "over budget", "undecided"


@dataclass
class Judged:
    """One image set and what the evaluator reads in it, in caption order."""

    latents: torch.Tensor
    images: np.ndarray
    adherence: np.ndarray
    soft: np.ndarray
    features: torch.Tensor

    @classmethod
    def of(cls, net, latents: torch.Tensor, images: np.ndarray, truth: np.ndarray) -> "Judged":
        from sdperf.refmodel import evaluator

        return cls(latents, images, evaluator.adherence_checks(evaluator.predict(net, images), truth),
                   evaluator.soft_adherence(evaluator.probabilities(net, images), truth),
                   evaluator.features(net, images))

    def __len__(self) -> int:
        return len(self.images)

    def take(self, n: int) -> "Judged":
        return Judged(self.latents[:n], self.images[:n], self.adherence[:n], self.soft[:n], self.features[:n])


def psnr(images: np.ndarray, base: np.ndarray) -> np.ndarray:
    """PSNR in dB of each 8-bit image against its twin (inf where identical)."""
    a, b = images.astype(np.float64) / 255, base.astype(np.float64) / 255
    mse = ((a - b) ** 2).reshape(len(a), -1).mean(axis=1)
    with np.errstate(divide="ignore"):
        return np.where(mse == 0, np.inf, 10 * np.log10(1.0 / mse))


def ssim(images: np.ndarray, base: np.ndarray) -> np.ndarray:
    """SSIM of each 8-bit image against its twin (torchmetrics, 11-pixel Gaussian window, data range 1)."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    def t(x):
        return torch.as_tensor(x).permute(0, 3, 1, 2).double() / 255

    kernel = min(11, images.shape[1] - (1 - images.shape[1] % 2))  # odd and no larger than the image
    return structural_similarity_index_measure(t(images), t(base), data_range=1.0, kernel_size=kernel,
                                               reduction="none").numpy()


class KidTo:
    """features -> KID against `real`: the unbiased MMD^2 with torchmetrics' cubic kernel, for unequal set sizes."""

    def __init__(self, real: torch.Tensor):
        from torchmetrics.image.kid import poly_kernel

        self.kernel, self.real = poly_kernel, real.double()
        m = len(self.real)
        k_rr = poly_kernel(self.real, self.real)
        self.real_term = float((k_rr.sum() - k_rr.diagonal().sum()) / (m * (m - 1)))

    def __call__(self, fake: torch.Tensor) -> float:
        f = fake.double()
        n = len(f)
        k_ff = self.kernel(f, f)
        return self.real_term + float((k_ff.sum() - k_ff.diagonal().sum()) / (n * (n - 1))) \
            - 2 * float(self.kernel(self.real, f).mean())

    def resampled(self, fake: torch.Tensor, counts: np.ndarray) -> np.ndarray:
        """The KID of each resample `counts` describes: with draw counts c, its kernel sum is c' K c - c . diag(K)."""
        f, w = fake.double(), torch.as_tensor(counts, dtype=torch.float64)
        n = float(w[0].sum())
        k_ff = self.kernel(f, f)
        pairs = ((w @ k_ff) * w).sum(dim=1) - w @ k_ff.diagonal()
        cross = w @ self.kernel(self.real, f).sum(dim=0) / (len(self.real) * n)
        return (self.real_term + pairs / (n * (n - 1)) - 2 * cross).numpy()


def kid_to(real: torch.Tensor) -> KidTo:
    return KidTo(real)


def kid(fake: torch.Tensor, real: torch.Tensor) -> float:
    """KID of one set against `real` (see kid_to)."""
    return kid_to(real)(fake)


def distance_delta(variant: torch.Tensor, base: torch.Tensor, of, seed: int = 0,
                   n_resamples: int = N_DISTANCE_RESAMPLES) -> tuple[float, float, float]:
    """(of(variant) - of(base), low, high): both sets resampled with the same indices, recentred (`of`: FidTo/KidTo)."""
    counts = domain_quality.draws(np.random.default_rng(seed), len(base), n_resamples)
    deltas = of.resampled(variant, counts) - of.resampled(base, counts)
    d = of(variant) - of(base)
    return (d, *domain_quality.recentred(d, deltas))


def interval_verdict(lo: float, hi: float, line: float, higher_is_worse: bool = False) -> str:
    """WITHIN when the whole interval is on the good side of `line`, OVER when wholly on the bad side."""
    if higher_is_worse:
        return WITHIN if hi <= line else OVER if lo > line else UNDECIDED
    return WITHIN if lo >= line else OVER if hi < line else UNDECIDED


def resolved(lo: float, hi: float, margin: float) -> bool:
    """Whether an interval is narrow enough to tell a change of `margin` from none (half-width <= margin)."""
    return margin > 0 and (hi - lo) / 2 <= margin


def measures(judged: Judged, base: Judged, real: domain_quality.Real) -> dict:
    """Every paired measure of `judged` against the converged `base`, with intervals and verdicts."""
    out = dict(n_images=len(judged))
    out["adherence"], out["adherence_lo"], out["adherence_hi"] = domain_quality.mean_interval(judged.adherence)
    out["adherence_delta"], out["adherence_delta_lo"], out["adherence_delta_hi"] = \
        domain_quality.paired_delta(judged.adherence, base.adherence)
    out["soft_adherence"] = float(judged.soft.mean())
    out["soft_adherence_delta"], out["soft_adherence_delta_lo"], out["soft_adherence_delta_hi"] = \
        domain_quality.paired_delta(judged.soft, base.soft)
    from sdperf.judge.converged import latent_mse

    out["latent_mse"], out["latent_mse_lo"], out["latent_mse_hi"] = \
        domain_quality.mean_interval(latent_mse(judged.latents, base.latents))
    p = psnr(judged.images, base.images)
    out["psnr_db_median"] = float(np.percentile(p, 50, method="lower"))  # "lower": no inf - inf between identicals
    out["psnr_db_p10"] = float(np.percentile(p, 10, method="lower"))
    out["ssim"], out["ssim_lo"], out["ssim_hi"] = domain_quality.mean_interval(ssim(judged.images, base.images))
    fid_of = domain_quality.fid_to(real)
    out["domain_fid"] = fid_of(judged.features)
    out["fid_delta"], out["fid_delta_lo"], out["fid_delta_hi"] = distance_delta(judged.features, base.features, fid_of)
    kid_of = kid_to(real.features)
    base_fid, base_kid = fid_of(base.features), kid_of(base.features)
    out["kid"] = kid_of(judged.features)
    out["kid_delta"], out["kid_delta_lo"], out["kid_delta_hi"] = distance_delta(judged.features, base.features, kid_of)
    out["fid_margin"], out["kid_margin"] = DISTANCE_BUDGET_REL * base_fid, DISTANCE_BUDGET_REL * max(base_kid, 0.0)
    out.update(decide(out))
    return out


def decide(m: dict) -> dict:
    """Each deciding measure's verdict (or why it does not vote) and the overall one, from the interval columns."""
    votes = {"adherence": interval_verdict(m["adherence_delta_lo"], m["adherence_delta_hi"], -ADHERENCE_BUDGET),
             "soft_adherence": interval_verdict(m["soft_adherence_delta_lo"], m["soft_adherence_delta_hi"],
                                                -ADHERENCE_BUDGET)}
    for name in ("fid", "kid"):
        lo, hi, margin = m[f"{name}_delta_lo"], m[f"{name}_delta_hi"], m[f"{name}_margin"]
        if resolved(lo, hi, margin):
            votes[name] = interval_verdict(lo, hi, margin, higher_is_worse=True)
        else:
            votes[name] = f"unresolved at n={int(m['n_images'])}"
    deciding = [v for v in votes.values() if v in (WITHIN, OVER, UNDECIDED)]
    overall = OVER if OVER in deciding else WITHIN if all(v == WITHIN for v in deciding) else UNDECIDED
    return {**{f"{k}_verdict": v for k, v in votes.items()}, "quality_verdict": overall}


def settled(adherence: np.ndarray, soft: np.ndarray) -> bool:
    """Whether both adherence intervals are clear of the budget line or at most HALF_WIDTH_GOAL wide each side."""
    for deltas in (adherence, soft):
        _, lo, hi = domain_quality.mean_interval(deltas)
        if not (lo >= -ADHERENCE_BUDGET or hi < -ADHERENCE_BUDGET or (hi - lo) / 2 <= HALF_WIDTH_GOAL):
            return False
    return True


def budget_text() -> str:
    return (f"against the converged fp32 solve: adherence and soft adherence each lose at most "
            f"{ADHERENCE_BUDGET * 100:g} point (95% paired interval above -{ADHERENCE_BUDGET:g}); domain FID and KID "
            f"rise at most {DISTANCE_BUDGET_REL:.0%} of the converged images' own, voting only where their interval "
            f"resolves that margin")
