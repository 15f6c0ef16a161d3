"""Every setting of `sdperf train-reference`, checked before anything is built; its digest names the work folder.

The defaults are sized so that the whole command fits 45 minutes on 2 cores; the autoencoder trains long because
it is the model's ceiling. `QUICK` is the same code at a few steps, for the tests (not a usable model).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

from sdperf.core.errors import ConfigError

RESOLUTION = 32


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    resolution: int = RESOLUTION
    # the evaluator (fresh renders every step)
    evaluator_steps: int = 800
    evaluator_batch: int = 64
    evaluator_lr: float = 3e-3
    evaluator_held_out: int = 2000
    evaluator_min_accuracy: float = 0.98  # on every head and on adherence; below it the command stops
    # the autoencoder (fresh renders every step; reconstruction + a small KL term, as SD's first stage)
    vae_steps: int = 3000  # fewer left the decoder mixing colours
    vae_batch: int = 32
    vae_lr: float = 1e-3
    vae_kl: float = 1e-6
    vae_min_adherence: float = 0.95  # the evaluator's adherence on the reconstructions: checked before the UNet stage
    # the UNet and text encoder, trained together on pre-encoded latents under torchrun
    train_scenes: int = 40_000
    unet_steps: int = 3500
    unet_batch: int = 64  # in all, split between the ranks
    unet_lr: float = 1e-3
    warmup: int = 200
    caption_dropout: float = 0.1  # share of captions replaced by "" so classifier-free guidance works
    ema: float = 0.999
    world_size: int = 2
    checkpoint_every: int = 200
    # the judgement written into the manifest
    check_images: int = 500
    check_guidance: float = 7.5
    check_steps: int = 50

    def __post_init__(self):
        ints = {f.name for f in dataclasses.fields(self) if f.type in ("int", int)}
        for name in ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and name != "seed") or value < 0:
                raise ConfigError(f"reference recipe {name}={value!r} is not valid; choose an integer >= 1"
                                  + (" (seed: >= 0)" if name == "seed" else ""))
        for names, ok, what in ((("evaluator_lr", "vae_lr", "unet_lr", "vae_kl", "check_guidance"),
                                 lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
                                (("evaluator_min_accuracy", "vae_min_adherence"),
                                 lambda v: not isinstance(v, bool) and 0 <= v <= 1, "a number in [0, 1]"),
                                (("caption_dropout", "ema"), lambda v: 0 < v < 1, "a number in (0, 1)")):
            for name in names:
                value = getattr(self, name)
                if not isinstance(value, (int, float)) or not ok(value):
                    raise ConfigError(f"reference recipe {name}={value!r} is not valid; choose {what}")
        if self.resolution % 16:
            raise ConfigError(f"reference recipe resolution={self.resolution} is not valid; choose a multiple of 16")
        if self.unet_batch % self.world_size:
            raise ConfigError(f"reference recipe unet_batch={self.unet_batch} is not valid with world_size="
                              f"{self.world_size}; choose a multiple of the world size")
        if self.check_images < 2 or self.evaluator_held_out < 2:
            raise ConfigError("reference recipe check_images and evaluator_held_out must be >= 2 (a covariance)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Recipe":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"reference recipe keys {unknown} are not valid; valid keys: {', '.join(sorted(known))}")
        return cls(**d)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


QUICK = Recipe(evaluator_min_accuracy=0.0, vae_min_adherence=0.0, evaluator_steps=6, evaluator_batch=16,
               evaluator_held_out=32, vae_steps=6, vae_batch=8, train_scenes=64, unet_steps=6, unet_batch=8, warmup=2,
               checkpoint_every=2, check_images=8, check_steps=4)
