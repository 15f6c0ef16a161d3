"""FID through torchmetrics: the Inception feature network, mergeable feature statistics, and the distance.

The feature network is torchmetrics' (torch-fidelity's) FID Inception-v3, always built from a local weights file: the
real one a user gives, or a seeded random state dict of the same architecture, so CI and a real run make the same
call and nothing is downloaded. Statistics are torchmetrics' own running sums, so shards computed apart merge exactly
(`merge`) and save to an .npz that also holds mu and sigma, the form MLPerf ships its COCO reference in.
"""
from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
import torch
from torchmetrics.image.fid import FrechetInceptionDistance, NoTrainInceptionV3, _compute_fid

from sdperf.core.errors import ConfigError
from sdperf.store.results import atomic_write_bytes

SIDES = ("real", "fake")
STATE = ("features_sum", "features_cov_sum", "features_num_samples")


def random_inception_state(seed: int) -> dict[str, torch.Tensor]:
    """A seeded random state dict of the FID Inception-v3 (torchvision's layer names are torch-fidelity's). He-normal
    convolutions keep activations at a steady scale through the 94 layers under eval-mode batch norm at unit
    statistics (torchvision's own init makes them grow to ~1e11)."""
    from torchvision.models import inception_v3

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = inception_v3(weights=None, aux_logits=False, init_weights=False, num_classes=1008)
        for m in net.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
    return net.state_dict()


def inception(weights: Path | None, num_features: int = 2048, seed: int = 0) -> NoTrainInceptionV3:
    """torchmetrics' FID Inception returning `num_features` features per uint8 image, from a local file."""
    if weights is not None:
        weights = Path(weights)
        if not weights.is_file():
            raise ConfigError(f"Inception weights {str(weights)!r} do not exist; expected a torch-fidelity "
                              "Inception-v3 state dict (weights-inception-2015-12-05-6726825d.pth)")
        state = tensors_only(weights)
    else:
        state = random_inception_state(seed)
    # torch-fidelity unpickles its weights file with weights_only=False (code can run from a crafted file), so it
    # only ever gets a file written here, from tensors already loaded safely
    with tempfile.TemporaryDirectory(prefix="sdperf-inception-") as tmp:
        path = Path(tmp) / "inception-state.pth"
        torch.save(state, path)
        return _build(path, num_features, shown=weights)


def tensors_only(path: Path) -> dict[str, torch.Tensor]:
    """A state dict read with torch.load(weights_only=True): a file holding anything but tensors in plain
    containers (a pickled callable, an object) is refused before any of its code can run."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # the unpickler's refusal, a truncated or non-torch file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"Inception weights {str(path)!r} were refused: not a plain tensor state dict "
                          f"(torch.load with weights_only=True: {first}); expected torch-fidelity's "
                          "weights-inception-2015-12-05-6726825d.pth") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"Inception weights {str(path)!r} hold a {type(state).__name__}, not a state dict of "
                          "tensors; expected torch-fidelity's weights-inception-2015-12-05-6726825d.pth")
    return state


def _build(path: Path, num_features: int, shown: Path | None = None) -> NoTrainInceptionV3:
    try:
        return NoTrainInceptionV3(name="inception-v3-compat", features_list=[str(num_features)],
                                  feature_extractor_weights_path=str(path))
    except (RuntimeError, KeyError, ValueError) as exc:
        raise ConfigError(f"Inception weights {str(shown or path)!r} could not be loaded ({exc}); expected a "
                          "torch-fidelity Inception-v3 state dict") from exc


@torch.inference_mode()
def features(net: NoTrainInceptionV3, images: torch.Tensor, batch: int = 16) -> torch.Tensor:
    """Inception features of uint8 NCHW images (torchmetrics resizes to 299 inside), float64 on the CPU."""
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected uint8 images of shape (N, 3, H, W), got {images.dtype} {tuple(images.shape)}")
    return torch.cat([net(images[i:i + batch]).double().cpu() for i in range(0, len(images), batch)])


class _Given(torch.nn.Module):
    """A 'feature network' that hands back features computed elsewhere, so torchmetrics keeps the sums."""

    def __init__(self, num_features: int):
        super().__init__()
        self.num_features = num_features

    def forward(self, x):
        return x


def new_stats(num_features: int) -> FrechetInceptionDistance:
    """Empty running statistics of both sides; `add` features, `merge` shards, `mu_sigma` for the Gaussian."""
    return FrechetInceptionDistance(feature=_Given(num_features), reset_real_features=False)


def add(stats: FrechetInceptionDistance, feats: torch.Tensor, side: str = "fake") -> FrechetInceptionDistance:
    _check_side(side)
    stats.update(feats.double(), real=side == "real")
    return stats


def stats_of(feats: torch.Tensor, side: str = "fake") -> FrechetInceptionDistance:
    return add(new_stats(feats.shape[1]), feats, side)


def merge(parts) -> FrechetInceptionDistance:
    """One set of statistics from shards' (torchmetrics merge_state: sums and outer products add up)."""
    parts = list(parts)
    if not parts:
        raise ValueError("merge needs at least one set of statistics")
    out = new_stats(int(parts[0].real_features_sum.shape[0]))
    for p in parts:
        out.merge_state(p)
    return out


def num_samples(stats: FrechetInceptionDistance, side: str = "fake") -> int:
    return int(getattr(stats, f"{side}_features_num_samples"))


def _check_side(side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"side {side!r} is not valid; choose one of: {', '.join(SIDES)}")


def mu_sigma(stats: FrechetInceptionDistance, side: str = "fake") -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased covariance from the sums, as FrechetInceptionDistance.compute() derives them."""
    _check_side(side)
    n = num_samples(stats, side)
    if n < 2:
        raise ValueError(f"{side} statistics hold {n} sample(s); a covariance needs at least 2")
    total, outer = getattr(stats, f"{side}_features_sum"), getattr(stats, f"{side}_features_cov_sum")
    mu = total / n
    sigma = (outer - n * torch.outer(mu, mu)) / (n - 1)
    return mu, sigma


def save_stats(stats: FrechetInceptionDistance, path: Path, side: str = "fake") -> Path:
    """An .npz with the sums (mergeable) and mu/sigma (what pytorch-fid and MLPerf's val2014.npz hold)."""
    _check_side(side)
    arrays = {name: getattr(stats, f"{side}_{name}").cpu().numpy() for name in STATE}
    if num_samples(stats, side) >= 2:
        mu, sigma = mu_sigma(stats, side)
        arrays.update(mu=mu.numpy(), sigma=sigma.numpy())
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(Path(path), buf.getvalue())
    return Path(path)


def load_stats(path: Path, side: str = "fake") -> FrechetInceptionDistance:
    """Statistics saved by save_stats, on `side` of a new accumulator (ready to merge with other shards)."""
    _check_side(side)
    data = _read_npz(path)
    if not set(STATE) <= set(data):
        raise ConfigError(f"statistics file {str(path)!r} holds {sorted(data)}; expected the sums "
                          f"{', '.join(STATE)} (written by sdperf.quality.fid.save_stats)")
    stats = new_stats(int(data["features_sum"].shape[0]))
    incoming = {f"{s}_{name}": torch.zeros_like(getattr(stats, f"{s}_{name}")) for s in SIDES for name in STATE}
    incoming.update({f"{side}_{name}": torch.as_tensor(data[name]) for name in STATE})
    stats.merge_state(incoming)
    return stats


def load_reference(path: Path, num_features: int) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """(mu, sigma, n or None) from an .npz: MLPerf's / pytorch-fid's (mu, sigma) or this module's sums."""
    data = _read_npz(path)
    if "mu" in data and "sigma" in data:
        mu, sigma = torch.as_tensor(data["mu"]).double(), torch.as_tensor(data["sigma"]).double()
        n = int(data["features_num_samples"]) if "features_num_samples" in data else None
    elif set(STATE) <= set(data):
        stats = load_stats(path, "real")
        (mu, sigma), n = mu_sigma(stats, "real"), num_samples(stats, "real")
    else:
        raise ConfigError(f"reference statistics {str(path)!r} hold {sorted(data)}; expected 'mu' and 'sigma' "
                          "(as MLPerf's val2014.npz) or the sums written by save_stats")
    if mu.shape != (num_features,) or sigma.shape != (num_features, num_features):
        raise ConfigError(f"reference statistics {str(path)!r} have {tuple(mu.shape)} / {tuple(sigma.shape)} "
                          f"features; the profile's quality.fid_features is {num_features}")
    return mu, sigma, n


def _read_npz(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"statistics file {str(path)!r} does not exist; expected an .npz of Inception statistics")
    try:
        with np.load(path) as npz:
            return {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"statistics file {str(path)!r} is not a readable .npz ({exc})") from exc


def frechet_distance(mu1: torch.Tensor, sigma1: torch.Tensor, mu2: torch.Tensor, sigma2: torch.Tensor) -> float:
    """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^1/2), torchmetrics' implementation, in float64.
    FID is >= 0; the eigenvalue route gives about -1e-10 for identical sets, which is shown as 0."""
    return max(0.0, float(_compute_fid(mu1.double(), sigma1.double(), mu2.double(), sigma2.double())))


def frechet_distances(mu: torch.Tensor, sigma: torch.Tensor, mu2: torch.Tensor, sigma2: torch.Tensor) -> np.ndarray:
    """frechet_distance of every (mu[i], sigma[i]) against one (mu2, sigma2): torchmetrics' formula over a leading
    batch dimension, so a bootstrap's resamples take one batched eigenvalue call instead of one each."""
    mu, sigma, mu2, sigma2 = (t.double() for t in (mu, sigma, mu2, sigma2))
    a = (mu - mu2).square().sum(dim=-1)
    b = sigma.diagonal(dim1=-2, dim2=-1).sum(dim=-1) + sigma2.trace()
    c = torch.linalg.eigvals(sigma @ sigma2).sqrt().real.sum(dim=-1)
    return (a + b - 2 * c).clamp(min=0.0).numpy()


def fid(a: FrechetInceptionDistance, b: FrechetInceptionDistance, side_a: str = "fake", side_b: str = "fake") -> float:
    return frechet_distance(*mu_sigma(a, side_a), *mu_sigma(b, side_b))
