"""FID: the distance against an independent closed form, statistics that merge across shards, the Inception
feature network built from a local file (real path) or a seeded random file (CI path), and clear errors."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from sdperf.core.errors import ConfigError
from sdperf.quality import fid


def _gaussian(n, mu, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return mu + torch.randn(n, len(mu), generator=g, dtype=torch.float64) * scale


def _closed_form(mu1, s1, mu2, s2) -> float:
    """Written out with scipy's sqrtm, apart from torchmetrics' eigenvalue route."""
    covmean = scipy.linalg.sqrtm(s1 @ s2).real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


def test_fid_of_a_feature_set_against_itself_is_zero():
    feats = _gaussian(300, torch.zeros(16), 1.0, seed=0)
    stats = fid.stats_of(feats)
    assert abs(fid.fid(stats, stats)) < 1e-6


def test_fid_of_two_gaussian_sets_matches_the_closed_form():
    d = 12
    mu1, mu2 = torch.zeros(d, dtype=torch.float64), torch.linspace(0, 1, d, dtype=torch.float64)
    scale1, scale2 = torch.linspace(0.5, 1.5, d, dtype=torch.float64), torch.full((d,), 0.8, dtype=torch.float64)
    a, b = _gaussian(4000, mu1, scale1, 1), _gaussian(4000, mu2, scale2, 2)
    measured = fid.fid(fid.stats_of(a), fid.stats_of(b))
    # the same sample moments through scipy: agreement to float precision
    sample = _closed_form(a.mean(0).numpy(), np.cov(a.numpy().T), b.mean(0).numpy(), np.cov(b.numpy().T))
    assert measured == pytest.approx(sample, rel=1e-6)
    # the population Gaussians (diagonal covariances: sqrt of the product is the product of the scales)
    population = float(((mu1 - mu2) ** 2).sum() + ((scale1 - scale2) ** 2).sum())
    assert measured == pytest.approx(population, rel=0.04)  # sampling error of 4,000 draws
    assert measured > 0.3  # the sets really differ, so the test could fail


def test_per_shard_statistics_merge_to_the_whole_set(tmp_path):
    feats = _gaussian(90, torch.arange(8, dtype=torch.float64), 2.0, seed=3)
    whole = fid.stats_of(feats)
    paths = [fid.save_stats(fid.stats_of(part), tmp_path / f"shard{i}.npz")
             for i, part in enumerate(torch.split(feats, [40, 31, 19]))]
    merged = fid.merge(fid.load_stats(p) for p in paths)
    assert fid.num_samples(merged) == 90
    for got, want in zip(fid.mu_sigma(merged), fid.mu_sigma(whole)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fid.mu_sigma(whole)[1], torch.cov(feats.T), rtol=1e-10, atol=1e-10)
    with np.load(paths[0]) as npz:  # mu/sigma stored beside the sums, as MLPerf's reference holds them
        assert {"mu", "sigma", "features_sum", "features_cov_sum", "features_num_samples"} <= set(npz.files)


def test_reference_npz_with_only_mu_and_sigma(tmp_path):
    mu, sigma = np.arange(4.0), np.diag([1.0, 2.0, 3.0, 4.0])
    np.savez(tmp_path / "val2014.npz", mu=mu, sigma=sigma)
    got_mu, got_sigma, n = fid.load_reference(tmp_path / "val2014.npz", num_features=4)
    assert n is None and np.allclose(got_mu.numpy(), mu) and np.allclose(got_sigma.numpy(), sigma)
    with pytest.raises(ConfigError, match="fid_features is 2048"):
        fid.load_reference(tmp_path / "val2014.npz", num_features=2048)
    np.savez(tmp_path / "other.npz", m=mu)
    with pytest.raises(ConfigError, match="expected 'mu' and 'sigma'"):
        fid.load_reference(tmp_path / "other.npz", num_features=4)


def test_missing_inception_weights_name_the_path_and_what_was_expected(tmp_path):
    path = tmp_path / "pt_inception.pth"
    with pytest.raises(ConfigError) as err:
        fid.inception(path)
    assert str(path) in str(err.value) and "Inception-v3 state dict" in str(err.value)
    with pytest.raises(ConfigError, match="does not exist"):
        fid.load_stats(tmp_path / "none.npz")


def test_random_inception_goes_through_the_weights_file_path_and_is_seeded():
    """The CI network: the real architecture from a seeded state-dict file; finite, non-constant features."""
    images = torch.randint(0, 256, (3, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    net = fid.inception(None, num_features=64, seed=0)
    a, b = fid.features(net, images), fid.features(fid.inception(None, num_features=64, seed=0), images)
    c = fid.features(fid.inception(None, num_features=64, seed=1), images)
    assert a.shape == (3, 64) and torch.isfinite(a).all() and a.std() > 0
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ValueError, match="uint8"):
        fid.features(net, images.float())
