"""Scoring a generated folder per shard: merged Inception statistics and CLIP scores equal the whole set's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sdperf.core.errors import ConfigError
from sdperf.imagegen import generate_folder
from sdperf.quality.sharded import merge_scores, score_folder, score_shard
from sdperf.model.prompts import smoke_captions
from sdperf.quality import clip, fid
from sdperf.quality.images import read_manifest
from sdperf.quality.score import Scorers, score_manifest

GUIDANCE = [1.0, 7.5]


@pytest.fixture(scope="module")
def folder(smoke, tiny_pipe, tmp_path_factory):
    out = tmp_path_factory.mktemp("generated")
    generate_folder(smoke, smoke_captions()[:5], out, GUIDANCE, pipe=tiny_pipe, progress=False)
    return out


class _ColourClip(torch.nn.Module):
    """A stand-in CLIP whose score varies from image to image (a random-init CLIP clamps every cosine to 0 here),
    so a merge that put the scores in the wrong order would fail; what is tested is the merge, not CLIP."""

    def encode_image(self, x):
        return x.mean((2, 3))

    def encode_text(self, t):
        return t


def _tokens(texts):
    return torch.tensor([[len(t), t.count("a") + 1, t.count("e") + 1] for t in texts], dtype=torch.float32)


@pytest.fixture(scope="module")
def scorers():
    """Random-init Inception (the 64-feature layer: quick) and the stand-in CLIP."""
    from torchvision.transforms.functional import to_tensor

    colour = clip.ClipScorer(_ColourClip(), _tokens, to_tensor, "colour stand-in")
    return Scorers(fid.inception(None, 64, seed=0), colour, size=None, batch=3, num_features=64)


def _sums(stats) -> list[np.ndarray]:
    return [getattr(stats, f"fake_{n}").numpy() for n in fid.STATE]


@pytest.mark.parametrize("world_size", [2, 3])
def test_merged_shards_equal_the_whole_folder(folder, scorers, world_size):
    whole = score_manifest(scorers, read_manifest(folder))
    for rank in range(world_size):  # independent shards, as batch jobs would run them
        assert score_folder(folder, scorers, "test", rank=rank, world_size=world_size) is None
    merged = merge_scores(folder, "test", world_size)
    assert sorted(merged) == sorted(whole) == GUIDANCE
    for g in GUIDANCE:
        assert fid.num_samples(merged[g].stats) == fid.num_samples(whole[g].stats) == 5
        for got, want in zip(_sums(merged[g].stats), _sums(whole[g].stats)):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)  # sums: only the adding order differs
        np.testing.assert_allclose(merged[g].clip, whole[g].clip, rtol=1e-6)  # per image, in manifest order
        assert np.ptp(merged[g].clip) > 0  # five different images: the order check can fail
    mu, sigma = fid.mu_sigma(merged[7.5].stats)
    assert fid.frechet_distance(mu, sigma, *fid.mu_sigma(whole[1.0].stats)) == pytest.approx(
        fid.fid(whole[7.5].stats, whole[1.0].stats), rel=1e-6)


def test_a_missing_shard_is_named_before_merging(folder, scorers):
    score_shard(folder, scorers, "partial", rank=0, world_size=2)
    with pytest.raises(ConfigError, match="lacks rank-1.npz, rank-1-clip.csv: every rank of the 2-rank scoring"):
        merge_scores(folder, "partial", 2)
    with pytest.raises(ConfigError, match="holds no scores"):
        merge_scores(folder, "never", 2)


def test_shards_split_the_images_between_ranks(folder, scorers):
    counts = []
    for rank in range(2):
        score_shard(folder, scorers, "split", rank=rank, world_size=2)
        stats = fid.load_stats(folder / "scores" / "split" / "world-2" / "g7.5" / f"rank-{rank}.npz")
        counts.append(fid.num_samples(stats))
    assert sum(counts) == 5 and min(counts) >= 2  # every image once, balanced to one
