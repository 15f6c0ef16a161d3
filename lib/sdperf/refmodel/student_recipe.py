"""Every setting of `sdperf train-student`, one recipe per kind, checked before anything is built.

Three kinds of what CPU users deploy, each distilled from the committed reference model (the teacher):
`lcm`, a latent consistency student (Luo et al. 2023) with the guidance scale embedded (`time_cond_proj_dim`);
`guidance`, a guidance-distilled student (Meng et al. 2023, stage 1) returning the guided noise in one call;
`tiny-decoder`, a decoder of TAESD's architecture (diffusers `AutoencoderTiny`) trained on the teacher VAE's
decodes. The defaults are sized to fit about 30 minutes each on 2 cores; `quick()` is the same code at a few
steps, for the tests (not a usable model). The digest, with the teacher's weights, names the work folder.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

from sdperf.core.errors import ConfigError

KINDS = ("lcm", "guidance", "tiny-decoder")
FOLDERS = {"lcm": "lcm-student", "guidance": "guidance-student", "tiny-decoder": "tiny-decoder"}


@dataclass(frozen=True)
class StudentRecipe:
    kind: str
    seed: int = 0
    scenes: int = 20_000  # domain scenes encoded by the teacher's VAE: the students' data (never judged on)
    steps: int = 2500
    batch: int = 32
    lr: float = 1e-4
    warmup: int = 100
    checkpoint_every: int = 250
    # guidance scales trained on, as w = scale - 1 (diffusers' embedding of `guidance_scale - 1`)
    w_min: float = 3.0
    w_max: float = 11.0
    guidance_dim: int = 256  # time_cond_proj_dim, as diffusers' LCM UNets of SD 1.5
    # consistency distillation: the teacher's DDIM solver over `solver_steps` skipped steps, an EMA target
    solver_steps: int = 50
    target_ema: float = 0.95
    huber_c: float = 0.001
    # the tiny decoder: TAESD's blocks at this width (TAESD's own: 64), one up-sampling per VAE level
    decoder_width: int = 32
    # the judgement written into the manifest: adherence at the study's guidance, at this many steps
    check_images: int = 500
    check_guidance: float = 7.5
    check_steps: int = 4

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"student kind {self.kind!r} is not valid; choose one of: {', '.join(KINDS)}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)
                                           or value < (0 if f.name == "seed" else 1)):
                raise ConfigError(f"student recipe {f.name}={value!r} is not valid; choose an integer >= "
                                  f"{0 if f.name == 'seed' else 1}")
            if f.type in ("float", float) and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                               or not math.isfinite(value) or value < 0):
                raise ConfigError(f"student recipe {f.name}={value!r} is not valid; choose a finite number >= 0")
        if not 0 < self.target_ema < 1:
            raise ConfigError(f"student recipe target_ema={self.target_ema!r} is not valid; choose a number in (0, 1)")
        if self.w_max < self.w_min:
            raise ConfigError(f"student recipe w_min={self.w_min} > w_max={self.w_max}; choose w_min <= w_max")
        if not self.w_min <= self.check_guidance - 1 <= self.w_max:
            raise ConfigError(f"student recipe check_guidance={self.check_guidance} lies outside the trained "
                              f"scales {self.w_min + 1}-{self.w_max + 1}; choose one inside")
        if self.check_images < 2:
            raise ConfigError("student recipe check_images must be >= 2 (a covariance)")

    @property
    def folder(self) -> str:
        return FOLDERS[self.kind]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StudentRecipe":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"student recipe keys {unknown} are not valid; valid keys: {', '.join(sorted(known))}")
        return cls(**d)

    def digest(self, teacher: str = "") -> str:
        what = json.dumps({"recipe": self.to_dict(), "teacher": teacher}, sort_keys=True)
        return hashlib.sha256(what.encode()).hexdigest()[:12]


DEFAULTS = {
    "lcm": dict(steps=2500, batch=32, lr=1e-4, check_steps=4),
    "guidance": dict(steps=2000, batch=32, lr=2e-4, check_steps=10),
    "tiny-decoder": dict(steps=3000, batch=64, lr=1e-3, check_steps=50),
}


def recipe(kind: str, seed: int = 0) -> StudentRecipe:
    if kind not in KINDS:
        raise ConfigError(f"student kind {kind!r} is not valid; choose one of: {', '.join(KINDS)}")
    return StudentRecipe(kind=kind, seed=seed, **DEFAULTS[kind])


def quick(kind: str, seed: int = 0) -> StudentRecipe:
    """A few steps of the same code at a few scenes: checks the command, not a model."""
    return dataclasses.replace(recipe(kind, seed), scenes=64, steps=4, batch=4, warmup=1, checkpoint_every=2,
                               check_images=8)
