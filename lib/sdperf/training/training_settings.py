"""The profile's `training:` section, validated before any model is built or any process is spawned.

Every key is required (a profile says what it trains and why, nothing is derived silently); a bad value raises
ConfigError naming the profile, the key, the value and the valid choices. Torch is not imported here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from sdperf.config import architectures
from sdperf.core.errors import ConfigError

ENGINES = ("ddp", "zero1", "zero2")
BACKENDS = ("auto", "gloo", "nccl")
AUTOCAST = ("none", "bfloat16", "float16")
DATA = ("synthetic", "encoded")
ZERO_STAGES = (1, 2)
AUTO = "auto"


@dataclass(frozen=True)
class TrainingSettings:
    """One profile's training study; see params/*.yml for why each value was chosen."""

    unet_width: float  # fraction of the architecture's UNet channel widths (1.0 = the real UNet)
    resolution: int  # image pixels per side; latents are resolution / VAE scale factor
    world_sizes: tuple[int, ...] | str  # ranks per configuration, or "auto": 1, 2, 4, ... up to the devices here
    batch_sizes: tuple[int, ...]  # per-rank micro batch sizes
    samples: int  # dataset size (latent + text embedding pairs)
    data: str  # "synthetic" (random tensors of the right shapes) or "encoded" (the pipeline's VAE + text encoder)
    images_dir: str | None  # user images for data: encoded; None = seeded generated test patterns
    warmup_steps: int  # steps before the timed ones, counting the separately timed first step
    steps: int  # timed steps per configuration
    learning_rate: float
    weight_decay: float
    max_grad_norm: float
    autocast: str  # "none" (fp32), "bfloat16" or "float16" (with a gradient scaler)
    backend: str  # "auto" (nccl on CUDA, gloo on CPU), "gloo" or "nccl"
    deepspeed_zero_stages: tuple[int, ...]  # ZeRO stages run beside DDP ([] = none)
    equal_threads_control: bool  # on CPU, also run one rank with the threads each rank gets at the largest size
    run_timeout_s: int  # wall-clock limit of one configuration's process group

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for key in ("world_sizes", "batch_sizes", "deepspeed_zero_stages"):
            d[key] = d[key] if isinstance(d[key], str) else list(d[key])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingSettings":
        d = dict(d)
        for key in ("world_sizes", "batch_sizes", "deepspeed_zero_stages"):
            d[key] = d[key] if isinstance(d[key], str) else tuple(d[key])
        return cls(**d)


FIELDS = [f.name for f in dataclasses.fields(TrainingSettings)]


def _fail(profile: str, message: str):
    raise ConfigError(f"profile {profile!r}: training.{message}")


def _int(profile: str, key: str, value, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        _fail(profile, f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _number(profile: str, key: str, value, minimum: float = 0.0) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < minimum:
        _fail(profile, f"{key} must be a number >= {minimum:g}, got {value!r}")
    return float(value)


def _choice(profile: str, key: str, value, valid) -> None:
    if value not in valid:
        _fail(profile, f"{key} {value!r} is not valid; choose one of: {', '.join(map(str, valid))}")


def _int_list(profile: str, key: str, value, allow_empty: bool = False) -> tuple[int, ...]:
    if not isinstance(value, list) or (not value and not allow_empty):
        _fail(profile, f"{key} must be a {'' if allow_empty else 'non-empty '}list of integers, got {value!r}")
    for v in value:
        _int(profile, f"{key} entry", v)
    return tuple(value)


def unet_channels(arch: str, width: float) -> list[float]:
    return [c * width for c in architectures.get(arch).unet["block_out_channels"]]


def width_problem(arch: str, width: float) -> str | None:
    """Why `width` cannot scale this UNet (channels must stay whole, divisible by the group-norm groups and the
    attention heads), or None when it can."""
    unet = architectures.get(arch).unet
    groups = unet.get("norm_num_groups", 32)
    heads = unet.get("attention_head_dim", 8)
    heads = heads if isinstance(heads, list) else [heads] * len(unet["block_out_channels"])
    for c, h in zip(unet_channels(arch, width), heads):
        if abs(c - round(c)) > 1e-6 or round(c) % groups or round(c) % h:
            return f"{c:g} channels is not a multiple of {groups} norm groups and {h} attention heads"
    return None


def valid_widths(arch: str) -> list[float]:
    """Widths in steps of 0.05 that give a buildable UNet of this architecture."""
    return [w for w in (round(k * 0.05, 2) for k in range(1, 21)) if width_problem(arch, w) is None]


def _check_width(profile: str, arch: str, width: float) -> None:
    valid = f"valid for {arch}: {', '.join(f'{w:g}' for w in valid_widths(arch))}"
    if not 0 < width <= 1:
        _fail(profile, f"unet_width must be in (0, 1], got {width!r}; {valid}")
    problem = width_problem(arch, width)
    if problem:
        _fail(profile, f"unet_width {width!r} does not fit {arch}'s UNet ({problem}); {valid}")


def parse(profile: str, arch: str, raw: dict) -> TrainingSettings:
    """Validate one `training:` mapping for a profile of architecture `arch`."""
    if not raw:
        _fail(profile, f"section is empty; 11_training_scaling needs keys: {', '.join(FIELDS)}")
    unknown = [k for k in raw if k not in FIELDS]
    if unknown:
        _fail(profile, f"unknown key {unknown[0]!r}; valid keys: {', '.join(FIELDS)}")
    missing = [k for k in FIELDS if k not in raw]
    if missing:
        _fail(profile, f"missing keys {', '.join(missing)}")
    width = _number(profile, "unet_width", raw["unet_width"])
    _check_width(profile, arch, width)
    resolution = _int(profile, "resolution", raw["resolution"])
    multiple = 8 * architectures.vae_scale_factor(arch)
    if resolution % multiple:
        _fail(profile, f"resolution {resolution} must be a multiple of {multiple} for arch {arch!r}")
    sizes = raw["world_sizes"]
    world = AUTO if sizes == AUTO else _int_list(profile, "world_sizes", sizes)
    batches = _int_list(profile, "batch_sizes", raw["batch_sizes"])
    samples = _int(profile, "samples", raw["samples"])
    if world != AUTO and samples < max(world) * max(batches):
        _fail(profile, f"samples {samples} is fewer than one step of the largest configuration needs "
                       f"({max(world)} ranks x {max(batches)} per rank); use samples >= {max(world) * max(batches)}")
    _choice(profile, "data", raw["data"], DATA)
    images = raw["images_dir"]
    if images is not None and not Path(str(images)).expanduser().is_dir():
        _fail(profile, f"images_dir {images!r} is not a folder; give a folder of images or null for generated "
                       "test patterns")
    _choice(profile, "autocast", raw["autocast"], AUTOCAST)
    _choice(profile, "backend", raw["backend"], BACKENDS)
    stages = _int_list(profile, "deepspeed_zero_stages", raw["deepspeed_zero_stages"], allow_empty=True)
    for s in stages:
        _choice(profile, "deepspeed_zero_stages entry", s, ZERO_STAGES)
    if not isinstance(raw["equal_threads_control"], bool):
        _fail(profile, f"equal_threads_control must be true or false, got {raw['equal_threads_control']!r}")
    return TrainingSettings(
        unet_width=width, resolution=resolution, world_sizes=world, batch_sizes=batches, samples=samples,
        data=raw["data"], images_dir=images, warmup_steps=_int(profile, "warmup_steps", raw["warmup_steps"]),
        steps=_int(profile, "steps", raw["steps"]),
        learning_rate=_number(profile, "learning_rate", raw["learning_rate"]),
        weight_decay=_number(profile, "weight_decay", raw["weight_decay"]),
        max_grad_norm=_number(profile, "max_grad_norm", raw["max_grad_norm"]), autocast=raw["autocast"],
        backend=raw["backend"], deepspeed_zero_stages=stages, equal_threads_control=raw["equal_threads_control"],
        run_timeout_s=_int(profile, "run_timeout_s", raw["run_timeout_s"]))


def from_profile(profile) -> TrainingSettings:
    return parse(profile.name, profile.arch, profile.training)
