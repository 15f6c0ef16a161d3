"""A small CNN that reads a scene's ground truth back from an image: the study's CLIP and Inception in one.

It predicts each quadrant's shape (or none), colour and size, and the background: hence **prompt adherence**
(GenEval's object/attribute checks, exact here) and **domain FID** (on its EMBED features, as FID on MNIST uses a
LeNet's). It trains on fresh renders, lightly blurred and noised so that a slightly soft image is not judged wrong.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sdperf.refmodel import domain, loop

EMBED = 64  # penultimate features: the domain FID's feature space
HELD_OUT_SEED = 1_000_003  # the held-out renders' seed; no training stage draws from it
MIN_ACCURACY = 0.98  # on held-out renders, before any verdict of the evaluator is used
GATED = ("shape", "colour", "size", "background", "adherence")  # what MIN_ACCURACY applies to (not "scene")
N_QUADRANTS = len(domain.POSITIONS)
N_SHAPE, N_COLOUR, N_SIZE, N_BACKGROUND = 1 + len(domain.SHAPES), len(domain.COLOURS), len(domain.SIZES), \
    len(domain.BACKGROUNDS)
PER_QUADRANT = N_SHAPE + N_COLOUR + N_SIZE


def _stage(i: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
                         nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True), nn.MaxPool2d(2))


class Evaluator(nn.Module):
    """Four conv stages (resolution / 16 left), EMBED features, one linear layer of heads."""

    def __init__(self, resolution: int):
        super().__init__()
        if resolution % 16:
            raise ValueError(f"evaluator resolution {resolution} is not valid; choose a multiple of 16")
        self.resolution = resolution
        side = resolution // 16
        self.body = nn.Sequential(_stage(3, 32), _stage(32, 64), _stage(64, 128), _stage(128, 128))
        self.embed = nn.Sequential(nn.Flatten(), nn.Linear(128 * side * side, EMBED), nn.ReLU(inplace=True))
        self.heads = nn.Linear(EMBED, N_QUADRANTS * PER_QUADRANT + N_BACKGROUND)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(self.body(x))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.heads(self.features(x))
        q = out[:, :N_QUADRANTS * PER_QUADRANT].reshape(-1, N_QUADRANTS, PER_QUADRANT)
        return {"shape": q[..., :N_SHAPE], "colour": q[..., N_SHAPE:N_SHAPE + N_COLOUR],
                "size": q[..., N_SHAPE + N_COLOUR:], "background": out[:, N_QUADRANTS * PER_QUADRANT:]}


def to_input(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 NHWC -> float NCHW in [-1, 1]."""
    x = torch.as_tensor(images)
    if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[-1] != 3:
        raise ValueError(f"expected uint8 images of shape (N, H, W, 3), got {x.dtype} {tuple(x.shape)}")
    # contiguous NCHW: on a channels-last view oneDNN's result depends on the buffer, so twins would not read 0
    return x.permute(0, 3, 1, 2).contiguous().float().div(127.5).sub(1.0)


def _split(labels: torch.Tensor) -> dict[str, torch.Tensor]:
    q = labels[:, :3 * N_QUADRANTS].reshape(-1, N_QUADRANTS, 3)
    return {"shape": q[..., 0], "colour": q[..., 1], "size": q[..., 2], "background": labels[:, -1]}


def loss(logits: dict, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every head; colour and size only where a shape is."""
    target = _split(labels)
    return sum(F.cross_entropy(logits[k].reshape(-1, logits[k].shape[-1]), target[k].reshape(-1),
                               ignore_index=domain.IGNORE) for k in target)


@torch.inference_mode()
def predict(net: Evaluator, images, batch: int = 256) -> np.ndarray:
    """Labels in domain.labels' layout (empty quadrants: IGNORE colour and size), one row per image."""
    net.eval()
    rows = []
    for i in range(0, len(images), batch):
        out = net(to_input(images[i:i + batch]))
        shape, colour, size = (out[k].argmax(-1) for k in ("shape", "colour", "size"))
        empty = shape == domain.NONE
        colour[empty], size[empty] = domain.IGNORE, domain.IGNORE
        q = torch.stack([shape, colour, size], dim=-1).reshape(len(shape), -1)
        rows.append(torch.cat([q, out["background"].argmax(-1, keepdim=True)], dim=1))
    return torch.cat(rows).numpy()


@torch.inference_mode()
def probabilities(net: Evaluator, images, batch: int = 256) -> dict[str, np.ndarray]:
    """Each head's softmax per image (shape, colour, size: (N, quadrants, classes); background: (N, classes))."""
    net.eval()
    parts: dict[str, list] = {}
    for i in range(0, len(images), batch):
        for k, v in net(to_input(images[i:i + batch])).items():
            parts.setdefault(k, []).append(v.double().softmax(-1).numpy())
    return {k: np.concatenate(v) for k, v in parts.items()}


@torch.inference_mode()
def features(net: Evaluator, images, batch: int = 256) -> torch.Tensor:
    """EMBED penultimate features per image, float64: the domain FID's input."""
    net.eval()
    return torch.cat([net.features(to_input(images[i:i + batch])).double() for i in range(0, len(images), batch)])


def adherence_checks(predicted: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per image, the share of its caption's claims (domain.attributes) found in the prediction."""
    predicted, truth = np.atleast_2d(predicted), np.atleast_2d(truth)
    p = predicted[:, :3 * N_QUADRANTS].reshape(len(predicted), N_QUADRANTS, 3)
    t = truth[:, :3 * N_QUADRANTS].reshape(len(truth), N_QUADRANTS, 3)
    mentioned = t[..., 0] != domain.NONE
    found = p[..., 0] != domain.NONE
    right = (found[..., None] & (p == t)).sum(-1) + found  # found + shape + colour + size, per quadrant
    per_object = np.where(mentioned, right, 0).sum(1)
    count_ok = (found == mentioned).all(1)
    background_ok = predicted[:, -1] == truth[:, -1]
    claims = 4 * mentioned.sum(1) + 2
    return (per_object + count_ok + background_ok) / claims


def soft_adherence(probs: dict[str, np.ndarray], truth: np.ndarray) -> np.ndarray:
    """Per image, the mean probability of each claim `adherence_checks` counts: unlike them, it does not saturate."""
    truth = np.atleast_2d(truth)
    t = truth[:, :3 * N_QUADRANTS].reshape(len(truth), N_QUADRANTS, 3)
    mentioned = t[..., 0] != domain.NONE
    p_none = probs["shape"][..., domain.NONE]

    def at(p: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return np.take_along_axis(p, np.clip(labels, 0, p.shape[-1] - 1)[..., None], -1)[..., 0]

    per_quadrant = (1 - p_none) + at(probs["shape"], t[..., 0]) + at(probs["colour"], t[..., 1]) + \
        at(probs["size"], t[..., 2])
    per_object = np.where(mentioned, per_quadrant, 0).sum(1)
    count = np.where(mentioned, 1 - p_none, p_none).prod(1)
    background = at(probs["background"], truth[:, -1])
    return (per_object + count + background) / (4 * mentioned.sum(1) + 2)


def accuracy(predicted: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Per head on held-out renders, the adherence of real images to their own captions, and whole scenes."""
    p, t = _split(torch.as_tensor(predicted)), _split(torch.as_tensor(truth))
    present = t["shape"] != domain.NONE
    out = {"shape": float((p["shape"] == t["shape"]).float().mean()),
           "colour": float((p["colour"] == t["colour"])[present].float().mean()),
           "size": float((p["size"] == t["size"])[present].float().mean()),
           "background": float((p["background"] == t["background"]).float().mean())}
    out["adherence"] = float(adherence_checks(predicted, truth).mean())
    out["scene"] = float((predicted == truth).all(1).mean())
    return out


def held_out(n: int, resolution: int) -> tuple[list[domain.Scene], np.ndarray]:
    """The first n held-out scenes and their renders: the evaluator's test set and the FID's real side."""
    items = domain.scenes(HELD_OUT_SEED, n)
    return items, domain.render_many(items, resolution)


def _augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Mild blur on a third of the images and a little Gaussian noise on all."""
    from torchvision.transforms.functional import gaussian_blur

    blur = torch.rand(len(x), generator=g) < 1 / 3
    if blur.any():
        x = x.clone()
        x[blur] = gaussian_blur(x[blur], kernel_size=3, sigma=0.6)
    sigma = torch.rand(len(x), 1, 1, 1, generator=g) * 0.06
    return x + sigma * torch.randn(x.shape, generator=g)


@dataclass
class Trained:
    net: Evaluator
    curve: list[dict]
    accuracy: dict[str, float]
    n_held_out: int


def worst(acc: dict[str, float]) -> float:
    """The gated figure: the lowest of the per-head accuracies and the real images' adherence."""
    return min(acc[k] for k in GATED)


def train(seed: int, resolution: int, steps: int, batch: int, checkpoint: Path, lr: float = 3e-3,
          n_held_out: int = 2000, show: bool = True) -> Trained:
    """Train on fresh renders of `seed` (step s: scenes [s * batch, (s + 1) * batch)), resumably; test on held out."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = Evaluator(resolution)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.15)
    g = torch.Generator().manual_seed(seed)

    def step(s: int) -> float:
        items = domain.scenes(seed, batch, start=s * batch)
        x = _augment(to_input(domain.render_many(items, resolution)), g)
        y = torch.as_tensor(domain.labels_many(items))
        net.train()
        opt.zero_grad(set_to_none=True)
        value = loss(net(x), y)
        value.backward()
        opt.step()
        sched.step()
        return float(value.detach())

    parts = {"net": net, "optimizer": opt, "schedule": sched, "noise": loop.GeneratorState(g)}
    curve = loop.run(checkpoint, parts, steps, step, every=100, desc="evaluator", show=show)
    items, images = held_out(n_held_out, resolution)
    acc = accuracy(predict(net, images), domain.labels_many(items))
    return Trained(net.eval(), curve, acc, n_held_out)
