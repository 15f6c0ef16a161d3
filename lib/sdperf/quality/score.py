"""Scoring image sets: Inception statistics (mergeable) and per-image CLIP scores, streamed in batches.

Images are read from disk a batch at a time, so 30,000 images cost one batch of memory, and each set's statistics
can be saved per shard (fid.save_stats) and merged later (fid.merge).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sdperf.quality import clip as clip_mod
from sdperf.quality import fid
from sdperf.imagegen import read_manifest
from sdperf.quality.images import image_files, load_for_scoring, standin_images
from sdperf.quality.quality_settings import QualitySettings


@dataclass
class Scorers:
    """The two scoring networks and how images reach them."""

    inception: torch.nn.Module
    clip: clip_mod.ClipScorer | None
    size: int | None
    batch: int
    num_features: int

    @classmethod
    def from_settings(cls, s: QualitySettings, seed: int, with_clip: bool = True) -> "Scorers":
        net = fid.inception(s.inception_weights, s.fid_features, seed=seed)
        scorer = clip_mod.load(s.clip_arch, s.clip_weights, seed=seed) if with_clip else None
        return cls(net, scorer, s.score_resolution, s.score_batch, s.fid_features)


@dataclass
class SetScore:
    """One image set: its Inception statistics and, when captions were given, a CLIP score per image."""

    stats: object  # torchmetrics FrechetInceptionDistance holding the sums on the "fake" side
    clip: np.ndarray | None

    @property
    def n(self) -> int:
        return fid.num_samples(self.stats)


def score_files(scorers: Scorers, paths: list, captions: list[str] | None = None) -> SetScore:
    stats = fid.new_stats(scorers.num_features)
    clip_scores = []
    for i in range(0, len(paths), scorers.batch):
        u8, pil = load_for_scoring(paths[i:i + scorers.batch], scorers.size)
        fid.add(stats, fid.features(scorers.inception, u8, scorers.batch))
        if captions is not None and scorers.clip is not None:
            clip_scores.append(scorers.clip.scores(pil, list(captions[i:i + scorers.batch]), scorers.batch))
    clip_arr = torch.cat(clip_scores).numpy() if clip_scores else None
    return SetScore(stats, clip_arr)


def score_manifest(scorers: Scorers, manifest: pd.DataFrame) -> dict[float, SetScore]:
    """A generated-image folder's manifest scored per guidance scale (one point of the curve each)."""
    return {float(g): score_files(scorers, list(rows["path"]), list(rows["caption"]))
            for g, rows in manifest.groupby("guidance", sort=True)}


def score_folder(scorers: Scorers, folder: Path) -> dict[float, SetScore]:
    return score_manifest(scorers, read_manifest(folder))


@dataclass
class Reference:
    mu: torch.Tensor
    sigma: torch.Tensor
    n: int | None
    what: str


def reference(scorers: Scorers, s: QualitySettings, n_standin: int, seed: int) -> Reference:
    """Real-image statistics from a folder or an .npz, or a seeded stand-in set when none is given."""
    if s.reference is None:
        u8 = standin_images(n_standin, s.score_resolution or 256, seed)
        stats = fid.add(fid.new_stats(scorers.num_features), fid.features(scorers.inception, u8, scorers.batch))
        return Reference(*fid.mu_sigma(stats), n_standin,
                         f"{n_standin} seeded stand-in images (smooth colour fields): machinery only")
    if s.reference.is_dir():
        files = image_files(s.reference)
        scored = score_files(scorers, files)
        return Reference(*fid.mu_sigma(scored.stats), scored.n, f"{scored.n} real images in {s.reference}")
    mu, sigma, n = fid.load_reference(s.reference, scorers.num_features)
    return Reference(mu, sigma, n, f"precomputed statistics {s.reference} (n={n or 'not stored'})")


def fid_against(ref: Reference, scored: SetScore) -> float:
    return fid.frechet_distance(ref.mu, ref.sigma, *fid.mu_sigma(scored.stats))
